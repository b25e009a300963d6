"""Maps PyMySQL exceptions to tableq's errors. The only place that catches them."""

from __future__ import annotations

import pymysql

from tableq.backends.base import ErrorBoundary, TransientError, UniqueViolation
from tableq.errors import (
    SERVER_ADVICE,
    DatabaseError,
    DatabaseUnavailable,
    SchemaNotMigrated,
    StorageFull,
)

DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205
# InnoDB's answer when a statement that inserts a batch (INSERT ... SELECT) loses the wait
# for the table's AUTO-INC lock to a deadlock or a lock-wait timeout: the same conflict,
# reported as "Failed to read auto-increment value from storage engine".
AUTOINC_LOCK_LOST = 1467
DUPLICATE_ENTRY = 1062
NO_SUCH_TABLE, NO_SUCH_COLUMN = 1146, 1054  # a missing column means an older schema too
# 1053: the server is shutting down; 1927: the connection was killed.
CONNECTION_LOST = {1053, 2003, 2006, 2013, 2055, 1927, 4031}
# The connection was closed under a statement: a server stop, a kill, or the server's
# idle_transaction_timeout, which MariaDB reports no differently (4031 only on some versions).
GONE = {2006, 2013, 4031}
GONE_ADVICE = (f"{SERVER_ADVICE}; inside queue.transaction(), the server also ends this way a "
               "transaction left idle longer than transaction_idle_timeout_s (nothing of it "
               "was committed)")
TABLE_FULL, DISK_FULL = 1114, 1021
PACKET_TOO_LARGE = 1153
ACCESS_DENIED = {1045, 1698}  # wrong user or password; 1698: root allowed via the socket only
DB_ACCESS_DENIED, UNKNOWN_DATABASE = 1044, 1049


def _mapped(exc: pymysql.MySQLError, where: str) -> Exception:
    if isinstance(exc, pymysql.err.InterfaceError):
        # PyMySQL's answer to any use of a connection it closed after losing it.
        return DatabaseUnavailable(where, "the connection was lost")
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    # A deadlock rolls back the whole transaction, a lock-wait timeout only the statement;
    # the backend retries the whole transaction after a rollback in both cases.
    if code in (DEADLOCK, LOCK_WAIT_TIMEOUT, AUTOINC_LOCK_LOST):
        return TransientError(text, where)
    if code == DUPLICATE_ENTRY:
        return UniqueViolation(f"MySQL refused a duplicate at {where}: {text}")
    if code in (NO_SUCH_TABLE, NO_SUCH_COLUMN):
        return SchemaNotMigrated(where)
    if code in ACCESS_DENIED:
        return DatabaseUnavailable(where, text, "check the user and password in the URL, and "
                                   "that this user may connect from this host")
    if code == DB_ACCESS_DENIED:
        return DatabaseUnavailable(where, text, "grant this user access to the database, or "
                                   "name one it may use in the URL")
    if code == UNKNOWN_DATABASE:
        return DatabaseUnavailable(where, text, "create the database (CREATE DATABASE ... "
                                   "CHARACTER SET utf8mb4) or fix its name in the URL")
    if code in (TABLE_FULL, DISK_FULL):
        return StorageFull(where, text)
    if code == PACKET_TOO_LARGE:
        return DatabaseError(
            f"the server at {where} refused a statement larger than its max_allowed_packet; "
            "send smaller batches or raise max_allowed_packet"
        )
    if code in GONE:
        return DatabaseUnavailable(where, text, GONE_ADVICE)
    if code in CONNECTION_LOST or isinstance(exc, pymysql.err.OperationalError) and (
        code is None or code >= 2000
    ):
        return DatabaseUnavailable(where, text)
    return DatabaseError(f"MySQL error {code} at {where}: {text}")


class map_errors(ErrorBoundary, driver_error=pymysql.MySQLError, mapped=_mapped):  # noqa: N801
    """The boundary: PyMySQL's exceptions raised in the with-block become tableq's."""

    __slots__ = ()
