"""Fetching: takes messages for the lanes from the Queue, as many as each lane wants (free
threads plus its prefetch), and gives back the ones that waited too long for a thread. At
fetch time it charges the attempts of what starts at once (and the lane's charge window),
never a last allowed attempt: that one is charged right before its handler starts (lane.py).
When to fetch is the poller's business (poller.py); no SQL."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence

from tableq.errors import TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events
from tableq.worker.health import Health, first_line
from tableq.worker.lane import FETCH_MAX, Lane
from tableq.worker.settling import Settling, Tracker

# While a lane's fetches come back full, a second thread fetches for it too, so that one
# claim's wait on the database overlaps the other's Python (rows shaped, leases held) and
# the handlers do not run dry while a fetch is in flight. With the lane holding two fetches'
# worth (lane.HOLD_MAX), PostgreSQL c=4 drained 27.9k no-op jobs/s against 22.6k with one
# fetch thread (alternating runs); not on SQLite, whose claims take turns.
AHEAD_POLL_S = 0.002  # how often the fetch-ahead thread looks for room while backlogged
# A full fetch this big means a backlog worth a second thread (slow handlers fetch a few
# messages at a time, and the fetch-ahead thread would only poll beside them).
AHEAD_MIN = 64
AHEAD_ERROR_WAIT_S = 1.0


class Fetcher:
    """Fetches for a worker's lanes. `stop` is the worker's stop request: once set, nothing
    more is fetched. The worker's loop calls fetch_round(); start() adds the fetch-ahead
    thread, close() waits for it to end. A fetch that ends after its lane stopped gives its
    messages back."""

    def __init__(self, queue: Queue, health: Health, settling: Settling,
                 lanes: Sequence[Lane], stop: threading.Event) -> None:
        self._queue, self._health, self._settling = queue, health, settling
        self._tracker = functools.partial(Tracker, queue)  # each fetched message's owner
        self._lanes = lanes
        self._stop = stop
        self._kick = threading.Event()  # a fetch came back full
        self._ahead: threading.Thread | None = None
        self.ahead_fetched = 0  # messages the fetch-ahead thread fetched (tests, debugging)

    def start(self) -> None:
        # Not where claims take turns (SQLite's one writer): a second would only wait.
        if getattr(self._queue, "_claims_run_concurrently", True) and any(
                lane.spec.mode != "at_most_once" for lane in self._lanes):
            self._ahead = threading.Thread(target=self._ahead_loop, name="tableq-fetch-ahead",
                                           daemon=True)
            self._ahead.start()

    def close(self, timeout_s: float) -> None:
        """Waits (up to timeout_s) for the fetch-ahead thread to end; the worker's stop
        request must be set. A fetch still in flight after that is left to end on its own
        (what it leased comes back when the leases run out)."""
        self._kick.set()
        if self._ahead is not None:
            self._ahead.join(timeout_s)

    def fetch_round(self) -> bool:
        """One fetch for every lane that wants messages; True if any message was found."""
        found = False
        for lane in self._lanes:
            # While the database is down, waiting does not make a fetched message stale
            # (restart_clocks starts its clock again once the database is back).
            stale = lane.take_stale(max(0.5, lane.spec.visibility_timeout_s / 2)) \
                if self._health.up else []
            for job in stale:
                self._settling.give_back(job.msg, charged=job.charged)
            if self._health.up or not found:
                if lane.want() > 0 and self.fetch(lane):
                    found = True
        return found

    def drained(self) -> bool:
        """Burst mode's last look: True if no lane finds a message nor has one running."""
        for lane in self._lanes:
            if lane.want() > 0 and self.fetch(lane):
                return False
        return not any(lane.busy() for lane in self._lanes)

    def fetch(self, lane: Lane) -> bool:
        """Fetches what the lane wants into its buffer; True if it got any message."""
        return self._fetch(lane) > 0

    def _fetch(self, lane: Lane) -> int:
        """fetch(): how many messages it got."""
        if self._stop.is_set():
            return 0
        want = lane.reserve(FETCH_MAX)
        if want <= 0:
            return 0
        try:
            got, leased_at = self._claim(lane, want)
        except BaseException:
            lane.unreserve(want)
            raise
        # at_most_once never fetches ahead: its receive deletes, so nothing may wait unstarted.
        lane.backlogged = lane.spec.mode != "at_most_once" and len(got) >= want >= AHEAD_MIN
        if lane.backlogged:
            self._kick.set()
        self._hand(lane, got, leased_at, want)
        return len(got)

    def _claim(self, lane: Lane, want: int) -> tuple[list[tuple[Message, bool]], float]:
        """Leases up to `want` messages for the lane, each with whether its attempt is
        charged; and when the statement that leased them was sent (monotonic)."""
        spec = lane.spec
        if spec.mode == "at_most_once":
            msgs = self._queue.receive(spec.topic, max=want,
                                       visibility_timeout=spec.visibility_timeout_s,
                                       mode="at_most_once", max_attempts=spec.max_attempts)
            self._health.ok()
            return [(m, True) for m in msgs], time.monotonic()
        sent = time.monotonic()
        buried: list[int] = []
        # Charged now: what starts at once and the charge window, never a last allowed
        # attempt (that one is charged right before its handler starts); lane.py.
        got = self._queue._receive_deferred(
            spec.topic, max=want, charge=min(want, lane.start_soon(want)), charge_last=0,
            visibility_timeout=spec.visibility_timeout_s, max_attempts=spec.max_attempts,
            settler=self._tracker, buried=buried)
        self._health.ok()
        if buried:
            # Found spent (their last deliveries ended without an ack: crashes, kills, lost
            # leases) or undecodable, and dead-lettered by the claim itself.
            self._settling.count("dead_lettered", sum(buried))
            events.emit("dead_lettered_at_fetch", logging.ERROR, topic=spec.topic,
                        count=sum(buried), max_attempts=spec.max_attempts,
                        advice="received max_attempts times without an ack, or undecodable: "
                               "see `tableq dead list`; a handler that kills its process "
                               "(memory, os._exit) looks like this")
        heartbeater = self._settling.heartbeater
        if again := heartbeater.holding([m.id for m, _ in got]):
            got = self._give_back_held(lane, got, again)
        heartbeater.hold_many([m for m, _ in got], spec.visibility_timeout_s, since=sent)
        return got, sent

    def _give_back_held(self, lane: Lane, got: list[tuple[Message, bool]],
                        again: set[int]) -> list[tuple[Message, bool]]:
        """A message this worker still runs (or holds) came back in a fetch: its lease lapsed
        here, as the heartbeat did not extend it in time. It is not started twice in this
        process: the new delivery goes back, uncharged, due after one visibility timeout
        (by when the run here has mostly ended; its ack will find the lease lost)."""
        for m, charged in got:
            if m.id in again:
                self._settling.count("redelivered_while_held")
                events.emit("redelivered_while_held", logging.WARNING, topic=m.topic, id=m.id,
                            attempts=m.attempts,
                            advice="its lease lapsed while this worker held it: the heartbeat "
                                   "could not extend it in time (a stalled database "
                                   "connection or an overloaded process?)")
                self._settling.give_back(m, charged=charged,
                                         delay_s=lane.spec.visibility_timeout_s)
        return [(m, charged) for m, charged in got if m.id not in again]

    def _hand(self, lane: Lane, got: list[tuple[Message, bool]], leased_at: float,
              reserved: int) -> None:
        """Buffers what was fetched. If that woke a waiting handler thread, it gets the GIL
        now, before this thread's Python up to its next claim: an idle worker's pickup came
        about 0.2 ms sooner (PostgreSQL, p50 1.41-1.47 -> 1.12-1.34 ms, three alternating
        runs of 200). A lane that stopped meanwhile gets nothing: it goes back."""
        if not got:
            lane.unreserve(reserved)
            return
        woke = lane.put(got, leased_at, reserved)
        if woke is None:
            for m, charged in got:
                self._settling.give_back(m, charged=charged)
        elif woke:
            time.sleep(0)

    # --- the fetch-ahead thread ---------------------------------------------------------------

    def _ahead_loop(self) -> None:
        while not self._stop.is_set():
            lanes = [lane for lane in self._lanes if lane.backlogged]
            if not lanes or not self._health.up:
                self._kick.wait(0.5)
                self._kick.clear()
                continue
            fetched = False
            for lane in lanes:
                try:
                    n = self._fetch(lane)
                    self.ahead_fetched += n
                    fetched = fetched or n > 0
                except Exception as exc:  # noqa: BLE001 - this thread must go on
                    # The worker's own loop meets the same failure and deals with it (an
                    # outage, a schema to migrate): here, stop fetching ahead for now.
                    lane.backlogged = False
                    if isinstance(exc, TableqError) and self._health.failed(exc, "fetch"):
                        continue
                    events.emit("fetch_failed", logging.WARNING, error=first_line(exc))
                    self._stop.wait(AHEAD_ERROR_WAIT_S)
            if not fetched:
                self._stop.wait(AHEAD_POLL_S)  # the handlers free room at their own pace
