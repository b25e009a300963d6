"""tableq.connect(): picks the backend for a URL. Drivers are imported here lazily, so a
missing driver is a clear MissingDriver error, not an ImportError at import time."""

from __future__ import annotations

import importlib
import inspect
from datetime import timedelta
from typing import Any

from tableq.backends._keepalive import MAX_S as KEEPALIVE_MAX_S
from tableq.backends._keepalive import MIN_S as KEEPALIVE_MIN_S
from tableq.backends.base import Backend
from tableq.codecs import DEFAULT_MAX_PAYLOAD_BYTES
from tableq.errors import InvalidArgument, MissingDriver
from tableq.queue import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    Queue,
    _positive_int,
    seconds,
)
from tableq.url import DEFAULT_URL, DatabaseURL, parse_url

_DRIVERS = {
    "postgres": ("tableq.backends.postgres", "PostgresBackend", "postgres", "psycopg"),
    "mysql": ("tableq.backends.mysql", "MySQLBackend", "mysql", "pymysql"),
    "sqlite": ("tableq.backends.sqlite", "SQLiteBackend", "", "sqlite3"),
}


def open_backend(url: DatabaseURL, **options: Any) -> Backend:
    module, cls, extra, driver = _DRIVERS[url.dialect]
    try:
        importlib.import_module(driver)
    except ImportError:
        raise MissingDriver(url.dialect, extra, driver) from None
    backend_cls = getattr(importlib.import_module(module), cls)
    known = [name for name, p in inspect.signature(backend_cls).parameters.items()
             if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        shown = ", ".join(name for name in known if name != "test_clock")  # tests only
        raise InvalidArgument(
            f"{', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'}"
            f" of a {url.dialect} queue; its options are: {shown}")
    return backend_cls(url, **_checked(options))  # type: ignore[no-any-return]


POOL_SIZE_MAX = 10_000
# PostgreSQL's idle_in_transaction_session_timeout holds at most 2^31 - 1 milliseconds.
IDLE_TIMEOUT_MAX_S = 2_147_483


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """The backend options that mean the same on every database, checked here once: a value
    no backend would take is an InvalidArgument from connect(), not a driver error (or a
    silently different setting) on first use."""
    out = dict(options)
    if "pool_size" in out:
        out["pool_size"] = _positive_int("pool_size", out["pool_size"], POOL_SIZE_MAX)
    for name in ("connect_timeout_s", "busy_timeout_s"):
        if name in out:
            out[name] = seconds(name, out[name], 0.0)
            if out[name] <= 0:
                raise InvalidArgument(f"{name} must be more than 0 seconds, not {out[name]}")
    if "tcp_keepalive_s" in out:
        alive = out["tcp_keepalive_s"] = seconds("tcp_keepalive_s", out["tcp_keepalive_s"], 0.0)
        if alive and not KEEPALIVE_MIN_S <= alive <= KEEPALIVE_MAX_S:
            raise InvalidArgument(
                f"tcp_keepalive_s must be from {KEEPALIVE_MIN_S} to {KEEPALIVE_MAX_S:,} "
                f"seconds, not {alive:g}; 0 leaves it to the operating system")
    if "transaction_idle_timeout_s" in out:
        idle = out["transaction_idle_timeout_s"] = seconds(
            "transaction_idle_timeout_s", out["transaction_idle_timeout_s"], 0.0)
        if idle > IDLE_TIMEOUT_MAX_S:
            raise InvalidArgument(
                f"transaction_idle_timeout_s must be at most {IDLE_TIMEOUT_MAX_S:,} seconds "
                f"(about 24 days), not {idle:g}; 0 turns the limit off")
    return out


def connect(
    url: str = DEFAULT_URL,
    *,
    migrate: bool = False,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    visibility_timeout: float | timedelta = DEFAULT_VISIBILITY_TIMEOUT_S,
    retention: bool = False,
    strict_kinds: bool = True,
    **backend_options: Any,
) -> Queue:
    """Opens the queue database at `url`: sqlite:///path.db (the default, embedded),
    postgresql://user@host/db (?schema=name, default tableq) or mysql://user@host/db
    (?prefix=name_, default tableq_). `migrate=True` creates or upgrades the tables first.
    `retention=True` keeps acked messages in the done table (for reports and the Spark
    archive pipeline). `strict_kinds=False` lets messages carry kinds this process has not
    registered (they pass unvalidated); by default an unregistered kind is refused. Backend
    options: SQLite `synchronous` ("FULL" default, "NORMAL" or "EXTRA"; or `?synchronous=` in
    the URL, which the command line can pass); PostgreSQL and MySQL
    `pool_size`, `connect_timeout_s` (10; `?connect_timeout=` in the URL wins), and
    `transaction_idle_timeout_s` (300: the server rolls
    back a transaction of the library's, such as a queue.transaction(), left idle that long,
    releasing its locks; 0: no limit; not on MySQL 8), `tcp_keepalive_s` (60: a connection
    to a server that stopped answering, as behind a network cut, is given up after about that
    long, by TCP keepalive probes, so the worker reconnects; a long statement is not cut
    short; 0 leaves it to the operating system); PostgreSQL `vacuum` (True: the queue
    vacuums its message table itself, paced by how many rows it churned, since autovacuum
    comes at most once a minute; False leaves it to autovacuum). A URL parameter the database
    does not take (a misspelled ?schema=, say) is an InvalidURL naming the ones it takes.
    `test_clock=True` is for tests only: the queue's clock stands still in a small test_clock
    table (created by migrate) and moves only by tableq.testing.advance_clock()."""
    queue = Queue(
        open_backend(parse_url(url), **backend_options),
        max_payload_bytes=max_payload_bytes,
        max_attempts=max_attempts,
        visibility_timeout=visibility_timeout,
        retention=retention,
        strict_kinds=strict_kinds,
    )
    if migrate:
        try:
            queue.migrate()
        except BaseException:
            queue.close()
            raise
    return queue
