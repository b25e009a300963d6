"""Shared fixtures: `db_url` and `q` are parametrised over SQLite, PostgreSQL and MariaDB/MySQL,
each test in its own fresh database file, schema or database. A server that cannot be reached
skips its tests with one line saying why, and fails the run under CI=true."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

import tableq
import tableq.url

PG_URL = os.environ.get("TABLEQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("TABLEQ_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
BACKENDS = ["sqlite", "postgres", "mysql"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_reachable: dict[str, str | None] = {}


def _probe(dialect: str) -> str | None:
    """None if the server answers, else the reason it does not."""
    if dialect not in _reachable:
        try:
            if dialect == "postgres":
                import psycopg

                psycopg.connect(_conninfo_pg(PG_URL), connect_timeout=3).close()
            elif dialect == "mysql":
                _mysql_admin().close()
            _reachable[dialect] = None
        except Exception as exc:  # any failure to connect is a reason to skip or fail
            _reachable[dialect] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return _reachable[dialect]


def require(dialect: str) -> None:
    reason = _probe(dialect)
    if reason is not None:
        text = f"{dialect} server unreachable ({reason}); set TABLEQ_TEST_{dialect.upper()}_URL"
        if IN_CI:
            pytest.fail(text, pytrace=False)
        pytest.skip(text)


def _conninfo_pg(url: str) -> str:
    return url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://")


def _mysql_admin():  # type: ignore[no-untyped-def]
    import pymysql

    u = tableq.url.parse_url(MYSQL_URL)
    return pymysql.connect(host=u.host, port=u.port or 3306, user=u.user or "root",
                           password=u.password or "", connect_timeout=3, autocommit=True)


def _with_db(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    head = base.rsplit("/", 1)[0]
    return f"{head}/{database}" + (f"?{query}" if query else "")


@pytest.fixture
def fresh_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A URL to an empty place for tableq's tables; `request.param` picks the backend."""
    dialect = getattr(request, "param", "sqlite")
    yield from make_url(dialect, tmp_path)


def make_url(dialect: str, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = "tq_" + uuid.uuid4().hex[:12]
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path}/{name}.db"
        return
    require(dialect)
    if dialect == "postgres":
        import psycopg

        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}schema={name}"
        with psycopg.connect(_conninfo_pg(PG_URL), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        return
    admin = _mysql_admin()
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        yield _with_db(MYSQL_URL, name)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        admin.close()


@pytest.fixture
def pg_url(tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh PostgreSQL schema (skipped without a server, failed under CI=true)."""
    yield from make_url("postgres", tmp_path)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh queue database URL, once per backend."""
    yield from make_url(request.param, tmp_path)


@pytest.fixture
def q(db_url: str) -> Iterator[tableq.Queue]:
    """A migrated Queue on a fresh database, once per backend."""
    queue = tableq.connect(db_url, migrate=True)
    try:
        yield queue
    finally:
        queue.close()

