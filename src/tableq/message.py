"""Frozen values handed to users: Message, SendResult, DeadLetter. Behaviour that needs the
database is delegated to the Queue that made the value."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tableq.queue import Queue
    from tableq.transaction import Transaction

SendStatus = Literal["sent", "duplicate", "replaced"]


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a send did: `status` is "sent" (new message), "duplicate" (a live message with
    the same key was kept; `id` is that message) or "replaced" (it was overwritten)."""

    id: int
    status: SendStatus
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One received (or peeked) message. `lease` is the fencing token of this delivery: ack,
    nack, heartbeat and dead_letter succeed only while it is still the message's lease."""

    id: int
    topic: str
    key: str | None
    kind: str | None
    payload: Any
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
    _queue: Queue | None = field(default=None, repr=False, compare=False)
    _transaction: Transaction | None = field(default=None, repr=False, compare=False)

    @property
    def lease_expires_at(self) -> datetime | None:
        """When this delivery's lease ends (database time), or None for a peeked message."""
        return self.available_at if self.lease else None

    @property
    def transaction(self) -> Transaction | None:
        """The open exactly-once transaction this message was received in, if any."""
        return self._transaction

    def _owner(self) -> Queue:
        if self._queue is None:
            raise RuntimeError("this Message was built by hand; use the Queue's methods instead")
        return self._queue

    def ack(self) -> None:
        if self._transaction is not None:
            self._transaction.ack(self)
        else:
            self._owner().ack(self)

    def nack(self, delay: float | timedelta | None = None, error: str | None = None) -> None:
        self._owner().nack(self, delay=delay, error=error)

    def heartbeat(self, extend: float | timedelta | None = None, progress: Any = None) -> Message:
        return self._owner().heartbeat(self, extend=extend, progress=progress)

    def dead_letter(self, error: str) -> None:
        self._owner().dead_letter(self, error)

    def forward(self, topic: str, payload: Any, **send_options: Any) -> SendResult:
        """Send the next step and ack this message in one transaction."""
        if self._transaction is not None:
            result = self._transaction.send(topic, payload, **send_options)
            self._transaction.ack(self)
            return result
        return self._owner().forward(self, topic, payload, **send_options)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message in the dead-letter store, with the error that put it there."""

    id: int
    topic: str
    key: str | None
    kind: str | None
    payload: Any
    headers: dict[str, str]
    priority: int
    attempts: int
    created_at: datetime
    first_available_at: datetime
    error: str | None
    dead_at: datetime
