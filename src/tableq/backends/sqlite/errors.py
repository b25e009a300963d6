"""Maps sqlite3 exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from tableq.backends.base import TransientError
from tableq.errors import DatabaseError, DatabaseUnavailable, SchemaNotMigrated, StorageFull

# A file, not a server: the advice names files and permissions, never a server or password.
CANNOT_OPEN = ("check that the file's directory exists and that this user may read and write "
               "the database file and its -wal and -shm files beside it")
READ_ONLY = ("this user may not write the database file or its directory (SQLite writes "
             "-wal and -shm files beside it); fix the permissions or the path")
IO_ERROR = "check the disk and the filesystem holding the database file"


@contextmanager
def map_errors(where: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            code &= 0xFF  # an extended code (SQLITE_IOERR_SHORT_READ...) -> its primary code
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
            raise TransientError(text, where) from exc
        if "no such table" in text or "no such column" in text:  # an older schema
            raise SchemaNotMigrated(where) from exc
        if code == sqlite3.SQLITE_FULL or "disk is full" in text:
            raise StorageFull(where, text) from exc
        if code == sqlite3.SQLITE_CANTOPEN or "unable to open" in text:
            raise DatabaseUnavailable(where, text, CANNOT_OPEN) from exc
        if code == sqlite3.SQLITE_READONLY or "readonly" in text:
            raise DatabaseUnavailable(where, text, READ_ONLY) from exc
        if code == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
            raise DatabaseUnavailable(where, text, IO_ERROR) from exc
        raise DatabaseError(f"SQLite error at {where}: {text}") from exc
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"SQLite error at {where}: {exc}") from exc
