"""One topic's lane: its buffer of fetched messages, its pool of threads (min..max, growing
with the backlog and shrinking when idle; of those, as many run at once as the handlers' own
waits can use, see active_threads), the gate every message passes before its handler
starts, and the run of the handler itself (the settling then decides what the outcome means).
No SQL: it talks to the Queue.

The gate: no handler starts while the database is unreachable (its ack could not land and its
lease could not be extended); a message fetched ahead is charged its attempt here, which also
renews its lease; and a message whose lease may have run out meanwhile (after an outage) is
started only once a heartbeat has confirmed it is still ours. So a worker killed while holding
prefetched messages spends no attempts on the ones it never started.

Charging ahead, to keep the cost low: a receive charges what free threads start at once and
a window more. The others are charged in groups: by a thread that meets an uncharged message
(for it and the next ones), and by a background charger per lane that charges the next
window once less than a window of charged messages waits, so the threads seldom wait for a
charge (which may take a loaded database several milliseconds). The window is what the lane
starts within CHARGE_AHEAD_S at its pace (the time between starts, or the handlers' own
where that is faster: charge_pace): millisecond jobs pay one round trip per window, not per
message, and slow jobs (further apart than CHARGE_AHEAD_S) are never charged ahead. A worker
killed with charged messages waiting has spent their attempts, but never the last one: a
message's last allowed attempt is charged only right before its own handler starts, in a
transaction that records the start (the `received` event) before it commits, so a worker
killed while that charge is in flight (by another of its handlers) has spent nothing, and no
message is dead-lettered without its processing having begun (W4, F2; "begun": charged, then
the handler called, or first, in exactly-once mode, its transaction opened, which on SQLite
may wait for the write lock), while one that kills its worker whenever it runs is
dead-lettered after exactly max_attempts runs."""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tableq.errors import TableqError
from tableq.message import Message, owner_of, with_owner
from tableq.queue import Queue
from tableq.worker import events
from tableq.worker.exactly_once import exactly_once_body
from tableq.worker.executor import Executor, Outcome, describe
from tableq.worker.health import Health, first_line, retry_delay
from tableq.worker.settling import Settling, Tracker
from tableq.worker.spec import HandlerSpec

# Most messages one receive asks for. With fast handlers the fetch thread is the worker's
# ceiling, and a bigger claim spends less of it per message: 250 -> 1,000 drained 8-15% more
# on PostgreSQL and 16-30% more on MariaDB (no-op jobs, c=1 and 4, alternating runs); 2,000
# added little more. prefetch_target() still bounds what is held to what starts soon.
FETCH_MAX = 1000
# Most messages a lane holds beyond its threads: two fetches' worth, so that one fetch can be
# in flight while the rows of the other are worked through (fetcher.py's fetch-ahead). With
# one fetch's worth the handlers ran dry during every fetch: PostgreSQL c=4 drained 22.6k
# jobs/s with it, 27.9k with two (no-op jobs, alternating runs).
HOLD_MAX = 2 * FETCH_MAX
IDLE_THREAD_EXIT_S = 10.0  # an idle thread above the minimum exits after this long
CHARGE_AHEAD_S = 0.02  # charge the messages the threads will start within this long
START_MARGIN_S = 1.0  # a handler starts only on a lease known to last at least this long
# Threads for handlers that hold the GIL throughout only take turns on it: no-op jobs on
# PostgreSQL drained 22.3k/s at c=1 and 14.9k/s at c=16 with every thread taking work
# (2026-11-27 benchmark run). A lane runs one thread more per this much of a typical handler
# run (plus two): alternating drains of 15,000 on the shared server, c=16, medians of 4:
# no-op handlers 8.6k -> 15.9k jobs/s; handlers that sleep 50 us 7.3k -> 8.4k (50 us per
# thread: 7.3k -> 6.2k); handlers of 200 us or more keep all their threads.
RUN_PER_THREAD_S = 10e-6
# A running handler slower than this (or four times the typical run) no longer counts
# towards active_threads(): a parked thread may start beside it. The parked thread that
# watches for that looks this often while messages wait.
STUCK_MIN_S = 0.02
RUNS_KEPT = 32  # the recent handler runs typical_run() looks at
RUNS_MEASURED = 8  # ... once there are this many


@dataclass(eq=False, slots=True)
class Job:
    msg: Message
    fetched_at: float  # monotonic
    charged: bool  # its attempt is counted in the database
    # Monotonic: when the statement that last set its lease was sent (the receive, or the
    # charge); the lease surely lasts a visibility timeout from then.
    leased_at: float = 0.0
    charging: bool = False  # a charge statement for it is in flight
    lost: bool = False  # its lease was found taken: never start it
    popped: bool = False  # a thread took it from the buffer
    announced: bool = False  # its start was recorded (events.RECEIVED) before its charge committed


def charge_window(start_gap_s: float | None, ahead_s: float = CHARGE_AHEAD_S,
                  limit: int = FETCH_MAX) -> int:
    """How many messages beyond the one starting now to charge in the same statement: what
    the lane starts within ahead_s when its starts come every start_gap_s (0 until measured).
    Pure."""
    if start_gap_s is None or ahead_s <= 0:
        return 0
    return int(min(limit, ahead_s / max(start_gap_s, 1e-6)))


def charge_pace(start_gap_s: float | None, duration_s: float | None,
                threads: int) -> float | None:
    """The time between starts a charge window is sized by: the measured one, or the
    handlers' own (their duration over the threads) where that is shorter. Starts slowed by
    waiting for charges must not shrink the window that would end the wait: sized by the
    measured gap alone, a lane whose charges were slow once (a busy database) kept charging
    one message per start. Pure."""
    if duration_s is None:
        return start_gap_s
    own = duration_s / max(1, threads)
    return own if start_gap_s is None else min(start_gap_s, own)


def active_threads(run_s: float | None, cmax: int, per_thread_s: float = RUN_PER_THREAD_S,
                   ) -> int:
    """How many of a lane's cmax threads should run handlers at once, given a typical
    handler's run (run_s; None until measured): two, and one more per per_thread_s of the
    run, so that handlers that wait (on I/O, a database, a sleep) overlap their waits while
    ones that hold the GIL throughout do not take turns on it. Two until measured: started
    all at once, no-op handlers measured their own waits for the GIL (1-2 ms) and kept every
    thread running. Pure."""
    if run_s is None:
        return min(cmax, 2)
    return max(1, min(cmax, int(run_s / per_thread_s) + 2))


def typical_run(runs: Sequence[float]) -> float | None:
    """The median of a lane's recent handler runs, once there are RUNS_MEASURED of them: a
    run that waited for the GIL now and then must not pass for a slow handler. Pure."""
    if len(runs) < RUNS_MEASURED:
        return None
    ordered = sorted(runs)
    return ordered[len(ordered) // 2]


def counts_as_busy(started: float, now: float, run_s: float | None) -> bool:
    """Whether a handler started at `started` still counts as one of the active threads, or
    is stuck in a run much longer than the typical one, run_s (then another thread may start
    beside it). Pure."""
    return now - started < max(STUCK_MIN_S, 4 * (run_s or 0.0))


class Lane:
    """One topic's handler, run by cmin..cmax threads. `stop` is the worker's stop request;
    `slot_freed` is set each time a handler finishes (the fetch loop waits on it)."""

    def __init__(self, spec: HandlerSpec, cmin: int, cmax: int, prefetch: int,
                 prefetch_wait_s: float, *, queue: Queue, health: Health, settling: Settling,
                 executor: Executor, rng: random.Random, stop: threading.Event,
                 slot_freed: threading.Event) -> None:
        self.spec = spec
        self._queue, self._health, self._settling = queue, health, settling
        self._executor, self._rng = executor, rng
        self._fn_async = inspect.iscoroutinefunction(spec.fn)  # asked once, not per message
        self._worker_stop, self._slot_freed = stop, slot_freed
        self.cmin, self.cmax, self.prefetch = cmin, cmax, prefetch
        self.prefetch_wait_s = prefetch_wait_s
        self.avg_duration_s: float | None = None
        # The lane's pace: a moving average of the time between two handler starts, while
        # busy (a start after an idle spell does not count).
        self.start_gap_s: float | None = None
        self._last_start = 0.0
        self.buffer: collections.deque[Job] = collections.deque()
        self._ready = 0  # buffered jobs already charged (not lost)
        self._charge_wanted = False
        self._charger: threading.Thread | None = None
        self.running = 0
        self.threads = 0
        self.idle = 0
        # When each running thread took its job (by thread id), and whether a parked thread
        # watches for stuck ones (see _may_start).
        self._started: dict[int, float] = {}
        self._watching = False
        self._runs: collections.deque[float] = collections.deque(maxlen=RUNS_KEPT)
        self._recorded = 0
        self._typical: float | None = None  # typical_run() of the recent runs
        self._active = active_threads(None, cmax)  # how many may run: active_threads()
        self.claiming = 0  # room reserved by fetches in flight (reserve / put)
        # A hint for the fetcher: the last fetch got all it asked for, so more is due.
        self.backlogged = False
        # One lock, two conditions: `work` for the threads waiting for a message (put wakes
        # one per message), `cond` for everything else (charges, stop, idleness). With one
        # condition, every job's end woke every idle thread only for it to wait again.
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self.work = threading.Condition(lock)
        self.stopping = False

    # --- sizing -----------------------------------------------------------------------------

    def record(self, duration_s: float) -> None:
        with self.cond:
            prev = self.avg_duration_s
            self.avg_duration_s = duration_s if prev is None else 0.8 * prev + 0.2 * duration_s
            self._runs.append(duration_s)
            self._recorded += 1
            if self._recorded % 4 == 0:  # a sort of 32 every fourth run, not every run
                self._typical = typical_run(self._runs)
                self._active = active_threads(self._typical, self.cmax)

    def prefetch_target(self) -> int:
        """Messages to hold beyond the threads: the explicit minimum, or as many as the
        threads will start within prefetch_wait_s at the measured handler duration. None for
        at_most_once: its receive deletes the row, so a message held here and never started
        (stale, or still waiting at shutdown) would be gone."""
        if self.spec.mode == "at_most_once":
            return 0
        adaptive = 0
        # Short leases shorten the wait too, so most fetched messages start before their
        # first heartbeat (a third of the lease) is due.
        wait_s = min(self.prefetch_wait_s, self.spec.visibility_timeout_s / 4)
        if wait_s > 0 and self.avg_duration_s is not None:
            per_s = self.cmax / max(self.avg_duration_s, 1e-4)
            adaptive = int(min(HOLD_MAX, per_s * wait_s))
        return max(self.prefetch, adaptive)

    def want(self) -> int:
        """How many to fetch now: 0 unless a thread would go idle or half the room is free,
        so fetches come in batches instead of one message per finished job. Room reserved
        by a fetch in flight is not free."""
        with self.cond:
            return self._want()

    def _want(self) -> int:
        capacity = self.cmax + self.prefetch_target()
        taken = self.running + len(self.buffer) + self.claiming
        room = capacity - taken
        if room <= 0:
            return 0
        if self.cmax - taken > 0 or room >= max(1, capacity // 2):
            return room
        return 0

    def reserve(self, limit: int) -> int:
        """What a fetch should ask for now (at most `limit`), reserved for it until its put()
        or unreserve(): two fetches in flight never ask for the same room."""
        with self.cond:
            n = 0 if self.stopping else min(self._want(), limit)
            self.claiming += n
            return n

    def unreserve(self, n: int) -> None:
        """Frees the room of a fetch that failed."""
        with self.cond:
            self.claiming -= n

    def start_soon(self, reserved: int = 0) -> int:
        """Free threads plus the charge window: a fetch charges that many of the messages it
        leases at receive (never a last allowed attempt). `reserved`: the asking fetch's own
        reservation (another fetch in flight takes the threads its room holds)."""
        with self.cond:
            others = self.claiming - reserved
            free = max(0, self.cmax - self.running - len(self.buffer) - others)
            return free + charge_window(self._pace_s())

    def _ahead(self, limit: int) -> list[Job]:
        """Up to `limit` buffered jobs to charge ahead of their start: uncharged, not being
        charged, not lost, and not at their last allowed attempt (that one is charged only
        when its own handler starts). Caller holds self.cond."""
        last = self._last_attempt()
        return list(itertools.islice(
            (j for j in self.buffer if not j.charged and not j.charging and not j.lost
             and j.msg.attempts < last), limit))

    def _last_attempt(self) -> int:
        """The attempt count a message has before its last allowed attempt is charged."""
        return self._queue.max_attempts_for(self.spec.topic, self.spec.max_attempts) - 1

    def busy(self) -> bool:
        with self.cond:
            return self.running > 0 or bool(self.buffer) or self.claiming > 0

    # --- the buffer -------------------------------------------------------------------------

    def put(self, fetched: Sequence[tuple[Message, bool]], leased_at: float,
            reserved: int = 0) -> bool | None:
        """Buffers fetched messages, each with whether its attempt is charged already, and
        frees the fetch's reservation; True if a waiting thread was woken for them. None if
        the lane has stopped: nothing was buffered, the caller gives them back."""
        now = time.monotonic()
        with self.cond:
            self.claiming -= reserved
            if self.stopping:
                return None
            woke = self.idle > 0
            self.buffer.extend(Job(m, now, charged, leased_at=leased_at)
                               for m, charged in fetched)
            self._ready += sum(1 for _, charged in fetched if charged)
            while self.idle < len(self.buffer) and self.threads < self.cmax:
                self._spawn()
            # Wake only as many as may run (the others would park again at once).
            self.work.notify(max(1, min(len(fetched), self._active - self.running)))
        return woke

    def _spawn(self) -> None:
        self.threads += 1
        self.idle += 1
        t = threading.Thread(target=self._thread, name=f"tableq-{self.spec.topic}", daemon=True)
        t.start()

    def ensure_min(self) -> None:
        with self.cond:
            while self.threads < self.cmin:
                self._spawn()

    def take_stale(self, older_than_s: float) -> list[Job]:
        """Fetched messages that waited too long for a thread: give them back to others."""
        cutoff = time.monotonic() - older_than_s
        out = []
        with self.cond:
            while (self.buffer and self.buffer[0].fetched_at < cutoff
                   and not self.buffer[0].charging):
                job = self.buffer.popleft()
                job.popped = True
                if job.charged and not job.lost:
                    self._ready -= 1
                if not job.lost:
                    out.append(job)
        return out

    def restart_clocks(self) -> None:
        """After an outage: waiting while the database was down does not make a message
        stale (every worker waited alike)."""
        now = time.monotonic()
        with self.cond:
            for job in self.buffer:
                job.fetched_at = now

    def stop(self, timeout_s: float = 10.0) -> list[Job]:
        """Stops taking new work; returns what was fetched but not started (after any charge
        in flight has been answered, so each job's `charged` is true)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            self.work.notify_all()
            while any(j.charging for j in self.buffer) and time.monotonic() < deadline:
                self.cond.wait(0.1)
            left = [j for j in self.buffer if not j.lost]
            for j in self.buffer:
                j.popped = True
            self.buffer.clear()
            self._ready = 0
            self.cond.notify_all()
        return left

    def wait_idle(self, deadline: float) -> bool:
        with self.cond:
            while self.running > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    # --- the threads ------------------------------------------------------------------------

    def _may_start(self) -> bool:
        """Whether one more thread may start a handler now: fewer than active_threads() run,
        not counting handlers stuck far beyond the typical run (caller holds self.cond)."""
        if self.running < self._active:
            return True
        now, typical = time.monotonic(), self._typical
        busy = sum(1 for s in self._started.values() if counts_as_busy(s, now, typical))
        # Not measured yet, and some already run long: slow handlers, so all may start.
        return busy < self._active or (typical is None and busy < self.running)

    def _hand_watch_on(self) -> None:
        """The watching thread leaves (to run a handler, or to exit): another parked thread
        takes the watch if messages wait (caller holds self.cond)."""
        self._watching = False
        if self.buffer:
            self.work.notify(1)

    def _thread(self) -> None:
        me = threading.get_ident()
        while True:
            with self.cond:
                idle_since = time.monotonic()
                watching = False
                while not self.stopping and not (self.buffer and self._may_start()):
                    left = IDLE_THREAD_EXIT_S - (time.monotonic() - idle_since)
                    if left <= 0 and self.threads > self.cmin:
                        self.threads -= 1
                        self.idle -= 1
                        if watching:
                            self._hand_watch_on()
                        return
                    timeout = max(left, 0.05) if self.threads > self.cmin else None
                    if self.buffer and (watching or not self._watching):
                        # Parked beside waiting messages: one thread looks again now and
                        # then, in case the running handlers got stuck.
                        self._watching = watching = True
                        timeout = STUCK_MIN_S if timeout is None else min(timeout, STUCK_MIN_S)
                    self.work.wait(timeout)
                if watching:
                    self._hand_watch_on()
                if self.stopping:
                    self.threads -= 1
                    self.idle -= 1
                    self.cond.notify_all()
                    return
                job = self.buffer.popleft()
                job.popped = True
                if job.charged and not job.lost:
                    self._ready -= 1
                self.idle -= 1
                self.running += 1
                self._started[me] = time.monotonic()
                self._pace()
                self._charge_ahead()
            try:
                msg = self._gate(job)
                if msg is not None:
                    self._process(msg, announced=job.announced)
            except BaseException as exc:  # noqa: BLE001 - a bug here must not kill the pool silently
                events.emit("worker_error", logging.ERROR, topic=self.spec.topic,
                            id=job.msg.id, error=describe(exc))
            finally:
                with self.cond:
                    self.running -= 1
                    self.idle += 1
                    self._started.pop(me, None)
                    self.cond.notify_all()
                self._slot_freed.set()

    def _pace(self) -> None:
        """Measures the time between two jobs taken (caller holds self.cond)."""
        now = time.monotonic()
        gap, self._last_start = now - self._last_start, now
        # Only while busy (more waiting or running) is the gap the lane's pace, not an idle
        # spell; the first job has no gap.
        if gap < now and (self.buffer or self.running > 1):
            prev = self.start_gap_s
            self.start_gap_s = gap if prev is None else 0.8 * prev + 0.2 * gap

    def _pace_s(self) -> float | None:
        """charge_pace of this lane (caller holds self.cond)."""
        return charge_pace(self.start_gap_s, self.avg_duration_s, self.cmax)

    def _charge_ahead(self) -> None:
        """Asks the lane's charger for the next window once less than a window of charged
        messages waits (caller holds self.cond)."""
        if len(self.buffer) <= self._ready:  # nothing uncharged waits (the common case)
            return
        window = charge_window(self._pace_s())
        if window <= 0 or self._charge_wanted or self._ready >= window:
            return
        self._charge_wanted = True
        if self._charger is None:
            self._charger = threading.Thread(target=self._charger_loop, daemon=True,
                                             name=f"tableq-charge-{self.spec.topic}")
            self._charger.start()
        self.cond.notify_all()

    def _charger_loop(self) -> None:
        while True:
            with self.cond:
                while not self._charge_wanted and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    self._charger = None
                    return
                self._charge_wanted = False
                group = self._ahead(max(1, charge_window(self._pace_s())))
                for j in group:
                    j.charging = True
            if group and self._health.up:
                self._charge(group)  # an outage leaves them uncharged: the gate charges them
            elif group:
                with self.cond:
                    for j in group:
                        j.charging = False
                    self.cond.notify_all()

    def _gate(self, job: Job) -> Message | None:
        """Waits until `job` may start and returns its message (charged, on a lease known to
        be ours), or None if it must not start (lost, or the worker is stopping: then it was
        given back)."""
        health = self._health
        # The common case, without a lock: charged (final once true) on a lease set moments
        # ago, the database up, the worker running.
        if (job.charged and health.up and not self.stopping
                and time.monotonic() - job.leased_at < self.spec.visibility_timeout_s / 2):
            return job.msg
        retries = 0
        while True:
            if self.stopping or self._worker_stop.is_set():
                with self.cond:
                    while job.charging:
                        self.cond.wait(0.1)
                if not job.lost:
                    self._settling.give_back(job.msg, charged=job.charged)
                return None
            if not health.up:
                health.wait_up(0.5)  # pause: no handler starts during an outage
                continue
            with self.cond:
                while job.charging:
                    self.cond.wait()
                if job.lost:
                    return None
                group: list[Job] = []
                if not job.charged:
                    # Lead a charge for this job and the next uncharged ones about to start.
                    group = [job, *self._ahead(charge_window(self._pace_s()))]
                    for j in group:
                        j.charging = True
            if group:
                if not self._charge(group, starting=job):
                    retries += 1
                    health.wait_up(retry_delay(retries, self._rng))
                continue
            if time.monotonic() - job.leased_at < self.spec.visibility_timeout_s / 2:
                return job.msg  # leased just now: surely still ours (no lock, no round trip)
            verdict = self._confirm_lease(job.msg)
            if verdict is None:  # unreachable: wait for the database, then ask again
                retries += 1
                health.wait_up(retry_delay(retries, self._rng))
                continue
            return job.msg if verdict else None

    def _charge(self, group: list[Job], starting: Job | None = None) -> bool:
        """Charges the group in one statement; False if the database was unreachable. If the
        charge is the last allowed attempt of `starting` (the job this thread starts next),
        its start is recorded before the charge commits, so a worker killed in between (by
        another of its handlers, say) has spent nothing: a last attempt is never spent
        without a recorded start."""
        charged: dict[int, Message] | None = None
        sent = time.monotonic()
        started = None
        if starting is not None and starting.msg.attempts >= self._last_attempt():
            started = functools.partial(self._record_start, starting)
        try:
            charged = self._charge_attempts([j.msg for j in group], started)
        finally:
            # One update under the lock: a thread waiting on a job sees it charged (or lost),
            # never "no longer charging but not charged", which would charge it twice.
            with self.cond:
                for j in group:
                    j.charging = False
                    if charged is None:
                        continue
                    if j.msg.id in charged:
                        j.msg, j.charged, j.leased_at = charged[j.msg.id], True, sent
                        if not j.popped:
                            self._ready += 1
                    else:
                        j.lost = True
                self.cond.notify_all()
        return charged is not None

    def _charge_attempts(self, msgs: list[Message],
                         started: Callable[[list[Message]], None] | None = None,
                         ) -> dict[int, Message] | None:
        """Charges the attempts of messages about to start; their new state by id (missing:
        lease lost). None if the database was unreachable."""
        heartbeater = self._settling.heartbeater
        sent = time.monotonic()
        try:
            done = self._queue._charge(msgs, extend=self.spec.visibility_timeout_s,
                                       started=started)
        except TableqError as exc:
            if self._health.failed(exc, "start"):
                return None
            # Not an outage: they do not start; their leases run out and they come back.
            events.emit("start_failed", logging.ERROR, topic=self.spec.topic, count=len(msgs),
                        error=first_line(exc))
            for m in msgs:
                self._settling.unhold(m)
            return {}
        self._health.ok()
        got = {m.id: m for m in done}
        for m in msgs:
            if m.id in got:
                heartbeater.refresh(got[m.id], sent)
            else:
                self._settling.unhold(m)
                self._settling.count("lease_lost")
                events.emit(events.LEASE_LOST, logging.WARNING, topic=m.topic, id=m.id,
                            attempts=m.attempts, during="start")
        return got

    def _confirm_lease(self, msg: Message) -> bool | None:
        """True if msg may start (its lease surely lasts START_MARGIN_S more, asking the
        database if unsure), False if it was lost, None if the database was unreachable."""
        if msg.lease is None:
            return True  # at_most_once: nothing to hold
        heartbeater = self._settling.heartbeater
        left = heartbeater.lease_left(msg)
        if left is None:
            return False
        if left >= min(START_MARGIN_S, self.spec.visibility_timeout_s / 4):
            return True
        try:
            return heartbeater.confirm(msg)
        except TableqError as exc:
            if self._health.failed(exc, "start"):
                return None
            events.emit("start_failed", logging.ERROR, topic=self.spec.topic, id=msg.id,
                        error=first_line(exc))
            return False

    # --- running one message ----------------------------------------------------------------

    @staticmethod
    def _announce(msg: Message) -> None:
        events.emit(events.RECEIVED, topic=msg.topic, id=msg.id, attempts=msg.attempts)

    def _record_start(self, job: Job, charged: list[Message]) -> None:
        """Inside the charge of job's last attempt, before its COMMIT: records its start."""
        for m in charged:
            if m.id == job.msg.id:
                self._announce(m)
                job.announced = True

    def _process(self, msg: Message, *, announced: bool = False) -> None:
        """Runs the handler on msg (past the gate) and hands its outcome to the settling."""
        spec = self.spec
        if not announced:
            self._announce(msg)
        owner = owner_of(msg)
        if isinstance(owner, Tracker) and not owner.settled:
            tracker, handed = owner, msg  # fetched for this run (Fetcher): no copy needed
        else:
            tracker = Tracker(self._queue)
            handed = with_owner(msg, tracker)
        if spec.mode == "exactly_once":
            body = exactly_once_body(self._queue, self._executor, spec.fn,
                                     self._settling.unhold, tracker.note_retry)
            outcome = self._executor.run(body, handed, spec.timeout_s)
            if outcome.ok and isinstance(outcome.value, Outcome):
                outcome = outcome.value  # the body reports the handler's own outcome
        else:
            outcome = self._executor.run(spec.fn, handed, spec.timeout_s, self._fn_async)
        if outcome.status not in ("timeout", "outage"):
            self.record(outcome.duration_s)
        self._settling.settle(spec, msg, outcome, tracker)
