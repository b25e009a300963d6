"""Exactly-once processing: the handler runs inside one database transaction whose commit
carries its own writes and the message's ack together, fenced by the lease. Turns how that
transaction ended into an Outcome; the settling decides what the outcome means. No SQL: the
transaction comes from the Queue."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tableq.errors import LeaseLost
from tableq.message import Message
from tableq.queue import Queue
from tableq.transaction import Transaction
from tableq.worker import events
from tableq.worker.executor import Executor, Outcome, describe
from tableq.worker.health import is_outage


class TrackedTransaction(Transaction):
    """The exactly-once transaction handed to a handler; remembers how it settled each
    message (by id, as the worker's event name)."""

    def __init__(self, queue: Queue, connection: Any,
                 before_settle: Callable[[Message], None],
                 on_retry: Callable[[float | timedelta | None], None] | None = None) -> None:
        super().__init__(queue, connection)
        self.settled: dict[int, str] = {}
        self._before_settle = before_settle
        self._on_retry = on_retry

    def ack(self, msg: Message) -> None:
        # Stop heartbeats first: one issued after this ack locks the row would wait for the
        # commit and then find the row gone, a false "lease lost".
        self._before_settle(msg)
        super().ack(msg)
        self.settled[msg.id] = events.ACKED

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None) -> None:
        self._before_settle(msg)
        super().nack(msg, delay=delay, error=error)
        self.settled[msg.id] = events.RETRIED
        if self._on_retry is not None:
            self._on_retry(delay)

    def heartbeat(self, msg: Message, *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message:
        # The message was leased before this transaction began, so its lease is extended
        # on a connection of its own, as the worker's heartbeats are: through this one the
        # row would stay locked until the commit, and they would wait for it. Not on
        # SQLite, whose one write lock this transaction holds: there only it can write.
        if self._queue._one_writer:
            return super().heartbeat(msg, extend=extend, progress=progress)
        return self._queue.heartbeat(msg, extend=extend, progress=progress)

    def dead_letter(self, msg: Message, error: str) -> None:
        self._before_settle(msg)
        super().dead_letter(msg, error)
        self.settled[msg.id] = events.DEAD_LETTERED


class _Rollback(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def exactly_once_body(queue: Queue, executor: Executor, fn: Callable[[Message], Any],
                      before_settle: Callable[[Message], None],
                      on_retry: Callable[[float | timedelta | None], None] | None = None,
                      ) -> Callable[[Message], Outcome]:
    """What the executor runs for an exactly-once message: fn inside a transaction that also
    acks the message (unless fn settled it itself), returning fn's own outcome, or what the
    transaction's end says (committed, lease lost, outage). `before_settle(msg)` runs before
    the transaction settles a message (it stops the message's heartbeat)."""
    def body(msg: Message) -> Outcome:
        failed: list[Outcome] = []
        try:
            with queue.transaction() as tx:
                ttx = TrackedTransaction(queue, tx.connection, before_settle, on_retry)
                try:
                    inner = executor.run(fn, dataclasses.replace(msg, _transaction=ttx), None)
                    if not inner.ok:
                        failed.append(inner)
                        # Re-raised as it is, so the transaction's end can tell a handler
                        # that failed on its own from one whose connection died under it.
                        raise inner.exc if inner.exc is not None else _Rollback(inner)
                    if msg.id not in ttx.settled:
                        # Fenced by the lease: if it was lost, LeaseLost rolls back the
                        # handler's writes together with this ack.
                        ttx.ack(msg)
                    committed = Outcome("ok", None, inner.duration_s, ttx.settled[msg.id])
                finally:
                    # The handler has returned; a reference to its transaction it kept, or
                    # gave another thread, must not reach the connection once it is back
                    # in the pool.
                    ttx._end()
            return committed
        except _Rollback as rb:
            return rb.outcome
        except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit is its failure
            if failed and exc is failed[0].exc:
                return failed[0]  # the handler's own failure, rolled back
            if isinstance(exc, LeaseLost):
                return Outcome("lease_lost", describe(exc), exc=exc)
            if is_outage(exc):
                # The connection or the database failed: rolled back, or committed with
                # its reply lost. The settling asks the database which.
                return Outcome("outage", describe(exc), exc=exc)
            raise
    return body
