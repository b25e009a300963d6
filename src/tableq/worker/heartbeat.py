"""Keeps leases alive: one thread extends the lease of every message this worker holds
(running or fetched and waiting) a third of a visibility timeout before it would run out,
all the leases due in one tick with one heartbeat_many per visibility timeout. Cadence comes
from the monotonic clock; only the database decides expiry. It also keeps, per message, a
safe estimate of when the lease ends (the send time of the last statement that set it, plus
the visibility timeout), so a handler is never started on a lease that may have run out.

During an outage a failed beat is reported to the worker's Health (logged once per outage,
not per beat) and tried again; the lease stays ours as long as nobody else received the
message, however late the beat, since extending is fenced on the lease token only. When the
database is back, every held lease is extended at once. Uses the Queue API only."""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events
from tableq.worker.health import Health, first_line, retry_delay

MIN_INTERVAL_S = 0.05
# Leases due this soon ride along with the ones due now, so a fetched batch keeps beating
# together instead of drifting into one round trip each.
EARLY_FRACTION = 0.1
HEARTBEAT_BATCH_MAX = 1000


def heartbeat_interval(visibility_timeout_s: float) -> float:
    """Extend three times per lease period, so two missed beats in a row still leave time."""
    return max(MIN_INTERVAL_S, visibility_timeout_s / 3.0)


@dataclass(eq=False, slots=True)
class _Held:
    msg: Message
    visibility_timeout_s: float
    on_lost: Callable[[Message], None] | None
    until: float  # monotonic: the lease surely lasts until then
    lost: bool = False
    # Its ack, nack or release is pending in the completer: if the row is gone, that
    # settlement (whose reply may have been lost) reports the outcome, not a lost lease.
    settling: bool = False
    due_seq: int = -1  # the heap entry that is this message's current schedule


def group_by_timeout(batch: list[_Held]) -> dict[float, list[_Held]]:
    """One heartbeat_many per distinct visibility timeout (the extension it asks for)."""
    groups: dict[float, list[_Held]] = {}
    for held in batch:
        groups.setdefault(held.visibility_timeout_s, []).append(held)
    return groups


class Heartbeater:
    """Tracks held messages by id and extends their leases in batches, each on its own
    cadence."""

    def __init__(self, queue: Queue, health: Health | None = None) -> None:
        self._queue = queue
        self._health = health if health is not None else Health()
        self._failures = 0  # beats failed in a row during an outage
        self._rng = random.Random()
        self._held: dict[int, _Held] = {}
        # (due at, tie-breaker, held): an entry whose _Held was dropped or replaced is stale.
        self._due: list[tuple[float, int, _Held]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tableq-heartbeat", daemon=True)
        self._thread.start()
        self._health.on_recovery(self.beat_all_now)

    def hold(self, msg: Message, visibility_timeout_s: float,
             on_lost: Callable[[Message], None] | None = None,
             since: float | None = None) -> None:
        """Starts beating for msg. `since`: the monotonic time the receive was sent (its
        lease lasts at least visibility_timeout_s from then)."""
        self._hold([msg], visibility_timeout_s, on_lost,
                   time.monotonic() if since is None else since)

    def hold_many(self, msgs: Sequence[Message], visibility_timeout_s: float,
                  since: float) -> None:
        """hold() for a fetched batch, leased by one statement sent at `since`: one lock and
        one wake-up for all of them. (A hold() per message woke this thread a thousand times
        per fetch of a thousand, each wake-up a turn on the GIL taken from the fetch and the
        handlers.)"""
        if msgs:
            self._hold(msgs, visibility_timeout_s, None, since)

    def _hold(self, msgs: Sequence[Message], visibility_timeout_s: float,
              on_lost: Callable[[Message], None] | None, since: float) -> None:
        due_at = since + heartbeat_interval(visibility_timeout_s)
        with self._cond:
            for msg in msgs:
                held = _Held(msg, visibility_timeout_s, on_lost, since + visibility_timeout_s)
                self._held[msg.id] = held
                self._schedule_at(held, due_at)
            self._cond.notify()

    def holding(self, ids: Sequence[int]) -> set[int]:
        """Which of `ids` this process still holds a delivery of (running, waiting or
        settling), whatever its lease: a fetch that returns one of them again means that
        delivery's lease lapsed here."""
        with self._cond:
            held = self._held
            return {i for i in ids if i in held}

    def refresh(self, msg: Message, since: float) -> None:
        """The lease was just set again by a statement sent at `since` (a charge)."""
        with self._cond:
            held = self._held.get(msg.id)
            if held is not None and held.msg.lease == msg.lease:
                held.msg = msg
                held.until = max(held.until, since + held.visibility_timeout_s)

    def settling(self, msg: Message) -> None:
        """msg's settlement was handed to the completer; keep beating until it answers."""
        # No lock: a dict read and a flag that only ever goes from False to True (once per
        # message, on the hot path).
        held = self._held.get(msg.id)
        if held is not None and held.msg.lease == msg.lease:
            held.settling = True

    def lease_left(self, msg: Message) -> float | None:
        """Seconds the lease surely has left, or None if it is not held (or was lost)."""
        with self._cond:
            held = self._held.get(msg.id)
            if held is None or held.lost or held.msg.lease != msg.lease:
                return None
            return held.until - time.monotonic()

    def confirm(self, msg: Message) -> bool:
        """Extends msg's lease now, from the calling thread: True if it is still held, False
        if it was lost. Raises the database's error (e.g. during an outage)."""
        with self._cond:
            held = self._held.get(msg.id)
            if held is None or held.lost or held.msg.lease != msg.lease:
                return False
        sent = time.monotonic()
        kept = self._queue.heartbeat_many([msg], extend=held.visibility_timeout_s)
        self._health.ok()
        with self._cond:
            if kept and self._current(held):
                held.until = sent + held.visibility_timeout_s
                self._schedule(held, heartbeat_interval(held.visibility_timeout_s))
                return True
            if not kept and self._current(held):
                held.lost = True
        if not kept:
            self._report_lost([held], "start")
        return bool(kept)

    def beat_all_now(self) -> None:
        """Extends every held lease at the next tick (the database is back from an outage)."""
        with self._cond:
            for held in self._held.values():
                if not held.lost:
                    self._schedule(held, 0.0)
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
        self._schedule_at(held, time.monotonic() + after_s)

    def _schedule_at(self, held: _Held, due_at: float) -> None:
        # Caller holds self._cond. Rescheduling leaves the old heap entry behind, stale.
        held.due_seq = next(self._seq)
        heapq.heappush(self._due, (due_at, held.due_seq, held))

    def _current(self, held: _Held) -> bool:
        # Caller holds self._cond.
        return self._held.get(held.msg.id) is held and not held.lost

    def _take_due(self) -> list[_Held]:
        """Pops every live entry due now (or within EARLY_FRACTION of its interval)."""
        now = time.monotonic()
        batch: list[_Held] = []
        while self._due:
            due_at, seq, held = self._due[0]
            early_s = EARLY_FRACTION * heartbeat_interval(held.visibility_timeout_s)
            if due_at > now + early_s:
                break
            heapq.heappop(self._due)
            if self._current(held) and seq == held.due_seq:
                held.due_seq = -1  # unscheduled until the beat's answer reschedules it
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
        sent = time.monotonic()
        try:
            kept = self._queue.heartbeat_many([h.msg for h in group],
                                              extend=visibility_timeout_s)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the beats must go on
            # Try again sooner: the leases still have two beats of slack. An outage is logged
            # once by Health (and every lease is beaten when it ends); anything else here.
            # During an outage the beat doubles as a probe (a fenced write on our own rows,
            # so a database that reads but cannot write does not pass), on the outage
            # schedule.
            again = interval / 2
            if self._health.failed(exc, "heartbeat"):
                again = min(again, retry_delay(self._failures, self._rng))
                self._failures += 1
            else:
                events.emit("heartbeat_failed", logging.WARNING, count=len(group),
                            topics=",".join(sorted({h.msg.topic for h in group})),
                            error=first_line(exc))
            with self._cond:
                for held in group:
                    if self._current(held) and held.due_seq < 0:
                        self._schedule(held, again)
            return
        self._failures = 0
        self._health.ok()
        kept_ids = {m.id for m in kept}
        lost: list[_Held] = []
        with self._cond:
            for held in group:
                if not self._current(held):
                    # Settled (and dropped) while the statement ran: its ack or nack already
                    # reports the outcome, and the row being gone is no lost lease.
                    continue
                if held.msg.id in kept_ids:
                    held.until = max(held.until, sent + visibility_timeout_s)
                    if held.due_seq < 0:
                        self._schedule(held, interval)
                else:
                    held.lost = True
                    if not held.settling:
                        lost.append(held)
        self._report_lost(lost, "heartbeat")

    def _report_lost(self, lost: list[_Held], during: str) -> None:
        for held in lost:
            events.emit(events.LEASE_LOST, logging.WARNING, topic=held.msg.topic,
                        id=held.msg.id, attempts=held.msg.attempts, during=during)
            if held.on_lost is not None:
                held.on_lost(held.msg)
