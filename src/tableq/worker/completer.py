"""Acknowledges finished messages in batches: one ack_many for whatever finished while the
previous one ran (group commit), so acks cost one round trip per batch, not per message, and
add no wait when the worker is quiet. A message stays under heartbeat until its ack is
committed; if the process dies first, the message comes back (at-least-once). Queue API
only."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tableq.errors import LeaseLost, TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events

ACK_BATCH_MAX = 500


class Completer:
    def __init__(self, queue: Queue, on_acked: Callable[[Message, float], None],
                 on_lost: Callable[[Message], None]) -> None:
        self._queue = queue
        self._on_acked, self._on_lost = on_acked, on_lost
        self._pending: list[tuple[Message, float]] = []
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="tableq-completer", daemon=True)
        self._thread.start()

    def ack(self, msg: Message, duration_s: float) -> None:
        with self._cond:
            self._pending.append((msg, duration_s))
            self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every ack handed in so far is committed (or failed)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                batch = self._pending[:ACK_BATCH_MAX]
                del self._pending[:ACK_BATCH_MAX]
                self._busy = True
            try:
                self._commit(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _commit(self, batch: list[tuple[Message, float]]) -> None:
        msgs = [m for m, _ in batch]
        lost: set[int] = set()
        try:
            self._queue.ack_many(msgs)
        except LeaseLost as exc:
            # ack_many acked every message still held in one statement, then named all the
            # lost ones: the rest of the batch is acked.
            lost.update(exc.message_ids)
        except TableqError as exc:
            # The backend already retried what was safe to retry. The leases will run out and
            # the messages come back: at-least-once still holds.
            events.emit("ack_failed", logging.ERROR, count=len(msgs),
                        error=str(exc).splitlines()[0])
            for m in msgs:
                self._on_lost(m)
            return
        for m, duration in batch:
            if m.id in lost:
                self._on_lost(m)
                events.emit(events.LEASE_LOST, logging.WARNING, topic=m.topic, id=m.id,
                            attempts=m.attempts, during="ack")
            else:
                self._on_acked(m, duration)
