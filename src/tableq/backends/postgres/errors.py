"""Maps psycopg exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pgerr

from tableq.backends.base import TransientError, UniqueViolation
from tableq.errors import (
    DatabaseError,
    DatabaseTimeout,
    DatabaseUnavailable,
    SchemaNotMigrated,
    StorageFull,
)


@contextmanager
def map_errors(where: str) -> Iterator[None]:
    try:
        yield
    except (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable) as exc:
        raise TransientError(str(exc).strip(), where) from exc
    except pgerr.UniqueViolation as exc:
        raise UniqueViolation(
            f"PostgreSQL refused a duplicate at {where}: {str(exc).strip()}") from exc
    # A missing column is an older schema too (a migration after 0001 adds it).
    except (pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.InvalidSchemaName,
            pgerr.UndefinedFunction) as exc:
        raise SchemaNotMigrated(where) from exc
    except (pgerr.DiskFull, pgerr.OutOfMemory) as exc:
        raise StorageFull(where, str(exc).strip()) from exc
    except pgerr.ProgramLimitExceeded as exc:
        raise DatabaseError(
            f"PostgreSQL refused a value at {where}: {str(exc).strip()}; make the payload or "
            "key smaller"
        ) from exc
    except pgerr.QueryCanceled as exc:
        raise DatabaseTimeout(where, str(exc).strip().splitlines()[0],
                              "raise statement_timeout / lock_timeout for this role, or do "
                              "less per call") from exc
    except pgerr.IdleInTransactionSessionTimeout as exc:
        raise DatabaseTimeout(where, "the transaction stayed idle too long",
                              "keep queue.transaction() blocks short, or raise "
                              "transaction_idle_timeout_s in tableq.connect()") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(where, str(exc).strip().splitlines()[0]) from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"PostgreSQL error at {where}: {str(exc).strip()}") from exc
