"""Parses a queue database URL into a frozen DatabaseURL. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from tableq.errors import InvalidURL
from tableq.names import check_identifier

DEFAULT_URL = "sqlite:///tableq.db"
_SCHEMES = {
    "sqlite": "sqlite",
    "sqlite3": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "postgresql+psycopg": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "mysql+pymysql": "mysql",
}


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    dialect: str  # "sqlite" | "postgres" | "mysql"
    raw: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = None
    database: str | None = None  # sqlite: the file path
    params: dict[str, str] = field(default_factory=dict)

    @property
    def redacted(self) -> str:
        """The URL without its password, for messages and logs."""
        if self.password is None:
            return self.raw
        return self.raw.replace(":" + _quoted_password(self.raw) + "@", ":***@", 1)

    @property
    def namespace(self) -> str:
        """Where tableq's tables live: a PostgreSQL schema, or a table-name prefix elsewhere."""
        if self.dialect == "postgres":
            return check_identifier("schema", self.params.get("schema", "tableq"))
        return check_identifier("prefix", self.params.get("prefix", "tableq_"))


def _quoted_password(raw: str) -> str:
    netloc = urlsplit(raw).netloc
    userinfo = netloc.rpartition("@")[0]
    return userinfo.partition(":")[2]


def parse_url(url: str) -> DatabaseURL:
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(str(url), "it has no scheme")
    scheme = url.split("://", 1)[0].lower()
    dialect = _SCHEMES.get(scheme)
    if dialect is None:
        raise InvalidURL(url, f"unknown scheme {scheme!r}")
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if dialect == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them.
        path = unquote(url.split("://", 1)[1].split("?", 1)[0])
        if not path.startswith("/"):
            raise InvalidURL(url, "a SQLite URL needs three slashes: sqlite:///file.db")
        path = path[1:]
        if not path:
            raise InvalidURL(url, "it names no database file")
        if path == ":memory:":
            raise InvalidURL(url, "an in-memory SQLite database is not shared between "
                             "connections; use a file (a temporary one in tests)")
        return DatabaseURL("sqlite", url, database=path, params=params)
    try:
        port = parts.port
    except ValueError:
        raise InvalidURL(url, "the port is not a number") from None
    database = unquote(parts.path.lstrip("/")) or None
    if not database:
        raise InvalidURL(url, "it names no database (add /dbname)")
    result = DatabaseURL(
        dialect,
        url,
        host=parts.hostname or "localhost",
        port=port,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=database,
        params=params,
    )
    _ = result.namespace  # validates ?schema= / ?prefix= now, not at first use
    return result
