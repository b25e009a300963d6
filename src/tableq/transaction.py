"""Exactly-once processing: receive, the caller's own SQL, ack and send on one connection in
one database transaction. A crash or an exception rolls all of it back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from tableq.errors import InvalidArgument
from tableq.message import Message, OnDuplicate, SendResult

if TYPE_CHECKING:
    from tableq.queue import Queue


class Transaction:
    """Made by `with queue.transaction() as tx:`; valid only inside that block."""

    def __init__(self, queue: Queue, connection: Any) -> None:
        self._queue = queue
        self._conn = connection
        self._open = True

    @property
    def connection(self) -> Any:
        """The open DB-API connection of this transaction, for the caller's own statements.
        Do not commit or roll it back yourself: the `with` block does."""
        return self._live("use its connection")

    @property
    def open(self) -> bool:
        """False once the `with` block has ended (committed or rolled back)."""
        return self._open

    def _end(self) -> None:
        self._open = False

    def _live(self, action: str) -> Any:
        """The connection, while the block runs. After it, the connection is back in the
        pool, serving others: a statement on it would join someone else's transaction."""
        if not self._open:
            raise InvalidArgument(
                f"cannot {action}: the transaction's block has ended (committed or rolled "
                "back); send, ack or nack with the Queue itself, or inside a new block")
        return self._conn

    def receive(
        self,
        topic: str,
        *,
        max: int = 1,
        where: Mapping[str, Any] | None = None,
        visibility_timeout: float | timedelta | None = None,
        max_attempts: int | None = None,
        mode: Literal["at_least_once", "at_most_once"] = "at_least_once",
    ) -> list[Message]:
        """Due messages locked by this transaction (others skip them). Their delivery only
        becomes visible if the transaction commits; ack them before it ends. at_most_once
        removes them, if the transaction commits (a rollback leaves them as they were)."""
        spec = self._queue._spec(topic, max, visibility_timeout, where, max_attempts)
        if mode == "at_most_once":
            return self._queue._take(spec, self._live("receive"))
        if mode != "at_least_once":
            raise InvalidArgument(f"a transaction receives at_least_once or at_most_once, not "
                                  f"{mode!r}")
        return self._queue._claim(spec, self._live("receive"), self)

    def ack(self, msg: Message) -> None:
        self._queue.ack(msg, connection=self._live("ack"))

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None) -> None:
        """Queue.nack inside this transaction: the message is released for another delivery
        (after `delay`, keeping `error`) only if the transaction commits."""
        self._queue.nack(msg, delay=delay, error=error, connection=self._live("nack"))

    def heartbeat(self, msg: Message, *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message:
        """Queue.heartbeat inside this transaction (a message received in it holds a lease
        that only this transaction can see until it commits)."""
        return self._queue.heartbeat(msg, extend=extend, progress=progress,
                                     connection=self._live("heartbeat"))

    def dead_letter(self, msg: Message, error: str) -> None:
        self._queue.dead_letter(msg, error, connection=self._live("dead-letter"))

    def send(self, topic: str, payload: Any, *, key: str | None = None,
             kind: str | None = None, headers: Mapping[str, str] | None = None,
             priority: int = 0, delay: float | timedelta | None = None,
             at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        """Queue.send inside this transaction: the message exists only if it commits."""
        return self._queue.send(topic, payload, key=key, kind=kind, headers=headers,
                                priority=priority, delay=delay, at=at,
                                on_duplicate=on_duplicate, connection=self._live("send"))

    def send_many(self, topic: str, items: Iterable[Any], *, kind: str | None = None,
                  headers: Mapping[str, str] | None = None, priority: int = 0,
                  delay: float | timedelta | None = None, at: datetime | None = None,
                  on_duplicate: OnDuplicate = "ignore") -> list[SendResult]:
        """Queue.send_many inside this transaction."""
        return self._queue.send_many(topic, items, kind=kind, headers=headers,
                                     priority=priority, delay=delay, at=at,
                                     on_duplicate=on_duplicate, connection=self._live("send"))
