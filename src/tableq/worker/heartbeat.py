"""Keeps leases alive: one thread extends the lease of every message this worker holds
(running or fetched and waiting) a third of a visibility timeout before it would run out.
Cadence comes from the monotonic clock; only the database decides expiry. Uses the Queue API
only."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tableq.errors import LeaseLost, TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events

MIN_INTERVAL_S = 0.05


def heartbeat_interval(visibility_timeout_s: float) -> float:
    """Extend three times per lease period, so two missed beats in a row still leave time."""
    return max(MIN_INTERVAL_S, visibility_timeout_s / 3.0)


@dataclass
class _Held:
    msg: Message
    visibility_timeout_s: float
    on_lost: Callable[[Message], None] | None
    lost: bool = False


class Heartbeater:
    """Tracks held messages by id and extends each lease on its own cadence."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._held: dict[int, _Held] = {}
        self._due: list[tuple[float, int]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tableq-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, msg: Message, visibility_timeout_s: float,
             on_lost: Callable[[Message], None] | None = None) -> None:
        with self._cond:
            self._held[msg.id] = _Held(msg, visibility_timeout_s, on_lost)
            heapq.heappush(self._due,
                           (time.monotonic() + heartbeat_interval(visibility_timeout_s), msg.id))
            self._cond.notify()

    def drop(self, msg: Message) -> None:
        with self._cond:
            held = self._held.get(msg.id)
            if held is not None and held.msg.lease == msg.lease:
                del self._held[msg.id]

    def is_lost(self, msg: Message) -> bool:
        with self._cond:
            held = self._held.get(msg.id)
            return held is not None and held.lost

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._due and self._due[0][0] <= time.monotonic():
                        break
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, msg_id = heapq.heappop(self._due)
                held = self._held.get(msg_id)
                if held is None or held.lost:
                    continue
            self._beat(held)

    def _beat(self, held: _Held) -> None:
        interval = heartbeat_interval(held.visibility_timeout_s)
        try:
            self._queue.heartbeat(held.msg, extend=held.visibility_timeout_s)
        except LeaseLost:
            with self._cond:
                held.lost = True
            events.emit(events.LEASE_LOST, logging.WARNING, topic=held.msg.topic,
                        id=held.msg.id, attempts=held.msg.attempts, during="heartbeat")
            if held.on_lost is not None:
                held.on_lost(held.msg)
            return
        except TableqError as exc:
            # A transient outage: try again sooner, the lease still has two beats of slack.
            events.emit("heartbeat_failed", logging.WARNING, topic=held.msg.topic,
                        id=held.msg.id, error=str(exc).splitlines()[0])
            interval = interval / 2
        with self._cond:
            if self._held.get(held.msg.id) is held:
                heapq.heappush(self._due, (time.monotonic() + interval, held.msg.id))
