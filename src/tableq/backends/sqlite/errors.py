"""Maps sqlite3 exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from tableq.backends.base import TransientError
from tableq.errors import DatabaseError, DatabaseUnavailable, SchemaNotMigrated, StorageFull


@contextmanager
def map_errors(where: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
            raise TransientError(text, where) from exc
        if "no such table" in text:
            raise SchemaNotMigrated(where) from exc
        if code == sqlite3.SQLITE_FULL or "disk is full" in text:
            raise StorageFull(where, text) from exc
        if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR):
            raise DatabaseUnavailable(where, text) from exc
        raise DatabaseError(f"SQLite error at {where}: {text}") from exc
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"SQLite error at {where}: {exc}") from exc
