"""tableq: a durable message and job queue in an ordinary SQL table. The public surface only."""

from tableq.codecs import JsonText
from tableq.connect import connect
from tableq.errors import (
    ConfigurationError,
    DatabaseBusy,
    DatabaseError,
    DatabaseTimeout,
    DatabaseUnavailable,
    DuplicateMessage,
    InvalidArgument,
    InvalidName,
    InvalidURL,
    LeaseLost,
    LoadIncomplete,
    MissingDriver,
    NotFound,
    PayloadError,
    PayloadInvalid,
    PayloadTooLarge,
    SchemaNotMigrated,
    StorageFull,
    TableqError,
    UnknownKind,
    UnsupportedDatabase,
)
from tableq.message import DeadLetter, Message, SendResult
from tableq.queue import Queue
from tableq.stats import TopicStats
from tableq.transaction import Transaction
from tableq.worker import App, Backoff

__version__ = "0.1.0"

__all__ = [
    "App",
    "Backoff",
    "ConfigurationError",
    "DatabaseBusy",
    "DatabaseError",
    "DatabaseTimeout",
    "DatabaseUnavailable",
    "DeadLetter",
    "DuplicateMessage",
    "InvalidArgument",
    "InvalidName",
    "InvalidURL",
    "JsonText",
    "LeaseLost",
    "LoadIncomplete",
    "Message",
    "MissingDriver",
    "NotFound",
    "PayloadError",
    "PayloadInvalid",
    "PayloadTooLarge",
    "Queue",
    "SchemaNotMigrated",
    "SendResult",
    "StorageFull",
    "TableqError",
    "TopicStats",
    "Transaction",
    "UnknownKind",
    "UnsupportedDatabase",
    "__version__",
    "connect",
]
