"""The exception tree. Every failure a user can cause has its own class and a message that
says what to do. Imports nothing from tableq."""

from __future__ import annotations


class TableqError(Exception):
    """Base class of every error tableq raises on purpose."""

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling (multiprocessing, concurrent.futures, Spark) would otherwise call the
        # subclass's __init__ with the finished message alone: a TypeError or a message
        # formatted twice. Rebuild from the message and the attributes instead.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[TableqError], args: tuple[object, ...],
             state: dict[str, object]) -> TableqError:
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


# --- configuration -------------------------------------------------------------------------


class ConfigurationError(TableqError, ValueError):
    """tableq was set up wrongly: a bad URL, option or missing driver."""


class InvalidURL(ConfigurationError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(
            f"cannot use database URL {url!r}: {reason}; expected sqlite:///path/to/file.db, "
            "postgresql://user@host:5432/dbname or mysql://user@host:3306/dbname"
        )


class MissingDriver(ConfigurationError):
    def __init__(self, database: str, extra: str, module: str) -> None:
        self.database = database
        super().__init__(
            f"the {database} backend needs the Python package {module!r}, which is not "
            f"installed; run: pip install 'tableq[{extra}]'"
        )


class UnsupportedDatabase(ConfigurationError):
    def __init__(self, database: str, found: str, needed: str) -> None:
        self.database, self.found, self.needed = database, found, needed
        super().__init__(
            f"{database} {found} is too old for tableq, which needs {needed} "
            "(for FOR UPDATE SKIP LOCKED and RETURNING); upgrade the server"
        )


class SchemaNotMigrated(TableqError):
    def __init__(self, where: str, *, no_file: str | None = None) -> None:
        self.where = where
        if no_file is not None:  # SQLite: opening the path would have created an empty file
            super().__init__(
                f"there is no SQLite database at {no_file}; check the path, or create a queue "
                "there with `tableq migrate --url ...` or queue.migrate(). Nothing was created"
            )
            return
        super().__init__(
            f"tableq's tables are missing or out of date in {where}; run `tableq migrate "
            "--url ...` or call queue.migrate() once before using the queue"
        )


# --- bad input -----------------------------------------------------------------------------


class InvalidName(TableqError, ValueError):
    def __init__(self, what: str, value: object, rule: str) -> None:
        self.what, self.value = what, value
        shown = value if not isinstance(value, str) or len(value) <= 60 else value[:57] + "..."
        super().__init__(f"invalid {what} {shown!r}: {rule}")


class InvalidArgument(TableqError, ValueError):
    """An option has a value tableq cannot use (negative delay, unknown mode, ...)."""


class PayloadError(TableqError, ValueError):
    """The payload cannot be stored or read back."""


class PayloadTooLarge(PayloadError):
    def __init__(self, size: int, limit: int,
                 raise_what: str = "max_payload_bytes in tableq.connect()") -> None:
        self.size, self.limit = size, limit
        super().__init__(
            f"payload is {size} bytes, over the limit of {limit} bytes; store large data "
            f"elsewhere and send a reference, or raise {raise_what}"
        )


class PayloadInvalid(PayloadError):
    def __init__(self, reason: str, kind: str | None = None) -> None:
        self.kind, self.reason = kind, reason
        of = f" of kind {kind!r}" if kind else ""
        super().__init__(f"payload{of} is invalid: {reason}")


class UnknownKind(PayloadError):
    def __init__(self, kind: str, known: list[str]) -> None:
        self.kind = kind
        have = ", ".join(repr(k) for k in sorted(known)) or "none"
        super().__init__(
            f"kind {kind!r} is not registered on this queue (registered: {have}); call "
            "queue.register_kind(kind, encode=..., decode=...) first, or send with kind=None"
        )


# --- queue state ---------------------------------------------------------------------------


class DuplicateMessage(TableqError):
    def __init__(self, topic: str, key: str | None, existing_id: int | None = None) -> None:
        self.topic, self.key, self.existing_id = topic, key, existing_id
        held = f" (message {existing_id})" if existing_id is not None else ""
        super().__init__(
            f"a live message with key {key!r} already exists on {topic!r}{held}; use "
            "on_duplicate='ignore' to keep it or on_duplicate='replace' to overwrite it"
        )


class LeaseLost(TableqError):
    """`message_id` is the (first) message whose lease was lost; `message_ids` lists all of
    them when one call settled several messages."""

    def __init__(self, topic: str, message_id: int, action: str = "ack",
                 message_ids: list[int] | None = None) -> None:
        self.topic, self.message_id, self.action = topic, message_id, action
        self.message_ids = message_ids or [message_id]
        more = len(self.message_ids) - 1
        also = f" (and {more} more: {self.message_ids[1:6]})" if more > 0 else ""
        super().__init__(
            f"cannot {action} message {message_id}{also} on {topic!r}: its lease expired and "
            "it was taken by another receiver, acked, or replaced, so nothing was changed; call "
            "heartbeat() during long handlers or raise visibility_timeout"
        )


class NotFound(TableqError, LookupError):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} was not found")


# --- database ------------------------------------------------------------------------------


class DatabaseError(TableqError):
    """The database failed in a way tableq could not hide by retrying."""


SERVER_ADVICE = "check that the server is running and the URL, user and password are right"


class DatabaseUnavailable(DatabaseError):
    def __init__(self, where: str, reason: str, advice: str = SERVER_ADVICE) -> None:
        self.where = where
        super().__init__(f"cannot reach the queue database at {where}: {reason}; {advice}")


class DatabaseBusy(DatabaseError):
    """A deadlock, lock-wait timeout or busy database that tableq could not retry away: inside
    the caller's own transaction (which the database may have rolled back), or after its
    retries ran out."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        super().__init__(
            f"the queue database at {where} reported a conflict ({reason}); nothing was "
            "changed by the failed statement: roll back your transaction if you hold one, "
            "then retry the operation"
        )


class DatabaseTimeout(DatabaseError):
    def __init__(self, where: str, reason: str, advice: str) -> None:
        self.where = where
        super().__init__(f"the queue database at {where} cancelled the work: {reason}; "
                         f"{advice}")


class LoadIncomplete(DatabaseError):
    def __init__(self, job: str, expected: int, found: int) -> None:
        self.job, self.expected, self.found = job, expected, found
        super().__init__(
            f"bulk load {job!r} staged {expected} rows but {found} are still staged (a "
            "database crash or failover empties the staging table); nothing was published: "
            "run the load again"
        )


class ArchiveBusy(TableqError):
    """The Spark archive pipeline runs once at a time per queue database."""

    def __init__(self, topic: str, lease_s: float, *, lost: bool = False) -> None:
        self.topic, self.lease_s, self.lost = topic, lease_s, lost
        what = ("this archive run lost its lock (its lease ran out, as after a long pause)"
                if lost else "another archive run is working on this queue database")
        super().__init__(
            f"{what}: it holds the lease of the message in topic {topic!r}. Let it finish "
            f"and run again; a run whose driver died lets go within {lease_s:g} s, and a "
            "rerun resumes its pending run")


class StorageFull(DatabaseError):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(
            f"the queue database at {where} is out of space ({reason}); nothing was written: "
            "free disk space and retry"
        )


# --- the HTTP server (tableq serve) and its client -------------------------------------------


class AccessError(TableqError):
    """The HTTP server refused the request's credentials or their scope."""


class AuthenticationFailed(AccessError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"not authenticated: {reason}; send `Authorization: Bearer <token>` with a token "
            "from `tableq token create` (never in the URL)")


class PermissionDenied(AccessError):
    def __init__(self, role: str, action: str, topic: str | None = None) -> None:
        self.role, self.action, self.topic = role, action, topic
        on = f" on topic {topic!r}" if topic is not None else ""
        super().__init__(
            f"a {role} token may not {action}{on}; use a token whose role and topic scopes "
            "allow it (`tableq token create --role ... --topics ...`)")


class ServerUnavailable(TableqError):
    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        super().__init__(f"cannot reach the tableq server at {where}: {reason}; check that "
                         "`tableq serve` runs there and the URL is right")


class RemoteError(TableqError):
    """An error the tableq server reported that has no closer class here."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code = status, code
        super().__init__(f"{message} (HTTP {status} {code})")


def public_kind(exc: BaseException) -> str:
    """The name of the tableq exception class a user would catch (not an internal one)."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "tableq.errors" and not cls.__name__.startswith("_"):
            return cls.__name__
    return type(exc).__name__
