"""Keeps leases alive: one thread extends the lease of every message this worker holds
(running or fetched and waiting) a third of a visibility timeout before it would run out,
all the leases due in one tick with one heartbeat_many per visibility timeout. Cadence comes
from the monotonic clock; only the database decides expiry. Uses the Queue API only."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tableq.errors import TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events

MIN_INTERVAL_S = 0.05
# Leases due this soon ride along with the ones due now, so a fetched batch keeps beating
# together instead of drifting into one round trip each.
EARLY_FRACTION = 0.1
HEARTBEAT_BATCH_MAX = 1000


def heartbeat_interval(visibility_timeout_s: float) -> float:
    """Extend three times per lease period, so two missed beats in a row still leave time."""
    return max(MIN_INTERVAL_S, visibility_timeout_s / 3.0)


@dataclass(eq=False)
class _Held:
    msg: Message
    visibility_timeout_s: float
    on_lost: Callable[[Message], None] | None
    lost: bool = False


def group_by_timeout(batch: list[_Held]) -> dict[float, list[_Held]]:
    """One heartbeat_many per distinct visibility timeout (the extension it asks for)."""
    groups: dict[float, list[_Held]] = {}
    for held in batch:
        groups.setdefault(held.visibility_timeout_s, []).append(held)
    return groups


class Heartbeater:
    """Tracks held messages by id and extends their leases in batches, each on its own
    cadence."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._held: dict[int, _Held] = {}
        # (due at, tie-breaker, held): an entry whose _Held was dropped or replaced is stale.
        self._due: list[tuple[float, int, _Held]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tableq-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, msg: Message, visibility_timeout_s: float,
             on_lost: Callable[[Message], None] | None = None) -> None:
        with self._cond:
            held = _Held(msg, visibility_timeout_s, on_lost)
            self._held[msg.id] = held
            self._schedule(held, heartbeat_interval(visibility_timeout_s))
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

    def _schedule(self, held: _Held, after_s: float) -> None:
        # Caller holds self._cond.
        heapq.heappush(self._due, (time.monotonic() + after_s, next(self._seq), held))

    def _current(self, held: _Held) -> bool:
        # Caller holds self._cond.
        return self._held.get(held.msg.id) is held and not held.lost

    def _take_due(self) -> list[_Held]:
        """Pops every live entry due now (or within EARLY_FRACTION of its interval)."""
        now = time.monotonic()
        batch: list[_Held] = []
        while self._due:
            due_at, _, held = self._due[0]
            early_s = EARLY_FRACTION * heartbeat_interval(held.visibility_timeout_s)
            if due_at > now + early_s:
                break
            heapq.heappop(self._due)
            if self._current(held):
                batch.append(held)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                batch: list[_Held] = []
                while not self._stopped:
                    batch = self._take_due()
                    if batch:
                        break
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
            for vt_s, group in group_by_timeout(batch).items():
                for start in range(0, len(group), HEARTBEAT_BATCH_MAX):
                    self._beat(vt_s, group[start:start + HEARTBEAT_BATCH_MAX])

    def _beat(self, visibility_timeout_s: float, group: list[_Held]) -> None:
        interval = heartbeat_interval(visibility_timeout_s)
        try:
            kept = self._queue.heartbeat_many([h.msg for h in group],
                                              extend=visibility_timeout_s)
        except TableqError as exc:
            # A transient outage: try again sooner, the leases still have two beats of slack.
            events.emit("heartbeat_failed", logging.WARNING, count=len(group),
                        topics=",".join(sorted({h.msg.topic for h in group})),
                        error=str(exc).splitlines()[0])
            with self._cond:
                for held in group:
                    if self._current(held):
                        self._schedule(held, interval / 2)
            return
        kept_ids = {m.id for m in kept}
        lost: list[_Held] = []
        with self._cond:
            for held in group:
                if not self._current(held):
                    # Settled (and dropped) while the statement ran: its ack or nack already
                    # reports the outcome, and the row being gone is no lost lease.
                    continue
                if held.msg.id in kept_ids:
                    self._schedule(held, interval)
                else:
                    held.lost = True
                    lost.append(held)
        for held in lost:
            events.emit(events.LEASE_LOST, logging.WARNING, topic=held.msg.topic,
                        id=held.msg.id, attempts=held.msg.attempts, during="heartbeat")
            if held.on_lost is not None:
                held.on_lost(held.msg)
