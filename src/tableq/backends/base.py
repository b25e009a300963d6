"""The Backend seam: what every database backend implements, with the values that cross it.
Internal: it may change freely. Backends receive validated, encoded values and return plain
rows (dicts with Python values and aware UTC datetimes); they never see user objects."""

from __future__ import annotations

import json
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, NamedTuple, TypeVar

from tableq.errors import (
    DatabaseBusy,
    DatabaseError,
    DatabaseUnavailable,
    InvalidArgument,
    SchemaNotMigrated,
    TableqError,
)
from tableq.tokens import IdempotencyRecord, NewToken, TokenRecord

Row = dict[str, Any]
T = TypeVar("T")

# Bounded retries of transient conflicts (deadlock, lock timeout, busy): about 2 s in all.
RETRY_ATTEMPTS = 10
RETRY_BASE_S = 0.005
RETRY_CAP_S = 0.5


class NewMessage(NamedTuple):
    """One message to insert. Exactly one of json_text / data is set. `at` (aware UTC) wins
    over `delay_s`; both are turned into a due time by the database clock. A named tuple:
    as immutable as a frozen dataclass and several times cheaper to build, which bulk loads
    do a million times."""

    topic: str
    key: str | None
    kind: str | None
    json_text: str | None
    data: bytes | None
    headers_json: str | None
    priority: int
    delay_s: float
    at: datetime | None


@dataclass(frozen=True, slots=True)
class PayloadBatch:
    """Messages that differ only in their payload (what bulk loads stage): one validated
    template and the encoded payloads as (json_text, data) pairs, without a NewMessage per
    row. rows() gives the NewMessages for backends that want them."""

    template: NewMessage
    payloads: list[tuple[str | None, bytes | None]]

    def __len__(self) -> int:
        return len(self.payloads)

    def rows(self) -> list[NewMessage]:
        t = self.template
        return [NewMessage(t.topic, t.key, t.kind, text, data, t.headers_json, t.priority,
                           t.delay_s, t.at) for text, data in self.payloads]


def as_rows(rows: Sequence[NewMessage] | PayloadBatch) -> Sequence[NewMessage]:
    return rows.rows() if isinstance(rows, PayloadBatch) else rows


@dataclass(frozen=True, slots=True)
class GroupLease:
    """The messages held under one group lease token. lo..hi, when the holder knows the
    ids it leased, lets the database find them by primary key instead of scanning the topic;
    k of n selects one reader's share (id mod n = k)."""

    topic: str
    lease: str
    lo: int = -(2**63)
    hi: int = 2**63 - 1
    k: int = 0
    n: int = 1

    def params(self) -> dict[str, Any]:
        return {"topic": self.topic, "lease": self.lease, "lo": self.lo, "hi": self.hi,
                "k": self.k, "n": self.n}


@dataclass(frozen=True, slots=True)
class Filter:
    """A compiled-ready receive filter; values are bound, never spliced."""

    kind: str | None
    key: str | None
    fields: tuple[tuple[str, Any], ...]


# message_charge's `started`: called with the charge's result before it commits.
Charged = Callable[[dict[int, tuple[int, datetime]]], None]


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    topic: str
    max: int
    visibility_timeout_s: float
    max_attempts: int
    where: Filter | None = None
    # One lease token for the whole batch (the Spark source leases a micro-batch under one
    # token); None gives every message its own random token.
    lease: str | None = None
    # Rows of only {"id": ...}: for a holder that reads the messages later by their lease.
    ids_only: bool = False
    # How many of the leased messages (the first ones, in delivery order) are charged an
    # attempt now; None charges all. A worker leaves the ones it prefetches uncharged and
    # charges them (charge()) right before their handlers start. Of those first `charge`,
    # a message whose charge would be its last allowed attempt is charged only if it is
    # among the first `charge_last` (None: no such limit). Rows then carry "charged".
    charge: int | None = None
    charge_last: int | None = None

    def charges(self, i: int, attempts: int) -> bool:
        """Whether the i-th leased row (0-based, delivery order), received `attempts` times
        so far, is charged now."""
        if self.charge is None:
            return True
        last = self.charge if self.charge_last is None else self.charge_last
        return i < last or (i < self.charge and attempts + 1 < self.max_attempts)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    rows: list[Row]
    dead_lettered: int  # messages moved to the dead-letter store because they ran out of attempts


class TransientError(DatabaseBusy):
    """A conflict that is safe to retry: the backend retries it for its own short
    transactions; in a caller's transaction, or when retries run out, the caller sees it as
    DatabaseBusy (this class is a DatabaseBusy)."""

    def __init__(self, reason: str, where: str = "the database") -> None:
        super().__init__(where, reason)


class UniqueViolation(DatabaseError):
    """A unique-index conflict. The backend turns the dedup-index ones into
    DuplicateMessage; any other one reaches the caller as this DatabaseError."""


class ErrorBoundary:
    """The shape of every dialect's one error boundary, `with map_errors(where):`: an
    exception of the driver raised in the block leaves it as the tableq error that `mapped`
    gives. A class, not a generator: every statement passes through it. A dialect names its
    driver's base exception and its mapping in the class statement:
    `class map_errors(ErrorBoundary, driver_error=..., mapped=...)`."""

    __slots__ = ("where",)
    driver_error: ClassVar[type[BaseException]]
    mapped: ClassVar[Callable[[Any, str], Exception]]

    def __init_subclass__(cls, *, driver_error: type[BaseException],
                          mapped: Callable[[Any, str], Exception], **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.driver_error, cls.mapped = driver_error, staticmethod(mapped)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None and issubclass(kind, self.driver_error):
            raise type(self).mapped(exc, self.where) from exc


_retries = 0
_retries_lock = threading.Lock()


def transient_retries() -> int:
    """How many times this process retried a transient conflict (deadlock, lock-wait timeout,
    busy database) so far: the evidence that the retry path runs, for tests and metrics."""
    return _retries


def retrying(fn: Callable[[], T], *, attempts: int = RETRY_ATTEMPTS) -> T:
    """Runs fn, retrying TransientError with jittered exponential backoff."""
    global _retries
    for attempt in range(attempts):
        try:
            return fn()
        except TransientError:
            if attempt == attempts - 1:
                raise
            with _retries_lock:
                _retries += 1
            time.sleep(random.uniform(0, min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt)))
    raise AssertionError("unreachable")


class Backend(ABC):
    """One database. `conn` arguments take a connection inside a transaction the caller
    owns (outbox sends, exactly-once transactions); without one the backend runs its own
    short transaction and retries transient conflicts."""

    dialect: str
    where: str  # the redacted URL, for messages
    # Writers take turns (SQLite): a second claim in flight would only wait for the first.
    single_writer: bool = False

    # --- lifecycle
    @abstractmethod
    def migrate(self) -> list[int]: ...
    @abstractmethod
    def schema_version(self) -> int: ...
    @abstractmethod
    def close(self) -> None: ...
    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]: ...
    @abstractmethod
    def check_connection(self, conn: Any) -> None:
        """Raises InvalidArgument unless conn is this driver's connection to this database."""
    @abstractmethod
    def now(self) -> datetime: ...
    def listener(self, topics: Collection[str] | None = None) -> Any:
        """A wake-up listener for these topics (None: all) (wait(timeout_s) -> topics with new
        due messages; pause() while busy), or None when the database cannot notify; workers
        then rely on polling alone."""
        return None

    # --- the test clock (connect(test_clock=True); tests only)
    test_clock: bool = False

    def advance_clock(self, seconds: float) -> None:
        """Moves the test clock forward by `seconds` (exactly: it stands still otherwise)."""
        raise InvalidArgument("advancing the clock needs a queue opened with "
                              "tableq.connect(url, test_clock=True, migrate=True) (tests only)")

    # --- messages
    @abstractmethod
    def message_insert(
        self, rows: Sequence[NewMessage] | PayloadBatch, on_duplicate: str, conn: Any = None
    ) -> list[tuple[int, str]]:
        """(id, status) per row, in order; raises DuplicateMessage for on_duplicate='error'.
        A PayloadBatch (send_many's bare payloads: one template, no key) lets a backend insert
        without a row object per message."""
    @abstractmethod
    def message_claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult: ...
    @abstractmethod
    def message_take(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        """At-most-once: remove up to spec.max due messages and return them (in the caller's
        transaction on `conn`, if given)."""
    @abstractmethod
    def message_ack(self, refs: Sequence[tuple[int, str]], retain: bool,
                    conn: Any = None) -> set[int]:
        """Removes (or archives) messages still held under (id, lease); returns the ids done."""
    @abstractmethod
    def message_release(
        self, msg_id: int, lease: str, delay_s: float, error: str | None, penalty: bool,
        conn: Any = None,
    ) -> bool: ...
    @abstractmethod
    def message_charge(self, charges: Sequence[tuple[int, str, int]], extend_s: float,
                       started: Charged | None = None) -> dict[int, tuple[int, datetime]]:
        """Charges one attempt to each delivery still held under (id, lease, attempts it was
        received with) and extends its lease to extend_s from now; returns {id: (attempts,
        new expiry)} for those. Idempotent: charging the same delivery again (a retry after a
        lost COMMIT reply) leaves its count as the first charge set it. With `started`, the
        charge is one transaction that calls started(result) before its COMMIT: a caller
        that dies before then (a killed worker) has charged nothing."""
    @abstractmethod
    def message_extend(
        self, msg_id: int, lease: str, extend_s: float, progress_json: str | None,
        conn: Any = None,
    ) -> datetime | None: ...
    @abstractmethod
    def message_extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float
                            ) -> dict[int, datetime]:
        """Extends the leases still held under (id, lease); returns {id: new expiry}."""
    @abstractmethod
    def message_dead_letter(self, msg_id: int, lease: str, error: str,
                            conn: Any = None) -> bool: ...
    @abstractmethod
    def message_dead_letter_taken(self, row: Row, error: str, conn: Any = None) -> None:
        """Puts a message already removed from the queue (at-most-once) into the dead-letter
        store, as `row` describes it."""
    @abstractmethod
    def done_match(self, refs: Sequence[tuple[int, str]]) -> set[int]:
        """Ids of (id, lease) pairs found in the archive of acked messages."""
    @abstractmethod
    def message_peek(self, topic: str, limit: int) -> list[Row]: ...
    @abstractmethod
    def message_get(self, msg_id: int) -> Row | None: ...
    @abstractmethod
    def topic_list(self) -> list[str]: ...
    @abstractmethod
    def topic_stats(self, topic: str | None, exact: bool = False) -> list[Row]:
        """Per-topic counts; estimated in a big table unless exact (see tableq.stats)."""
    @abstractmethod
    def topic_purge(self, topic: str) -> int: ...

    # --- dead letters
    @abstractmethod
    def dead_list(self, topic: str, limit: int) -> list[Row]: ...
    @abstractmethod
    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int: ...
    @abstractmethod
    def dead_purge(self, topic: str, ids: Sequence[int] | None) -> int: ...

    # --- leases held by one consumer under one token (the Spark streaming source)
    @abstractmethod
    def lease_rows(self, group: GroupLease) -> list[Row]: ...
    @abstractmethod
    def lease_read(self, group: GroupLease) -> dict[str, list[Any]]:
        """lease_rows column by column (name -> values in row order; {} when none), for a
        reader that ships them on: payload and headers stay JSON text (payload None when
        payload_bytes holds it), times are aware datetimes; no other shaping."""
    @abstractmethod
    def lease_ack(self, group: GroupLease, retain: bool) -> int: ...
    @abstractmethod
    def lease_extend(self, group: GroupLease, extend_s: float,
                     ending_within_s: float | None = None) -> int:
        """Sets the group's leases to end extend_s from now; with ending_within_s, only
        those that would end sooner than that from now. Returns how many it extended."""
    @abstractmethod
    def lease_release(self, group: GroupLease) -> int:
        """Gives the group's messages back unread: due now, no lease, the attempt their
        claim charged refunded. Returns how many."""

    # --- staged bulk loads (the Spark sink): invisible until published, all at once
    @abstractmethod
    def stage_write(self, job: str, part: int,
                    rows: Sequence[NewMessage] | PayloadBatch) -> int: ...
    @abstractmethod
    def stage_publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        """Moves the listed parts' staged rows into the queue in one transaction and marks
        the job committed; returns None if the job was already committed (a no-op). With
        `expected`, raises LoadIncomplete unless exactly that many rows are staged."""
    @abstractmethod
    def stage_discard(self, job: str) -> int: ...
    @abstractmethod
    def stage_cleanup(self, older_than_s: float) -> int: ...
    @abstractmethod
    def stage_job_state(self, job: str) -> str | None: ...

    # --- history (dead letters and retained done messages) for analytics and archiving
    @abstractmethod
    def history_bounds(self, source: str, topic: str | None) -> tuple[int, int] | None: ...
    @abstractmethod
    def history_rows(
        self, source: str, topic: str | None, lo: int, hi: int, before: datetime | None
    ) -> list[Row]: ...
    @abstractmethod
    def history_delete(self, source: str, ids: Sequence[int],
                       before: datetime | None = None) -> int: ...

    # --- migrations as they stand, read without taking the migration lock (readiness)
    @abstractmethod
    def migrations_applied(self) -> set[int]:
        """Versions recorded as applied; SchemaNotMigrated when tableq's tables are missing."""
    @abstractmethod
    def migrations_known(self) -> set[int]:
        """Versions this code ships."""

    # --- access tokens and idempotency records of the HTTP server
    @abstractmethod
    def token_insert(self, token: NewToken) -> None: ...
    @abstractmethod
    def token_find(self, *, secret_sha256: str | None = None,
                   access_key: str | None = None) -> TokenRecord | None: ...
    @abstractmethod
    def token_list(self) -> list[TokenRecord]: ...
    @abstractmethod
    def token_revoke(self, token_id: str) -> bool:
        """True when the token was active and is now revoked."""
    @abstractmethod
    def idempotency_claim(self, token_id: str, key: str, fingerprint: str,
                          conn: Any) -> IdempotencyRecord | None:
        """Inside the caller's transaction: takes the key and returns None, or returns the
        record another request committed under it (waiting for that one's transaction)."""
    @abstractmethod
    def idempotency_finish(self, token_id: str, key: str, status: int, response: str,
                           conn: Any) -> None: ...
    @abstractmethod
    def idempotency_expire(self, older_than_s: float) -> int: ...

    # --- health (tableq doctor): plain facts, judged by tableq.doctor
    @abstractmethod
    def health_facts(self) -> dict[str, Any]:
        """Read-only facts by section: "durability" (the server's or file's settings),
        "transactions" (open ones old enough to hold back cleanup), "cleanup" (dead rows or
        undo history), "schema" (applied migration versions and the latest this package has).
        A section that cannot be read (no privilege, say) is {"error": text}."""


def gather(sections: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Runs each section's reader; one that fails becomes {"error": ...}, so a missing
    privilege hides one fact instead of the whole report. An unreachable database is not a
    fact about one section: that error propagates."""
    out: dict[str, Any] = {}
    for name, read in sections.items():
        try:
            out[name] = read()
        except DatabaseUnavailable:
            raise
        except TableqError as exc:
            out[name] = {"error": str(exc).splitlines()[0]}
    return out


def size_facts(table: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """doctor's size section: the doctor_size row, named by what it measured (the advice
    names it too); {} while the table does not exist."""
    return {"table": table, **row} if row else {}


def applied_versions(read: Callable[[], list[int]]) -> list[int]:
    """The migration versions recorded in the database; none when tableq's tables (or
    schema) do not exist yet."""
    try:
        return sorted(read())
    except SchemaNotMigrated:
        return []


def dead_row_values(row: Row, to_db_time: Callable[[datetime | None], Any]) -> dict[str, Any]:
    """A shaped message row as the parameters of the dead_insert query."""
    data = row["payload"]
    return {
        "id": row["id"], "topic": row["topic"], "key": row.get("key"), "kind": row.get("kind"),
        "payload": None if isinstance(data, bytes) else json.dumps(data),
        "payload_bytes": data if isinstance(data, bytes) else None,
        "headers": json.dumps(row["headers"]) if row.get("headers") else None,
        "priority": row["priority"], "attempts": row["attempts"],
        "created_at": to_db_time(row["created_at"]),
        "first_available_at": to_db_time(row["first_available_at"]),
        "received_at": to_db_time(row.get("received_at")),
    }


def filter_params(where: Filter) -> dict[str, Any]:
    """A receive filter as the three parameters of every dialect's *_where queries: kind and
    key (None: any), and the payload fields as one JSON object that the database compares
    field by field with its own JSON functions. The SQL text is the same for every filter."""
    return {"f_kind": where.kind, "f_key": where.key,
            "f_fields": json.dumps(dict(where.fields), ensure_ascii=False)}


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


ROW_CHARS = 200  # a sent row's columns besides its payload and headers, as JSON text


def row_chars(m: NewMessage) -> int:
    """About how many characters m takes in a batch statement's JSON text (bytes as hex)."""
    return ROW_CHARS + len(m.json_text or "") + 2 * len(m.data or b"") + len(m.headers_json or "")


def spans(sizes: Iterable[int], max_items: int, max_chars: int) -> Iterator[tuple[int, int]]:
    """[start, end) runs of consecutive items, in order, each at most max_items long and
    max_chars in total (an item bigger than that alone): the batch statements a send is cut
    into so that none passes what the server takes in one (MariaDB's max_allowed_packet,
    SQLite's longest string)."""
    start = total = count = 0
    for count, n in enumerate(sizes, 1):
        i = count - 1  # this item's index
        if i > start and (i - start == max_items or total + n > max_chars):
            yield start, i
            start, total = i, 0
        total += n
    if count > start:
        yield start, count


_decode_json = json.JSONDecoder().decode


def load_json_text(value: str | bytes | None) -> Any:
    """A JSON column's text (str, or UTF-8 bytes) as Python; None stays None. json.loads
    without its guess at the bytes' encoding, and the empty object (most messages' headers)
    without the decoder: a claim decodes two per message."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    return {} if text == "{}" else _decode_json(text)


TIME_FIELDS = (
    "created_at", "available_at", "first_available_at", "received_at", "dead_at", "done_at",
)


def shape_row(
    raw: Any, to_time: Callable[[Any], datetime], load_json: Callable[[Any], Any],
    owned: bool = False,
) -> Row:
    """A driver row as a plain dict: times as aware UTC datetimes, JSON decoded, the payload
    in one `payload` field (bytes when stored as bytes). `owned`: raw is a dict no one else
    reads, shaped in place instead of copied."""
    row = raw if owned else dict(raw)
    for name in TIME_FIELDS:
        if row.get(name) is not None:
            row[name] = to_time(row[name])
    data = row.pop("payload_bytes", None)
    row["payload"] = bytes(data) if data is not None else load_json(row.get("payload"))
    row["headers"] = load_json(row.get("headers")) or {}
    if "progress" in row:
        row["progress"] = load_json(row["progress"])
    return row


def merge_stats(live: dict[str, Row], dead: dict[str, int], done: dict[str, int]) -> list[Row]:
    out = []
    for topic in sorted(set(live) | set(dead) | set(done)):
        row = live.get(topic, {})
        out.append({
            "topic": topic,
            "ready": int(row.get("ready") or 0),
            "scheduled": int(row.get("scheduled") or 0),
            "in_flight": int(row.get("in_flight") or 0),
            "dead": int(dead.get(topic, 0)),
            "done": int(done.get(topic, 0)),
            "oldest_ready_age": (
                float(row["oldest_ready_age"]) if row.get("oldest_ready_age") is not None else None
            ),
            "estimated": bool(row.get("estimated")),
        })
    return out


def token_record(raw: Any, to_time: Callable[[Any], datetime],
                 load_json: Callable[[Any], Any]) -> TokenRecord:
    """A driver row of the token table as a TokenRecord."""
    raw = dict(raw)

    def at(value: Any) -> datetime | None:
        return to_time(value) if value is not None else None

    return TokenRecord(
        id=raw["id"], secret_sha256=raw["secret_sha256"], role=raw["role"],
        topics=tuple(load_json(raw["topics"])), name=raw.get("name"),
        access_key=raw.get("access_key"), sqs_secret=raw.get("sqs_secret"),
        created_at=to_time(raw["created_at"]), expires_at=at(raw.get("expires_at")),
        revoked_at=at(raw.get("revoked_at")), checked_at=to_time(raw["db_now"]),
    )


def idempotency_record(raw: Any) -> IdempotencyRecord | None:
    if raw is None:
        return None
    raw = dict(raw)
    return IdempotencyRecord(raw["fingerprint"], int(raw["status"]), raw["response"])
