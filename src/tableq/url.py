"""Parses a queue database URL into a frozen DatabaseURL. Pure: no I/O."""

from __future__ import annotations

import re
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
# scheme://user:PASSWORD@host...: the password runs from the first ':' after the user to the
# last '@' (an unencoded '@', '/' or '?' in a password must not leave part of it shown).
_USERINFO_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@]*):(?P<pw>.*)@",
                                re.DOTALL)
# The query parameters each database's URL takes. Anything else is refused: a misspelled
# ?schema= would otherwise put the tables somewhere else without a word.
LIBPQ_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "target_session_attrs")
URL_PARAMS: dict[str, tuple[str, ...]] = {
    "sqlite": ("prefix", "synchronous"),
    "postgres": ("schema", "application_name", "connect_timeout", *LIBPQ_PARAMS),
    "mysql": ("prefix", "connect_timeout"),
}
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd|pwd)=)[^&#]*", re.IGNORECASE)


def redact(url: object) -> str:
    """`url` as text safe for messages, logs and reprs: any password replaced by ***. Works on
    URLs that do not parse too (it may then hide more than the password, never less)."""
    text = url if isinstance(url, str) else str(url)
    text = _USERINFO_PASSWORD.sub(lambda m: m.group("head") + ":***@", text, count=1)
    return _QUERY_PASSWORD.sub(lambda m: m.group("head") + "***", text)


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    dialect: str  # "sqlite" | "postgres" | "mysql"
    raw: str = field(repr=False)  # holds the password: never shown, see redacted
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str | None = None  # sqlite: the file path
    params: dict[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"DatabaseURL({self.redacted!r})"

    @property
    def redacted(self) -> str:
        """The URL without its password, for messages and logs."""
        return redact(self.raw)

    @property
    def connect_timeout_s(self) -> int | None:
        """?connect_timeout= in seconds (checked by parse_url), or None when not given."""
        value = self.params.get("connect_timeout")
        return None if value is None else int(value)

    def connect_timeout(self, default_s: float) -> int:
        """The driver's connect timeout in whole seconds: the URL's, else `default_s`."""
        return self.connect_timeout_s or max(1, int(default_s))

    @property
    def namespace(self) -> str:
        """Where tableq's tables live: a PostgreSQL schema, or a table-name prefix elsewhere."""
        if self.dialect == "postgres":
            return check_identifier("schema", self.params.get("schema", "tableq"))
        return check_identifier("prefix", self.params.get("prefix", "tableq_"))


def parse_url(url: str) -> DatabaseURL:
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURL(redact(url), "it has no scheme")
    scheme = url.split("://", 1)[0].lower()
    dialect = _SCHEMES.get(scheme)
    if dialect is None:
        raise InvalidURL(redact(url), f"unknown scheme {redact(scheme)!r}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed [IPv6] bracket
        raise InvalidURL(redact(url), str(exc)) from None
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    _check_params(url, dialect, params)
    if dialect == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them.
        path = unquote(url.split("://", 1)[1].split("?", 1)[0])
        if not path.startswith("/"):
            raise InvalidURL(redact(url), "a SQLite URL needs three slashes: sqlite:///file.db")
        path = path[1:]
        if not path:
            raise InvalidURL(redact(url), "it names no database file")
        if path == ":memory:":
            raise InvalidURL(redact(url), "an in-memory SQLite database is not shared between "
                             "connections; use a file (a temporary one in tests)")
        result = DatabaseURL("sqlite", url, database=path, params=params)
        _ = result.namespace  # validates ?prefix= now, not at first use
        return result
    try:
        port = parts.port
    except ValueError:
        raise InvalidURL(redact(url), "the port is not a number (in a user name or "
                         "password, percent-encode '/', '?', '#' and '@', e.g. %2F)") from None
    database = unquote(parts.path.lstrip("/")) or None
    if not database:
        raise InvalidURL(redact(url), "it names no database (add /dbname)")
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


def _check_params(url: str, dialect: str, params: dict[str, str]) -> None:
    known = URL_PARAMS[dialect]
    unknown = sorted(set(params) - set(known))
    if unknown:
        # Names only: a value may be a secret (?password=).
        raise InvalidURL(redact(url), f"unknown parameter{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} (a {dialect} URL takes "
                         f"{', '.join(known)})")
    timeout = params.get("connect_timeout")
    if timeout is not None and not (timeout.isdigit() and int(timeout) > 0):
        raise InvalidURL(redact(url), "connect_timeout must be a whole number of seconds, "
                         "at least 1")
