"""How failures look over HTTP: a JSON body {"error": {"code", "message", ...}} whose code is
the library's error name, and the status for each error class. The one place that decides
both, for the API and (translated) for the SQS endpoint."""

from __future__ import annotations

from typing import Any

from tableq.errors import (
    AuthenticationFailed,
    ConfigurationError,
    DatabaseBusy,
    DatabaseError,
    DatabaseTimeout,
    DatabaseUnavailable,
    DuplicateMessage,
    InvalidArgument,
    InvalidName,
    LeaseLost,
    NotFound,
    PayloadError,
    PayloadTooLarge,
    PermissionDenied,
    SchemaNotMigrated,
    StorageFull,
    TableqError,
    public_kind,
)

# First match wins: subclasses before their bases.
_STATUS: tuple[tuple[type[TableqError], int], ...] = (
    (AuthenticationFailed, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (LeaseLost, 409),
    (DuplicateMessage, 409),
    (PayloadTooLarge, 413),
    (PayloadError, 422),
    (InvalidName, 422),
    (InvalidArgument, 422),
    (ConfigurationError, 422),
    (SchemaNotMigrated, 503),
    (DatabaseUnavailable, 503),
    (DatabaseBusy, 503),
    (DatabaseTimeout, 503),
    (StorageFull, 507),
    (DatabaseError, 500),
)
RETRYABLE = (503,)


class ApiError(Exception):
    """A failure of the HTTP layer itself (bad header, key reuse, body too large, ...)."""

    def __init__(self, status: int, code: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.fields = status, code, message, fields


def status_of(exc: TableqError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def fields_of(exc: TableqError) -> dict[str, Any]:
    """Structured data a client needs to rebuild the error (e.g. which leases were lost)."""
    if isinstance(exc, LeaseLost):
        return {"topic": exc.topic, "message_id": exc.message_id,
                "message_ids": exc.message_ids, "action": exc.action}
    if isinstance(exc, DuplicateMessage):
        return {"topic": exc.topic, "key": exc.key, "existing_id": exc.existing_id}
    return {}


def body(code: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **fields}}


def of_library(exc: TableqError) -> tuple[int, dict[str, Any]]:
    return status_of(exc), body(public_kind(exc), str(exc), **fields_of(exc))
