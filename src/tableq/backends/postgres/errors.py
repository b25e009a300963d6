"""Maps psycopg exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from tableq.backends.base import ErrorBoundary, TransientError, UniqueViolation
from tableq.errors import (
    DatabaseError,
    DatabaseTimeout,
    DatabaseUnavailable,
    SchemaNotMigrated,
    StorageFull,
)


def _mapped(exc: psycopg.Error, where: str) -> Exception:
    text = str(exc).strip()
    first_line = text.splitlines()[0] if text else "the server gave no reason"
    if isinstance(exc, (pgerr.SerializationFailure, pgerr.DeadlockDetected,
                        pgerr.LockNotAvailable)):
        return TransientError(text, where)
    if isinstance(exc, pgerr.UniqueViolation):
        return UniqueViolation(f"PostgreSQL refused a duplicate at {where}: {text}")
    # A missing column is an older schema too (a migration after 0001 adds it).
    if isinstance(exc, (pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.InvalidSchemaName,
                        pgerr.UndefinedFunction)):
        return SchemaNotMigrated(where)
    if isinstance(exc, (pgerr.DiskFull, pgerr.OutOfMemory)):
        return StorageFull(where, text)
    if isinstance(exc, pgerr.ProgramLimitExceeded):
        return DatabaseError(f"PostgreSQL refused a value at {where}: {text}; make the payload "
                             "or key smaller")
    if isinstance(exc, pgerr.QueryCanceled):
        return DatabaseTimeout(where, first_line,
                               "raise statement_timeout / lock_timeout for this role, or do "
                               "less per call")
    if isinstance(exc, pgerr.IdleInTransactionSessionTimeout):
        return DatabaseTimeout(where, "the transaction stayed idle too long",
                               "keep queue.transaction() blocks short, or raise "
                               "transaction_idle_timeout_s in tableq.connect()")
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(where, first_line)
    return DatabaseError(f"PostgreSQL error at {where}: {text}")


class map_errors(ErrorBoundary, driver_error=psycopg.Error, mapped=_mapped):  # noqa: N801
    """The boundary: psycopg's exceptions raised in the with-block become tableq's."""

    __slots__ = ()
