"""Maps sqlite3 exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

import sqlite3
from typing import Any

from tableq.backends.base import ErrorBoundary, TransientError
from tableq.errors import DatabaseError, DatabaseUnavailable, SchemaNotMigrated, StorageFull

# A file, not a server: the advice names files and permissions, never a server or password.
CANNOT_OPEN = ("check that the file's directory exists and that this user may read and write "
               "the database file and its -wal and -shm files beside it")
READ_ONLY = ("this user may not write the database file or its directory (SQLite writes "
             "-wal and -shm files beside it); fix the permissions or the path")
IO_ERROR = "check the disk and the filesystem holding the database file"


def _mapped(exc: Any, where: str) -> Exception:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            code &= 0xFF  # an extended code (SQLITE_IOERR_SHORT_READ...) -> its primary code
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
            return TransientError(text, where)
        if "no such table" in text or "no such column" in text:  # an older schema
            return SchemaNotMigrated(where)
        if code == sqlite3.SQLITE_FULL or "disk is full" in text:
            return StorageFull(where, text)
        if code == sqlite3.SQLITE_CANTOPEN or "unable to open" in text:
            return DatabaseUnavailable(where, text, CANNOT_OPEN)
        if code == sqlite3.SQLITE_READONLY or "readonly" in text:
            return DatabaseUnavailable(where, text, READ_ONLY)
        if code == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
            return DatabaseUnavailable(where, text, IO_ERROR)
        return DatabaseError(f"SQLite error at {where}: {text}")
    return DatabaseError(f"SQLite error at {where}: {exc}")


class map_errors(ErrorBoundary, driver_error=sqlite3.DatabaseError, mapped=_mapped):  # noqa: N801
    """The boundary: sqlite3's exceptions raised in the with-block become tableq's."""

    __slots__ = ()
