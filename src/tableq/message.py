"""Frozen values handed to users: Message, SendResult, DeadLetter, and the literal types of
the public API's choices. Behaviour that needs the database is delegated to the object that
received the message (a Queue, the HTTP client, a worker), through the Settler protocol."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol

from tableq.errors import InvalidArgument

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:  # a TypeVar default (PEP 696): a bare `Message` means Message[Any], also under --strict
    from typing_extensions import TypeVar

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tableq.transaction import Transaction

# A message's priority: the priority column's range (a 32-bit integer on every database).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1

P = TypeVar("P", default=Any)  # the payload type of a Message or DeadLetter
Q = TypeVar("Q")

SendStatus = Literal["sent", "duplicate", "replaced"]
OnDuplicate = Literal["ignore", "replace", "error"]
"""What a send does when a live message has the same key: keep it ("ignore"), overwrite it
("replace") or raise DuplicateMessage ("error")."""
ReceiveMode = Literal["at_least_once", "at_most_once"]
"""Queue.receive's delivery mode; exactly-once processing uses queue.transaction()."""


class Settler(Protocol):
    """What a Message settles itself through: the Queue that received it, the HTTP client,
    or a worker's stand-in that notices the handler settling."""

    def ack(self, msg: Message[Any]) -> None: ...

    def nack(self, msg: Message[Any], *, delay: float | timedelta | None = None,
             error: str | None = None) -> None: ...

    def heartbeat(self, msg: Message[Q], *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message[Q]: ...

    def dead_letter(self, msg: Message[Any], error: str) -> None: ...

    def forward(self, msg: Message[Any], topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None,
                on_duplicate: OnDuplicate = "ignore") -> SendResult: ...


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a send did: `status` is "sent" (new message), "duplicate" (a live message with
    the same key was kept; `id` is that message) or "replaced" (it was overwritten)."""

    id: int
    status: SendStatus
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Message(Generic[P]):
    """One received (or peeked) message. `lease` is the fencing token of this delivery: ack,
    nack, heartbeat and dead_letter succeed only while it is still the message's lease.
    `Message[Email]` types a handler whose topic carries a kind registered with a model:
    `q.register_kind(Email)` makes received payloads Email instances."""

    id: int
    topic: str
    key: str | None
    kind: str | None
    payload: P
    headers: dict[str, str]
    priority: int
    attempts: int
    created_at: datetime
    available_at: datetime
    first_available_at: datetime
    lease: str | None
    last_error: str | None = None
    progress: Any = None
    received_at: datetime | None = None
    _queue: Settler | None = field(default=None, repr=False, compare=False)
    _transaction: Transaction | None = field(default=None, repr=False, compare=False)

    @property
    def lease_expires_at(self) -> datetime | None:
        """When this delivery's lease ends (database time), or None for a peeked message."""
        return self.available_at if self.lease else None

    @property
    def transaction(self) -> Transaction | None:
        """The open exactly-once transaction this message was received in, if any."""
        return self._transaction

    def _owner(self) -> Settler:
        if self._queue is None:
            raise InvalidArgument(
                f"message {self.id} was not received from a Queue (built by hand or unpickled), "
                "so it cannot settle itself; call queue.ack(message) / queue.nack(message) on "
                "the Queue that received it")
        return self._queue

    def _tx(self) -> Transaction | None:
        """The transaction this message settles in: the one it was received in, while its
        block runs. After the block the lease has committed (or rolled back with it), so the
        message settles through its Queue like any other."""
        tx = self._transaction
        return tx if tx is not None and tx.open else None

    def ack(self) -> None:
        if (tx := self._tx()) is not None:
            tx.ack(self)
        else:
            self._owner().ack(self)

    def nack(self, delay: float | timedelta | None = None, error: str | None = None) -> None:
        if (tx := self._tx()) is not None:
            tx.nack(self, delay=delay, error=error)
        else:
            self._owner().nack(self, delay=delay, error=error)

    def heartbeat(self, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message[P]:
        if (tx := self._tx()) is not None:
            return tx.heartbeat(self, extend=extend, progress=progress)
        return self._owner().heartbeat(self, extend=extend, progress=progress)

    def dead_letter(self, error: str) -> None:
        if (tx := self._tx()) is not None:
            tx.dead_letter(self, error)
        else:
            self._owner().dead_letter(self, error)

    def forward(self, topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        """Send the next step and ack this message in one transaction. The options are
        Queue.send's."""
        if (tx := self._tx()) is not None:
            result = tx.send(topic, payload, key=key, kind=kind, headers=headers,
                             priority=priority, delay=delay, at=at, on_duplicate=on_duplicate)
            tx.ack(self)
            return result
        return self._owner().forward(self, topic, payload, key=key, kind=kind, headers=headers,
                                     priority=priority, delay=delay, at=at,
                                     on_duplicate=on_duplicate)


# Message's slots but the owner's, as their member descriptors: read and written directly.
_SLOTS = tuple(Message.__dict__[f.name] for f in fields(Message) if f.name != "_queue")
_OWNER_SLOT = Message.__dict__["_queue"]


def owner_of(msg: Message[Any]) -> Settler | None:
    """What `msg` settles through (None: built by hand)."""
    return msg._queue


def with_owner(msg: Message[P], owner: Settler) -> Message[P]:
    """`msg` settling through `owner` (a worker's per-run tracker): dataclasses.replace
    without its per-field checks or the frozen __setattr__ (3.1 us, against 5.4 us through
    object.__setattr__). A worker's fetches make each message with its tracker already
    (Queue._receive_deferred's settler); this is for the others (at_most_once)."""
    new = object.__new__(type(msg))
    for slot in _SLOTS:
        slot.__set__(new, slot.__get__(msg))
    _OWNER_SLOT.__set__(new, owner)
    return new


@dataclass(frozen=True, slots=True)
class DeadLetter(Generic[P]):
    """A message in the dead-letter store, with the error that put it there."""

    id: int
    topic: str
    key: str | None
    kind: str | None
    payload: P
    headers: dict[str, str]
    priority: int
    attempts: int
    created_at: datetime
    first_available_at: datetime
    error: str | None
    dead_at: datetime
