"""The public sync API: validate and encode what users pass, delegate to a backend, and turn
rows into Messages. No SQL here, and no driver exceptions: backends map those."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar, cast, get_args

from tableq.backends.base import (
    Backend,
    ClaimSpec,
    Filter,
    NewMessage,
    PayloadBatch,
    Row,
)
from tableq.codecs import DEFAULT_MAX_PAYLOAD_BYTES, EncodedJson, JsonText, KindRegistry
from tableq.errors import DuplicateMessage, InvalidArgument, LeaseLost, PayloadInvalid
from tableq.message import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DeadLetter,
    Message,
    OnDuplicate,
    ReceiveMode,
    SendResult,
    SendStatus,
    Settler,
)
from tableq.names import (
    check_headers,
    check_key,
    check_kind,
    check_reason,
    check_topic,
    check_where,
)
from tableq.stats import TopicStats
from tableq.transaction import Transaction

DEFAULT_VISIBILITY_TIMEOUT_S = 30.0
DEFAULT_MAX_ATTEMPTS = 5
RECEIVE_MAX_LIMIT = 10_000
ON_DUPLICATE: tuple[OnDuplicate, ...] = get_args(OnDuplicate)
MODES: tuple[ReceiveMode, ...] = get_args(ReceiveMode)
_ITEM_FIELDS = {"payload", "key", "kind", "headers", "priority", "delay", "at"}
MAX_DURATION_S = 100 * 365 * 86400.0  # delays, leases and schedules beyond a century are typos
ERROR_MAX_CHARS = 16_384  # error texts kept on a message (tracebacks are cut to this)
# Ids and part numbers are 64-bit in every database, attempt counts and reader shares 32-bit.
# Checked here, so a bigger number is an InvalidArgument, not an OverflowError from a driver.
ID_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
PLAIN_TEMPLATES_MAX = 1024  # topics whose no-option send template a Queue keeps
P = TypeVar("P")
M = TypeVar("M", bound=Message)


class Listener(Protocol):
    """A wake-up hint (Queue.listener()): PostgreSQL's LISTEN/NOTIFY names the topics that
    got due messages; SQLite's data_version watch answers ANY_TOPIC ("") for any commit."""

    def wait(self, timeout_s: float) -> list[str]: ...

    def wait_counts(self, timeout_s: float) -> dict[str, int]: ...

    def pause(self) -> None: ...

    def close(self) -> None: ...


def seconds(what: str, value: float | timedelta | None, default: float) -> float:
    """A duration in seconds from a number or a timedelta; refuses negatives, NaN, infinity
    and more than a century (checked before any float conversion, so 10**400 is a clear
    error, not an OverflowError)."""
    if value is None:
        return default
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and math.isnan(value)):
        raise InvalidArgument(f"{what} must be a number of seconds or a timedelta, not "
                              f"{shown(value)}")
    if value < 0 or value == math.inf:
        raise InvalidArgument(f"{what} must be a finite number of seconds >= 0, not "
                              f"{shown(value)}")
    if value > MAX_DURATION_S:
        raise InvalidArgument(f"{what} must be at most 100 years ({MAX_DURATION_S:.0f} s), "
                              f"not {shown(value)}")
    return float(value)


def shown(value: object, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters, for error messages about huge values (repr of
    an int over 4300 digits would itself raise ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_text(error: object) -> str:
    """An error as stored on a message: a string, cut to ERROR_MAX_CHARS. NUL and lone
    surrogates (from bytes decoded with surrogateescape, say) are stored escaped, as \\x00 and
    \\udc80: every database takes the text then, and a nack never fails because of the text of
    the handler's exception."""
    text = error if isinstance(error, str) else repr(error)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > ERROR_MAX_CHARS:
        text = text[: ERROR_MAX_CHARS - 15] + " ...[truncated]"
    return text


_BARE = frozenset({str, JsonText, EncodedJson, bytes, int, float, bool, list, type(None)})


def _is_item(value: object) -> bool:
    """True for a send_many item dict ({"payload": ..., ...}), False for a bare payload."""
    t = type(value)
    if t is dict:
        return "payload" in value  # type: ignore[operator]
    return t not in _BARE and isinstance(value, Mapping) and "payload" in value


def _positive_int(what: str, value: object, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a whole number >= 1, not {shown(value)}")
    if upper is not None and value > upper:
        raise InvalidArgument(f"{what} must be at most {upper}, not {shown(value)}")
    return value


def _flag(what: str, value: object) -> bool:
    """A yes/no option: True or False only (the string "no" is true to bool())."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, not {shown(value)}")
    return value


def is_many(value: object) -> bool:
    """Whether value can be a list of items: iterable, and not a str, bytes or mapping (those
    iterate too, but their characters, bytes or keys would each become an item)."""
    return isinstance(value, Iterable) and not isinstance(
        value, (str, bytes, bytearray, Mapping))


def _message_list(msgs: object, action: str) -> Sequence[Any]:
    """The messages of an *_many call as a sequence, read more than once (a generator would
    be spent by the first pass)."""
    if isinstance(msgs, (list, tuple)):
        return msgs
    if not is_many(msgs):
        raise InvalidArgument(f"{action}_many takes a list of the Messages to {action}, not "
                              f"{shown(msgs)}; for one message use {action}()")
    return list(cast(Iterable[Any], msgs))


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"priority must be a whole number, not {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidArgument(f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}")
    return value


def check_at(value: object) -> datetime | None:
    """A due time (at=, before=): timezone-aware, within a century, returned in UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(
            "at= must be a timezone-aware datetime, e.g. datetime.now(timezone.utc) + "
            "timedelta(minutes=5); a naive datetime is ambiguous"
        )
    if abs((value - datetime.now(UTC)).total_seconds()) > MAX_DURATION_S:
        raise InvalidArgument(f"at= must be within 100 years of now, not {value.isoformat()}")
    # In UTC: PostgreSQL refuses offsets beyond +-15:59 that Python (and RFC 3339) allow.
    return value.astimezone(UTC)


class Queue:
    """A queue database. Thread-safe: share one Queue across threads of a process.

    Open one with `tableq.connect(url)`: the constructor takes a backend, which is internal
    (connect picks and configures it), so it is for tableq's own use."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        visibility_timeout: float | timedelta = DEFAULT_VISIBILITY_TIMEOUT_S,
        retention: bool = False,
        strict_kinds: bool = True,
    ) -> None:
        self._backend = backend
        self.max_payload_bytes = _positive_int("max_payload_bytes", max_payload_bytes)
        self.max_attempts = _positive_int("max_attempts", max_attempts, INT32_MAX)
        self.visibility_timeout_s = seconds("visibility_timeout", visibility_timeout, 30.0)
        self.retention = _flag("retention", retention)
        self._kinds = KindRegistry(strict=_flag("strict_kinds", strict_kinds))
        self._topic_max_attempts: dict[str, int] = {}
        # Per topic, the validated template of a send with no options (the common case).
        self._plain_templates: dict[str, NewMessage] = {}

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def dialect(self) -> str:
        return self._backend.dialect

    @property
    def _one_writer(self) -> bool:
        """Whether one transaction writes at a time (SQLite)."""
        return self._backend.single_writer

    @property
    def _claims_run_concurrently(self) -> bool:
        """Whether two receives can claim at the same time (not on SQLite, whose writers
        take turns): the worker fetches ahead only where they can."""
        return not self._backend.single_writer

    @property
    def where(self) -> str:
        """Where the queue is connected, for people to read: the database URL with its
        password redacted."""
        return self._backend.where

    def migrate(self) -> list[int]:
        """Creates or upgrades tableq's tables; safe to run from several processes at once.
        Returns the migration versions this call applied."""
        return self._backend.migrate()

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tableq.Queue {self.where}>"

    def listener(self, topics: Collection[str] | None = None) -> Listener | None:
        """A wake-up hint for these topics (None: every topic): `.wait(timeout_s)` blocks
        until something may have become due and returns topics (`.wait_counts()` also gives
        how many); `.pause()` while busy; `.close()`. Look for work after making it, and
        again whenever a wait answers `tableq.names.ANY_TOPIC` ("").

        On PostgreSQL it LISTENs for the NOTIFY of sends and names their topics. Sends notify
        only while some listener waits for their topic (a wait registers it, pause() or
        close() ends that), so busy workers cost senders nothing. On SQLite it watches the
        file's commit counter (PRAGMA data_version) and answers ANY_TOPIC. None on
        MySQL/MariaDB. A hint only: keep polling (delayed messages coming due and expired
        leases send nothing)."""
        listener: Listener | None = self._backend.listener(topics)
        return listener

    def now(self) -> datetime:
        """The database clock, which every due time and lease is measured by."""
        return self._backend.now()

    # --- configuration ----------------------------------------------------------------------

    def register_kind(self, kind: str | type[Any],
                      encode: Callable[[Any], Any] | None = None,
                      decode: Callable[[Any], Any] | None = None, *,
                      model: type[Any] | None = None) -> str:
        """Validates payloads of `kind`: `encode` runs on send (return a JSON-able value or
        bytes, or raise), `decode` on receive. `model=` takes a pydantic model class or a
        msgspec Struct class: payloads are validated by it on send and come back as its
        instances. `register_kind(Email)` (the model alone) names the kind after the class,
        "Email". Either way, `send(topic, Email(...))` without kind= sends it as this kind.
        Returns the kind's name."""
        return self._kinds.register(kind, encode, decode, model=model)

    def configure_topic(self, topic: str, *, max_attempts: int | None = None) -> None:
        check_topic(topic)
        if max_attempts is not None:
            self._topic_max_attempts[topic] = _positive_int("max_attempts", max_attempts,
                                                            INT32_MAX)

    def max_attempts_for(self, topic: str, override: int | None = None) -> int:
        """The max_attempts a receive on `topic` uses: the override, else the topic's
        configured value, else the queue's default."""
        return self._max_attempts(check_topic(topic), override)

    def _max_attempts(self, topic: str, override: int | None) -> int:
        if override is not None:
            return _positive_int("max_attempts", override, INT32_MAX)
        return self._topic_max_attempts.get(topic, self.max_attempts)

    # --- sending ------------------------------------------------------------------------------

    def _new(self, topic: str, payload: Any, *, key: Any, kind: Any, headers: Any,
             priority: Any, delay: Any, at: Any) -> NewMessage:
        if kind is None:
            kind = self._kinds.kind_of(payload)  # an instance of a registered model
        return self._with_payload(self._template(topic, key, kind, headers, priority, delay,
                                                 at), payload)

    def _template(self, topic: str, key: Any, kind: Any, headers: Any, priority: Any,
                  delay: Any, at: Any) -> NewMessage:
        """Everything of a message but its payload, validated."""
        kind = check_kind(kind)
        if kind is not None:
            self._kinds.check_known(kind)
        hdrs = check_headers(headers)
        when = check_at(at)
        if when is not None and delay is not None:
            raise InvalidArgument("pass either delay= or at=, not both")
        return NewMessage(
            topic=topic, key=check_key(key), kind=kind, json_text=None, data=None,
            headers_json=json.dumps(hdrs) if hdrs else None, priority=_priority(priority),
            delay_s=seconds("delay", delay, 0.0), at=when,
        )

    def _plain_template(self, topic: str) -> NewMessage:
        """The template of a send with no options, validated once per topic."""
        template = self._plain_templates.get(topic)
        if template is None:
            check_topic(topic)
            template = self._template(topic, None, None, None, 0, None, None)
            if len(self._plain_templates) >= PLAIN_TEMPLATES_MAX:
                self._plain_templates.clear()  # many topics: start over rather than grow
            self._plain_templates[topic] = template
        return template

    def _with_payload(self, t: NewMessage, payload: Any) -> NewMessage:
        text, data = self._kinds.encode(t.kind, payload, self.max_payload_bytes)
        return NewMessage(t.topic, t.key, t.kind, text, data, t.headers_json, t.priority,
                          t.delay_s, t.at)

    def _batch(self, topic: str, items: Iterable[Any], kind: Any, headers: Any,
               priority: Any, delay: Any, at: Any) -> PayloadBatch | list[NewMessage]:
        """Bare payloads only (what bulk loads send) become one PayloadBatch: the defaults
        validated once, the payloads encoded in one loop. Item dicts take _item per item, and
        instances of a registered model (without kind=) the kind of their model."""
        items = list(items)
        if not any(map(_is_item, items)) and (kind is not None or not any(
                map(self._kinds.kind_of, items))):
            t = self._template(topic, None, kind, headers, priority, delay, at)
            return PayloadBatch(t, self._kinds.encode_many(t.kind, items,
                                                          self.max_payload_bytes))
        template: NewMessage | None = None
        out = []
        for item in items:
            if _is_item(item):
                out.append(self._item(topic, item, kind, headers, priority, delay, at))
                continue
            if kind is None and self._kinds.kind_of(item) is not None:
                out.append(self._new(topic, item, key=None, kind=None, headers=headers,
                                     priority=priority, delay=delay, at=at))
                continue
            if template is None:
                template = self._template(topic, None, kind, headers, priority, delay, at)
            out.append(self._with_payload(template, item))
        return out

    def _check_send(self, on_duplicate: OnDuplicate, connection: Any) -> None:
        if on_duplicate not in ON_DUPLICATE:
            raise InvalidArgument(f"on_duplicate must be one of {ON_DUPLICATE}, "
                                  f"not {on_duplicate!r}")
        self._check_connection(connection)

    def _check_connection(self, connection: Any) -> None:
        """A caller's connection= (the outbox, exactly-once acks) must be this database
        driver's, to this queue's database: anything else gets InvalidArgument, not a driver
        error halfway or a message written where this queue never looks."""
        if connection is not None:
            self._backend.check_connection(connection)

    def send(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        kind: str | None = None,
        headers: Mapping[str, str] | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        on_duplicate: OnDuplicate = "ignore",
        connection: Any = None,
    ) -> SendResult:
        """Enqueues one message; durable when this returns, or, with connection=, when the
        caller's transaction on that connection commits (the outbox)."""
        if (key is None and kind is None and headers is None and delay is None and at is None
                and connection is None and type(priority) is int and priority == 0
                and type(topic) is str and on_duplicate in ON_DUPLICATE
                and self._kinds.kind_of(payload) is None):
            row = self._with_payload(self._plain_template(topic), payload)
        else:
            check_topic(topic)
            self._check_send(on_duplicate, connection)
            row = self._new(topic, payload, key=key, kind=kind, headers=headers,
                            priority=priority, delay=delay, at=at)
        ((msg_id, status),) = self._backend.message_insert([row], on_duplicate, connection)
        return SendResult(msg_id, cast(SendStatus, status), row.key)

    def send_many(
        self,
        topic: str,
        items: Iterable[Any],
        *,
        kind: str | None = None,
        headers: Mapping[str, str] | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        on_duplicate: OnDuplicate = "ignore",
        connection: Any = None,
    ) -> list[SendResult]:
        """Enqueues many messages in one transaction and one round trip per batch. Each item
        is a payload, or a dict with "payload" and any of key, kind, headers, priority, delay,
        at (which override the call's defaults). All are validated before anything is sent."""
        check_topic(topic)
        if not is_many(items):
            raise InvalidArgument(f"send_many takes a list (or other iterable) of payloads, "
                                  f"not a {type(items).__name__}; send one message with send()")
        self._check_send(on_duplicate, connection)
        batch = self._batch(topic, items, kind, headers, priority, delay, at)
        if isinstance(batch, PayloadBatch):  # bare payloads have no key: nothing to collapse
            if not len(batch):
                return []
            return [SendResult(msg_id, cast(SendStatus, status), None) for msg_id, status
                    in self._backend.message_insert(batch, on_duplicate, connection)]
        rows = batch
        if not rows:
            return []
        unique, slots = dedupe_batch(rows, on_duplicate)
        done = self._backend.message_insert(unique, on_duplicate, connection)
        out = []
        for row, (slot, repeat) in zip(rows, slots, strict=True):
            msg_id, status = done[slot]
            if repeat:  # as if sent one after the other: the later ones meet the first
                status = "replaced" if on_duplicate == "replace" else "duplicate"
            out.append(SendResult(msg_id, cast(SendStatus, status), row.key))
        return out

    def _item(self, topic: str, item: Any, kind: Any, headers: Any, priority: Any,
              delay: Any, at: Any) -> NewMessage:
        if isinstance(item, Mapping) and "payload" in item:
            extra = set(item) - _ITEM_FIELDS
            if extra:
                raise InvalidArgument(
                    f"unknown field(s) {sorted(extra)} in a send_many item; allowed: "
                    f"{sorted(_ITEM_FIELDS)} (wrap a payload that has a 'payload' field as "
                    "{'payload': {...}})"
                )
            return self._new(
                topic, item["payload"], key=item.get("key"), kind=item.get("kind", kind),
                headers=item.get("headers", headers), priority=item.get("priority", priority),
                delay=item.get("delay", delay if "at" not in item else None),
                at=item.get("at", at if "delay" not in item else None),
            )
        return self._new(topic, item, key=None, kind=kind, headers=headers, priority=priority,
                         delay=delay, at=at)

    # --- receiving ----------------------------------------------------------------------------

    def _spec(self, topic: str, max: int, visibility_timeout: Any, where: Any,
              max_attempts: int | None, lease: str | None = None) -> ClaimSpec:
        check_topic(topic)
        w = check_where(where)
        return ClaimSpec(
            topic=topic,
            max=_positive_int("max", max, RECEIVE_MAX_LIMIT),
            visibility_timeout_s=seconds("visibility_timeout", visibility_timeout,
                                         self.visibility_timeout_s),
            max_attempts=self._max_attempts(topic, max_attempts),
            where=Filter(w["kind"], w["key"], tuple(w["fields"].items())) if w else None,
            lease=lease,
        )

    def receive(
        self,
        topic: str,
        *,
        max: int = 1,
        visibility_timeout: float | timedelta | None = None,
        where: Mapping[str, Any] | None = None,
        mode: ReceiveMode = "at_least_once",
        max_attempts: int | None = None,
    ) -> list[Message]:
        """Up to `max` due messages, highest priority first, then oldest. at_least_once leases
        each one for `visibility_timeout` seconds (ack, nack or heartbeat it before then);
        at_most_once removes them as it returns them."""
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {MODES} (exactly-once processing uses "
                                  f"queue.transaction()), not {mode!r}")
        spec = self._spec(topic, max, visibility_timeout, where, max_attempts)
        if mode == "at_most_once":
            return self._take(spec, None)
        return self._claim(spec, None, None)

    def _take(self, spec: ClaimSpec, conn: Any) -> list[Message]:
        """At most once: removes up to spec.max due messages and returns them (in the caller's
        transaction on `conn`, if given); an undecodable one becomes a dead letter."""
        out = []
        for row in self._backend.message_take(spec, conn).rows:
            try:
                out.append(self._message(
                    {**row, "payload": self._kinds.decode(row.get("kind"), row["payload"])}))
            except PayloadInvalid as exc:  # already removed: keep it as a dead letter
                self._backend.message_dead_letter_taken(row, f"undecodable payload: {exc}",
                                                        conn)
        return out

    def _claim(self, spec: ClaimSpec, conn: Any, tx: Any,
               charged: list[bool] | None = None,
               settler: Callable[[], Settler] | None = None,
               buried: list[int] | None = None) -> list[Message]:
        """Leases up to spec.max decodable messages. `charged`, if given, receives for each
        message returned whether its attempt was charged (see ClaimSpec.charge); `settler`,
        if given, makes each message's owner (else this Queue); `buried`, if given, receives
        how many messages each pass dead-lettered instead (attempts spent, or undecodable)."""
        out: list[Message] = []
        charge, charge_last = spec.charge, spec.charge_last
        for _ in range(10):  # bounded: each pass buries or returns something
            want = spec.max - len(out)
            result = self._backend.message_claim(
                ClaimSpec(spec.topic, want, spec.visibility_timeout_s, spec.max_attempts,
                          spec.where, spec.lease, charge=charge, charge_last=charge_last),
                conn)
            undecodable = 0
            for row in result.rows:
                was_charged = bool(row.pop("charged", True))
                msg = self._decoded_or_none(row, tx, conn=conn, settler=settler)
                if msg is None:
                    undecodable += 1
                    continue
                out.append(msg)
                if charged is not None:
                    charged.append(was_charged)
            if buried is not None and (result.dead_lettered or undecodable):
                buried.append(result.dead_lettered + undecodable)
            if charge is not None:
                charge = max(0, charge - len(result.rows))
            if charge_last is not None:
                charge_last = max(0, charge_last - len(result.rows))
            if len(out) >= spec.max or (result.dead_lettered == 0 and undecodable == 0):
                break
        return out

    def _decoded_or_none(self, row: Row, tx: Any, *, conn: Any = None,
                         settler: Callable[[], Settler] | None = None) -> Message | None:
        try:
            payload = self._kinds.decode(row.get("kind"), row["payload"])
        except PayloadInvalid as exc:
            # A payload its kind rejects is poison: dead-letter it instead of redelivering.
            self._backend.message_dead_letter(row["id"], row["lease"],
                                              f"undecodable payload: {exc}", conn)
            return None
        row["payload"] = payload  # the row is this claim's own: no copy
        return self._message(row, tx, None if settler is None else settler())

    def _message(self, row: Row, tx: Any = None, owner: Settler | None = None) -> Message:
        # Positional, in Message's field order: keywords cost a worker ~2 us per message.
        get = row.get
        return Message(
            row["id"], row["topic"], get("key"), get("kind"), row["payload"],
            get("headers") or {}, row["priority"], row["attempts"], row["created_at"],
            row["available_at"], row["first_available_at"], get("lease"), get("last_error"),
            get("progress"), get("received_at"), self if owner is None else owner, tx,
        )

    # --- for workers: attempts charged when a handler starts ----------------------------------

    def _receive_deferred(self, topic: str, *, max: int, charge: int,
                          charge_last: int | None = None,
                          visibility_timeout: float | timedelta | None = None,
                          max_attempts: int | None = None,
                          settler: Callable[[], Settler] | None = None,
                          buried: list[int] | None = None,
                          ) -> list[tuple[Message, bool]]:
        """receive() that charges an attempt only to the first `charge` messages (in delivery
        order), and a message's last allowed attempt only among the first `charge_last`; the
        others keep their attempt count until _charge() is called for them, right before
        their handlers start. A worker uses it for messages it prefetches, so a worker killed
        while holding them does not spend their attempts. Returns (message, charged) pairs.
        `settler()` makes each message's owner (the worker's Tracker for its run, so the
        message need not be copied for it). Internal to the worker."""
        spec = self._spec(topic, max, visibility_timeout, None, max_attempts)
        charged: list[bool] = []
        msgs = self._claim(dataclasses.replace(
            spec, charge=_positive_int("charge", charge + 1) - 1,
            charge_last=None if charge_last is None else _positive_int(
                "charge_last", charge_last + 1) - 1), None, None, charged, settler, buried)
        return list(zip(msgs, charged, strict=True))

    def _charge(self, msgs: Sequence[Message[P]], *,
                extend: float | timedelta | None = None,
                started: Callable[[list[Message[P]]], None] | None = None,
                ) -> list[Message[P]]:
        """Charges one attempt to each message still held and extends its lease to `extend`
        seconds from now, in one statement. Returns those messages with their new attempt
        count and lease expiry; the missing ones had lost their lease (nothing changed).
        With `started`, the charge commits only after started(those messages) returned (the
        worker records a last attempt's start there: a worker killed before has charged
        nothing)."""
        charges = [(*self._leased(m, "charge"), m.attempts) for m in msgs]
        if not charges:
            return []

        def charged(done: dict[int, tuple[int, datetime]]) -> list[Message[P]]:
            return [_replace(m, attempts=done[m.id][0], available_at=done[m.id][1])
                    for m in msgs if m.id in done]

        done = self._backend.message_charge(
            charges, seconds("extend", extend, self.visibility_timeout_s),
            None if started is None else lambda done: started(charged(done)))
        return charged(done)

    # --- settling -----------------------------------------------------------------------------

    @staticmethod
    def _leased(msg: Message, action: str) -> tuple[int, str]:
        if not isinstance(msg, Message):
            raise InvalidArgument(f"{action} takes a Message from receive(), not "
                                  f"{type(msg).__name__}")
        if msg.lease is None:
            raise InvalidArgument(
                f"cannot {action} message {shown(msg.id)}: it was peeked or received at most "
                "once, so it holds no lease"
            )
        # A Message made by hand (dataclasses.replace) must not reach a driver with values it
        # cannot bind.
        _positive_int("message id", msg.id, ID_MAX)
        return msg.id, check_token(msg.lease)

    def ack(self, msg: Message, *, connection: Any = None) -> None:
        """Removes the message (keeps it in the done table with retention=True) if this
        delivery still holds its lease; otherwise raises LeaseLost and changes nothing."""
        self.ack_many([msg], connection=connection)

    def ack_many(self, msgs: Sequence[Message], *, connection: Any = None) -> None:
        """Acks many messages in one statement. Those whose lease was lost raise LeaseLost
        (for the first of them) after the others were acked."""
        msgs = _message_list(msgs, "ack")
        refs = [self._leased(m, "ack") for m in msgs]
        if not refs:
            return
        self._check_connection(connection)
        if len(refs) > 1 and len({i for i, _ in refs}) < len(refs):
            msgs, refs = _once_per_delivery(msgs, refs)
            if len({i for i, _ in refs}) < len(refs):
                self._ack_runs(msgs, connection)
                return
        done = self._backend.message_ack(refs, self.retention, connection)
        lost = [m for m in msgs if m.id not in done]
        if lost and self.retention and connection is None:
            # An ack retried after its reply was lost finds its message in the done table under the
            # same lease: that is "already acked", not a lost lease.
            kept = self._backend.done_match([(m.id, m.lease) for m in lost if m.lease])
            lost = [m for m in lost if m.id not in kept]
        if lost:
            raise LeaseLost(lost[0].topic, lost[0].id, "ack", [m.id for m in lost])

    def _ack_runs(self, msgs: Sequence[Message], connection: Any) -> None:
        """ack_many of a list that holds one message twice (say a stale delivery beside the
        live one): a statement matches (id, lease) pairs but reports ids, so each run of
        distinct ids is acked on its own, and only the delivery that held the lease counts."""
        lost: list[Message] = []
        for run in _distinct_runs(msgs):
            try:
                self.ack_many(run, connection=connection)
            except LeaseLost as exc:
                lost.extend(m for m in run if m.id in exc.message_ids)
        if lost:
            raise LeaseLost(lost[0].topic, lost[0].id, "ack", [m.id for m in lost])

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None, connection: Any = None) -> None:
        """Releases the message for another delivery after `delay` seconds, keeping `error`
        as its last error. The attempt still counts towards max_attempts. With
        connection=, it happens only if the caller's transaction on it commits."""
        self._release(msg, delay, error, penalty=True, action="nack", connection=connection)

    def release(self, msg: Message, *, delay: float | timedelta | None = None) -> None:
        """Gives the message back without charging the attempt (for messages fetched but
        never started, as on shutdown), due at once or after `delay` seconds."""
        self._release(msg, delay, None, penalty=False, action="release")

    def _release(self, msg: Message, delay: Any, error: str | None, *, penalty: bool,
                 action: str, connection: Any = None) -> None:
        msg_id, lease = self._leased(msg, action)
        self._check_connection(connection)
        if error is not None:
            error = error_text(error)
        if not self._backend.message_release(msg_id, lease, seconds("delay", delay, 0.0), error,
                                             penalty, connection):
            raise LeaseLost(msg.topic, msg.id, action)

    def heartbeat(self, msg: Message[P], *, extend: float | timedelta | None = None,
                  progress: Any = None, connection: Any = None) -> Message[P]:
        """Extends the lease to `extend` seconds from now (default: the visibility timeout)
        and optionally saves `progress` (JSON) on the row. Returns the message with its new
        lease expiry. With connection=, in the caller's transaction on it."""
        msg_id, lease = self._leased(msg, "heartbeat")
        self._check_connection(connection)
        extend_s = seconds("extend", extend, self.visibility_timeout_s)
        progress_json = None
        if progress is not None:
            progress_json = self._kinds.encode(None, progress, self.max_payload_bytes).json_text
            if progress_json is None:
                raise InvalidArgument("progress must be JSON-serialisable, not bytes")
        until = self._backend.message_extend(msg_id, lease, extend_s, progress_json, connection)
        if until is None:
            raise LeaseLost(msg.topic, msg.id, "heartbeat")
        return _replace(msg, available_at=until,
                        progress=progress if progress is not None else msg.progress)

    def heartbeat_many(self, msgs: Sequence[Message[P]], *,
                       extend: float | timedelta | None = None) -> list[Message[P]]:
        """Extends many leases in one statement. Returns the messages still held, with their
        new lease expiry; the ones missing from the result had lost their lease (nothing was
        changed for them)."""
        msgs = _message_list(msgs, "heartbeat")
        refs = [self._leased(m, "heartbeat") for m in msgs]
        if not refs:
            return []
        if len(refs) > 1 and len({i for i, _ in refs}) < len(refs):  # see _ack_runs
            msgs, refs = _once_per_delivery(msgs, refs)
            if len({i for i, _ in refs}) < len(refs):
                return [m for run in _distinct_runs(msgs)
                        for m in self.heartbeat_many(run, extend=extend)]
        until = self._backend.message_extend_many(refs, seconds("extend", extend,
                                                       self.visibility_timeout_s))
        return [_replace(m, available_at=until[m.id]) for m in msgs if m.id in until]

    def dead_letter(self, msg: Message, error: str, *, connection: Any = None) -> None:
        """Moves the message to the dead-letter store with `error`, if the lease still holds."""
        msg_id, lease = self._leased(msg, "dead-letter")
        self._check_connection(connection)
        check_reason(error)
        if not self._backend.message_dead_letter(msg_id, lease, error_text(error), connection):
            raise LeaseLost(msg.topic, msg.id, "dead-letter")

    def forward(self, msg: Message, topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        """Sends the next step and acks `msg` in one transaction: both happen or neither.
        The options are send()'s."""
        self._leased(msg, "forward")
        with self.transaction() as tx:
            result = tx.send(topic, payload, key=key, kind=kind, headers=headers,
                             priority=priority, delay=delay, at=at, on_duplicate=on_duplicate)
            tx.ack(msg)
        return result

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Exactly-once processing: receive, your own SQL on tx.connection, ack and send all
        commit together, or all roll back when the block raises (or the process dies).
        tx.connection goes back to tableq's pool after the block: session settings you
        change on it are yours to undo (SET LOCAL on PostgreSQL; docs/worker.md)."""
        with self._backend.transaction() as conn:
            tx = Transaction(self, conn)
            try:
                yield tx
            finally:
                tx._end()  # the connection goes back to the pool: nothing more through tx

    # --- looking and housekeeping -------------------------------------------------------------

    def peek(self, topic: str, limit: int = 10) -> list[Message]:
        """Live messages (ready, scheduled and in flight) by priority, then due time, then
        id, without leasing them: the order receives take the due ones in."""
        check_topic(topic)
        rows = self._backend.message_peek(topic, _positive_int("limit", limit, RECEIVE_MAX_LIMIT))
        return [self._message({**r, "lease": None}) for r in rows]

    def get(self, msg_id: int) -> Message | None:
        """A live message by id (without its lease), or None."""
        row = self._backend.message_get(_positive_int("id", msg_id, ID_MAX))
        return self._message({**row, "lease": None}) if row else None

    def topics(self) -> list[str]:
        return self._backend.topic_list()

    def stats(self, topic: str | None = None, *, exact: bool = False) -> list[TopicStats]:
        """Counts per topic (or for one). In a table of more than about 200,000 live
        messages, a topic of more than about 20,000 is estimated from a sample of the table
        (`TopicStats.estimated`, within a few percent) so that stats() stays in tens of
        milliseconds; exact=True counts every row instead, in time that grows with the table."""
        if topic is not None:
            check_topic(topic)
        rows = self._backend.topic_stats(topic, exact)
        if topic is not None and not rows:
            rows = [{"topic": topic, "ready": 0, "scheduled": 0, "in_flight": 0, "dead": 0,
                     "done": 0, "oldest_ready_age": None}]
        return [TopicStats(**r) for r in rows]

    def purge(self, topic: str) -> int:
        """Deletes every live message of the topic (dead letters stay). Returns the count."""
        return self._backend.topic_purge(check_topic(topic))

    def dead_letters(self, topic: str, *, limit: int = 100) -> list[DeadLetter]:
        check_topic(topic)
        rows = self._backend.dead_list(topic, _positive_int("limit", limit, 100_000))
        return [_dead(r) for r in rows]

    def requeue_dead(self, topic: str, ids: Sequence[int] | None = None) -> int:
        """Moves dead letters back to the queue as new messages (attempts reset, same id).
        One whose key is live again stays dead. Returns how many moved."""
        return self._backend.dead_requeue(check_topic(topic), check_ids(ids))

    def purge_dead(self, topic: str, ids: Sequence[int] | None = None) -> int:
        return self._backend.dead_purge(check_topic(topic), check_ids(ids))

    # --- schema -------------------------------------------------------------------------------

    def pending_migrations(self) -> list[int]:
        """Migration versions this code ships that the database has not applied (empty when
        current). A read: takes no migration lock. SchemaNotMigrated when nothing is."""
        return sorted(self._backend.migrations_known() - self._backend.migrations_applied())

def backend_of(queue: Queue) -> Backend:
    """Internal: the backend a Queue delegates to, for tableq's own layers (the bulk plumbing,
    the HTTP server's store, the doctor and the test clock). Not part of the public API."""
    return queue._backend


def dedupe_batch(rows: Sequence[NewMessage], on_duplicate: OnDuplicate
                 ) -> tuple[list[NewMessage], list[tuple[int, bool]]]:
    """Collapses repeated (topic, key) pairs inside one batch, as sequential sends would:
    'ignore' keeps the first, 'replace' the last, 'error' refuses. Returns the unique rows and,
    for each input row, (index into them, whether it repeated an earlier key)."""
    first: dict[tuple[str, str], int] = {}
    unique: list[NewMessage] = []
    slots: list[tuple[int, bool]] = []
    for row in rows:
        if row.key is None:
            slots.append((len(unique), False))
            unique.append(row)
            continue
        ident = (row.topic, row.key)
        if ident not in first:
            first[ident] = len(unique)
            slots.append((len(unique), False))
            unique.append(row)
        elif on_duplicate == "error":
            raise DuplicateMessage(row.topic, row.key)
        else:
            if on_duplicate == "replace":
                unique[first[ident]] = row
            slots.append((first[ident], True))
    return unique, slots


def check_ids(ids: Sequence[int] | None) -> list[int] | None:
    """A list of message ids (None stays None: "all")."""
    if ids is None:
        return None
    if not is_many(ids):
        raise InvalidArgument("ids must be a list of message ids")
    return [_positive_int("id", i, ID_MAX) for i in ids]


def check_token(token: str) -> str:
    """A job or lease token: 1-200 printable characters."""
    if not isinstance(token, str) or not 1 <= len(token) <= 200 or not token.isprintable():
        raise InvalidArgument(f"a job or lease token must be 1-200 printable characters, "
                              f"not {token!r}")
    return token


def _dead(r: Row) -> DeadLetter:
    return DeadLetter(
        id=r["id"], topic=r["topic"], key=r.get("key"), kind=r.get("kind"),
        payload=r["payload"], headers=r.get("headers") or {}, priority=r["priority"],
        attempts=r["attempts"], created_at=r["created_at"],
        first_available_at=r["first_available_at"], error=r.get("error"), dead_at=r["dead_at"],
    )


def _replace(msg: Message[P], **changes: Any) -> Message[P]:
    return dataclasses.replace(msg, **changes)


def _once_per_delivery(msgs: Sequence[M], refs: Sequence[tuple[int, str]]
                       ) -> tuple[list[M], list[tuple[int, str]]]:
    """The same delivery (id and lease) given twice counts once: acked once, not acked and
    then reported lost."""
    first = {ref: i for i, ref in reversed(list(enumerate(refs)))}  # each ref's first index
    keep = sorted(first.values())
    return [msgs[i] for i in keep], [refs[i] for i in keep]


def _distinct_runs(msgs: Sequence[M]) -> list[list[M]]:
    """msgs split into runs in which no message id repeats (the first delivery of each id in
    the first run, a second one in the second, ...)."""
    runs: list[list[M]] = []
    seen: dict[int, int] = {}
    for m in msgs:
        k = seen[m.id] = seen.get(m.id, -1) + 1
        if k == len(runs):
            runs.append([])
        runs[k].append(m)
    return runs
