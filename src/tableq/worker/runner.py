"""One worker process's engine: fetches messages for its topics, hands them one by one to a
scaling pool of threads, runs them through the executor, and settles each outcome (ack,
retry with backoff, dead-letter). Holds leases only on what it can start soon. Uses the
Queue API only; no SQL."""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tableq.errors import ConfigurationError, LeaseLost, SchemaNotMigrated, TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.transaction import Transaction
from tableq.worker import events
from tableq.worker.completer import Completer
from tableq.worker.executor import Executor, Outcome, describe
from tableq.worker.heartbeat import Heartbeater
from tableq.worker.periodic import PeriodicJob, Scheduler
from tableq.worker.poller import PollPolicy, Waker
from tableq.worker.retry import Backoff, decide

MODES = ("at_least_once", "at_most_once", "exactly_once")
FETCH_MAX = 250  # most messages one receive asks for
IDLE_THREAD_EXIT_S = 10.0  # an idle thread above the minimum exits after this long
ERROR_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and how to run it."""

    topic: str
    fn: Callable[[Message], Any]
    max_attempts: int | None
    visibility_timeout_s: float
    retry: Backoff
    mode: str
    concurrency_min: int
    concurrency_max: int
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    concurrency: int | None = None  # overrides every handler's maximum
    burst: bool = False
    prefetch: int = 0  # messages fetched beyond free threads, per topic, at least
    # Fetch ahead as many messages as the threads should start within this many seconds (by
    # the handlers' measured duration); 0 turns it off. Bounds leases held but not started.
    prefetch_wait_s: float = 0.5
    grace_period_s: float = 30.0
    poll: PollPolicy = dataclasses.field(default_factory=PollPolicy)
    use_listener: bool = True
    # Process mode: a handler thread that timed out cannot be killed, so the process stops
    # (gracefully) after it and its supervisor starts a fresh one.
    exit_on_timeout: bool = False


class _Tracker:
    """Stands in for the Queue inside a handler's Message, to notice when the handler
    settles the message itself (ack, nack, forward, dead_letter), so the worker does not."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self.settled = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def ack(self, msg: Message, **kw: Any) -> None:
        if msg.lease is None:  # at_most_once: already removed, nothing to ack
            self.settled = True
            return
        self._queue.ack(msg, **kw)
        self.settled = True

    def nack(self, msg: Message, **kw: Any) -> None:
        self._queue.nack(msg, **kw)
        self.settled = True

    def dead_letter(self, msg: Message, error: str, **kw: Any) -> None:
        self._queue.dead_letter(msg, error, **kw)
        self.settled = True

    def forward(self, msg: Message, topic: str, payload: Any, **opts: Any) -> Any:
        if msg.lease is None:
            result = self._queue.send(topic, payload, **opts)
        else:
            result = self._queue.forward(msg, topic, payload, **opts)
        self.settled = True
        return result


class _TrackedTransaction(Transaction):
    """The exactly-once transaction handed to a handler; remembers what it acked."""

    def __init__(self, queue: Queue, connection: Any,
                 before_settle: Callable[[Message], None]) -> None:
        super().__init__(queue, connection)
        self.settled: set[int] = set()
        self._before_settle = before_settle

    def ack(self, msg: Message) -> None:
        # Stop heartbeats first: one issued after this ack locks the row would wait for the
        # commit and then find the row gone, a false "lease lost".
        self._before_settle(msg)
        super().ack(msg)
        self.settled.add(msg.id)

    def dead_letter(self, msg: Message, error: str) -> None:
        self._before_settle(msg)
        super().dead_letter(msg, error)
        self.settled.add(msg.id)


class _Rollback(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


@dataclass
class _Job:
    msg: Message
    fetched_at: float  # monotonic


class Lane:
    """One topic's buffer of fetched messages and its pool of threads (min..max, growing with
    the backlog and shrinking when idle)."""

    def __init__(self, worker: Worker, spec: HandlerSpec, cmin: int, cmax: int,
                 prefetch: int, prefetch_wait_s: float) -> None:
        self.worker, self.spec = worker, spec
        self.cmin, self.cmax, self.prefetch = cmin, cmax, prefetch
        self.prefetch_wait_s = prefetch_wait_s
        self.avg_duration_s: float | None = None
        self.buffer: collections.deque[_Job] = collections.deque()
        self.running = 0
        self.threads = 0
        self.idle = 0
        self.cond = threading.Condition()
        self.stopping = False

    def record(self, duration_s: float) -> None:
        with self.cond:
            prev = self.avg_duration_s
            self.avg_duration_s = duration_s if prev is None else 0.8 * prev + 0.2 * duration_s

    def prefetch_target(self) -> int:
        """Messages to hold beyond the threads: the explicit minimum, or as many as the
        threads will start within prefetch_wait_s at the measured handler duration."""
        adaptive = 0
        # Short leases shorten the wait too, so most fetched messages start before their
        # first heartbeat (a third of the lease) is due.
        wait_s = min(self.prefetch_wait_s, self.spec.visibility_timeout_s / 4)
        if wait_s > 0 and self.avg_duration_s is not None:
            per_s = self.cmax / max(self.avg_duration_s, 1e-4)
            adaptive = int(min(FETCH_MAX, per_s * wait_s))
        return max(self.prefetch, adaptive)

    def want(self) -> int:
        """How many to fetch now: 0 unless a thread would go idle or half the room is free,
        so fetches come in batches instead of one message per finished job."""
        with self.cond:
            capacity = self.cmax + self.prefetch_target()
            room = capacity - self.running - len(self.buffer)
            if room <= 0:
                return 0
            idle_threads = self.cmax - self.running - len(self.buffer)
            if idle_threads > 0 or room >= max(1, capacity // 2):
                return room
            return 0

    def busy(self) -> bool:
        with self.cond:
            return self.running > 0 or bool(self.buffer)

    def put(self, msgs: Sequence[Message]) -> None:
        now = time.monotonic()
        with self.cond:
            self.buffer.extend(_Job(m, now) for m in msgs)
            while self.idle < len(self.buffer) and self.threads < self.cmax:
                self._spawn()
            self.cond.notify(len(msgs))

    def _spawn(self) -> None:
        self.threads += 1
        self.idle += 1
        t = threading.Thread(target=self._thread, name=f"tableq-{self.spec.topic}", daemon=True)
        t.start()

    def ensure_min(self) -> None:
        with self.cond:
            while self.threads < self.cmin:
                self._spawn()

    def take_stale(self, older_than_s: float) -> list[Message]:
        """Fetched messages that waited too long for a thread: give them back to others."""
        cutoff = time.monotonic() - older_than_s
        out = []
        with self.cond:
            while self.buffer and self.buffer[0].fetched_at < cutoff:
                out.append(self.buffer.popleft().msg)
        return out

    def stop(self) -> list[Message]:
        """Stops taking new work; returns what was fetched but not started."""
        with self.cond:
            self.stopping = True
            left = [j.msg for j in self.buffer]
            self.buffer.clear()
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

    def _thread(self) -> None:
        while True:
            with self.cond:
                idle_since = time.monotonic()
                while not self.buffer and not self.stopping:
                    left = IDLE_THREAD_EXIT_S - (time.monotonic() - idle_since)
                    if left <= 0 and self.threads > self.cmin:
                        self.threads -= 1
                        self.idle -= 1
                        return
                    self.cond.wait(max(left, 0.05) if self.threads > self.cmin else None)
                if self.stopping:
                    self.threads -= 1
                    self.idle -= 1
                    self.cond.notify_all()
                    return
                job = self.buffer.popleft()
                self.idle -= 1
                self.running += 1
            try:
                self.worker._process(self.spec, job.msg)
            except BaseException as exc:  # noqa: BLE001 - a bug here must not kill the pool silently
                events.emit("worker_error", logging.ERROR, topic=self.spec.topic,
                            id=job.msg.id, error=describe(exc))
            finally:
                with self.cond:
                    self.running -= 1
                    self.idle += 1
                    self.cond.notify_all()
                self.worker._slot_freed()


class Worker:
    """Runs the handlers of some topics until stopped (or, in burst mode, until no message is
    due and none is running)."""

    def __init__(self, queue: Queue, specs: Sequence[HandlerSpec],
                 periodic: Sequence[PeriodicJob] = (), options: WorkerOptions = WorkerOptions(),
                 ) -> None:
        if not specs and not periodic:
            raise ConfigurationError("no handlers to run: register one with @app.handler(topic) "
                                     "or pick topics that have handlers")
        self.queue = queue
        self.options = options
        self.lanes: list[Lane] = []
        for spec in specs:
            cmax = options.concurrency if options.concurrency is not None else spec.concurrency_max
            cmin = min(spec.concurrency_min, cmax)
            self.lanes.append(Lane(self, spec, cmin, cmax, options.prefetch,
                                   options.prefetch_wait_s))
        self.scheduler = Scheduler(queue, list(periodic))
        self.executor = Executor()
        self._heartbeater: Heartbeater | None = None
        self._completer: Completer | None = None
        self._waker: Waker | None = None
        self._stop = threading.Event()
        self._slot_event = threading.Event()
        self._rng = random.Random()
        self.stats = collections.Counter[str]()
        self._stats_lock = threading.Lock()
        self.running = threading.Event()
        self.waiting = threading.Event()  # set while parked waiting for work (tests, demos)
        self.restart_requested = False
        self._retry_due = 0.0  # monotonic: when the last retry this worker scheduled is due

    # --- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Graceful: stop fetching; run() then releases unstarted messages and waits for
        running handlers up to the grace period."""
        self._stop.set()
        self._slot_event.set()
        if self._waker is not None:
            self._waker.wake()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _count(self, what: str) -> None:
        with self._stats_lock:
            self.stats[what] += 1

    def _slot_freed(self) -> None:
        self._slot_event.set()

    # --- the fetch loop -------------------------------------------------------------------------

    def run(self) -> None:
        topics = [lane.spec.topic for lane in self.lanes]
        self._heartbeater = Heartbeater(self.queue)
        self._completer = Completer(self.queue, self._acked, self._ack_lost)
        self._waker = Waker(self.queue, topics, use_listener=self.options.use_listener)
        for lane in self.lanes:
            lane.ensure_min()
        events.emit(events.STARTED, topics=",".join(topics) or "-",
                    wakeup="notify" if self._waker.listening else "polling",
                    burst=self.options.burst or None)
        self.running.set()
        try:
            self._loop()
        finally:
            self._shutdown()

    def _loop(self) -> None:
        assert self._waker is not None
        delay = 0.0
        while not self._stop.is_set():
            try:
                self.scheduler.check()
                found = self._fetch_round()
            except (SchemaNotMigrated, ConfigurationError):
                raise
            except TableqError as exc:
                events.emit("fetch_failed", logging.WARNING, error=str(exc).splitlines()[0])
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            if found:
                delay = 0.0
                continue
            if (self.options.burst and not any(lane.busy() for lane in self.lanes)
                    and time.monotonic() >= self._retry_due):
                # Nothing due, nothing running, no retry of ours still to come: drained.
                if self._drained():
                    break
                continue
            if not any(lane.want() > 0 for lane in self.lanes):
                # Every thread is busy: wait for one to finish, not for the database.
                self._slot_event.clear()
                if not any(lane.want() > 0 for lane in self.lanes):
                    self._slot_event.wait(min(0.5, self.scheduler.seconds_until_check()))
                continue
            delay = self.options.poll.next_delay(delay, False)
            events.emit(events.IDLE, logging.DEBUG, wait_s=round(delay, 3))
            self.waiting.set()
            try:
                hits = self._waker.wait(min(delay, self.scheduler.seconds_until_check()))
            finally:
                self.waiting.clear()
            if hits:
                delay = 0.0

    def _drained(self) -> bool:
        for lane in self.lanes:
            if lane.want() > 0 and self._fetch(lane):
                return False
        return not any(lane.busy() for lane in self.lanes)

    def _fetch_round(self) -> bool:
        found = False
        for lane in self.lanes:
            stale = lane.take_stale(max(0.5, lane.spec.visibility_timeout_s / 2))
            for msg in stale:
                self._release(msg)
            if lane.want() > 0 and self._fetch(lane):
                found = True
        return found

    def _fetch(self, lane: Lane) -> bool:
        spec = lane.spec
        want = min(lane.want(), FETCH_MAX)
        if want <= 0 or self._stop.is_set():
            return False
        mode = "at_most_once" if spec.mode == "at_most_once" else "at_least_once"
        msgs = self.queue.receive(spec.topic, max=want,
                                  visibility_timeout=spec.visibility_timeout_s, mode=mode,
                                  max_attempts=spec.max_attempts)
        if not msgs:
            return False
        if mode == "at_least_once":
            assert self._heartbeater is not None
            for m in msgs:
                self._heartbeater.hold(m, spec.visibility_timeout_s)
        lane.put(msgs)
        return True

    # --- running one message ----------------------------------------------------------------------

    def _process(self, spec: HandlerSpec, msg: Message) -> None:
        events.emit(events.RECEIVED, topic=msg.topic, id=msg.id, attempts=msg.attempts)
        tracker = _Tracker(self.queue)
        handed = dataclasses.replace(msg, _queue=tracker)  # type: ignore[arg-type]
        if spec.mode == "exactly_once":
            outcome = self.executor.run(self._exactly_once_body(spec), handed, spec.timeout_s)
            if outcome.ok and isinstance(outcome.value, Outcome):
                outcome = outcome.value  # the body reports the handler's own outcome
        else:
            outcome = self.executor.run(spec.fn, handed, spec.timeout_s)
        lanes = [lane for lane in self.lanes if lane.spec is spec]
        if lanes and outcome.status != "timeout":
            lanes[0].record(outcome.duration_s)
        if not self._settle(spec, msg, outcome, tracker) and self._heartbeater is not None:
            self._heartbeater.drop(msg)

    def _unhold(self, msg: Message) -> None:
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)

    def _acked(self, msg: Message, duration_s: float) -> None:
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)
        self._count("acked")
        events.emit(events.ACKED, topic=msg.topic, id=msg.id, attempts=msg.attempts,
                    duration_s=round(duration_s, 4))

    def _ack_lost(self, msg: Message) -> None:
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)
        self._count("lease_lost")

    def _exactly_once_body(self, spec: HandlerSpec) -> Callable[[Message], Outcome]:
        def body(msg: Message) -> Outcome:
            try:
                with self.queue.transaction() as tx:
                    ttx = _TrackedTransaction(self.queue, tx.connection, self._unhold)
                    inner = self.executor.run(spec.fn, dataclasses.replace(msg, _transaction=ttx),
                                              None)
                    if not inner.ok:
                        raise _Rollback(inner)
                    if msg.id not in ttx.settled:
                        # Fenced by the lease: if it was lost, LeaseLost rolls back the
                        # handler's writes together with this ack.
                        ttx.ack(msg)
                    committed = Outcome("ok", None, inner.duration_s, "committed")
                return committed
            except _Rollback as rb:
                return rb.outcome
            except LeaseLost as exc:
                return Outcome("lease_lost", describe(exc))
        return body

    def _settle(self, spec: HandlerSpec, msg: Message, outcome: Outcome,
                tracker: _Tracker) -> bool:
        """Acts on the outcome. True when the ack was handed to the completer (which then
        owns the message's heartbeat until the ack commits)."""
        fields = {"topic": msg.topic, "id": msg.id, "attempts": msg.attempts}
        if spec.mode == "at_most_once":
            if outcome.ok:
                self._count("acked")
                events.emit(events.ACKED, **fields, mode="at_most_once",
                            duration_s=round(outcome.duration_s, 4))
            else:
                self._count("failed")
                events.emit(events.FAILED, logging.WARNING, **fields, mode="at_most_once",
                            error=_first_line(outcome.error))
            return False
        if outcome.status == "lease_lost":
            self._count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during="ack",
                        rolled_back=True)
            return False
        if outcome.ok and (tracker.settled or spec.mode == "exactly_once"):
            self._count("acked")
            events.emit(events.ACKED, **fields, duration_s=round(outcome.duration_s, 4))
            return False
        if tracker.settled and not outcome.ok:
            # The handler settled the message itself, then raised: its settlement stands.
            events.emit(events.FAILED, logging.WARNING, **fields, settled_by="handler",
                        error=_first_line(outcome.error))
            return False
        if outcome.status == "timeout":
            self._count("timed_out")
            events.emit(events.TIMED_OUT, logging.WARNING, **fields, timeout_s=spec.timeout_s,
                        restart=self.options.exit_on_timeout or None)
            if self.options.exit_on_timeout:
                self.restart_requested = True
                self.stop()
        decision = decide(succeeded=outcome.ok, attempts=msg.attempts,
                          max_attempts=self.queue.max_attempts_for(msg.topic, spec.max_attempts),
                          backoff=spec.retry, error=outcome.error, rng=self._rng)
        try:
            if decision.action == "ack":
                assert self._completer is not None
                self._completer.ack(msg, outcome.duration_s)
                return True
            if decision.action == "retry":
                self.queue.nack(msg, delay=decision.delay_s, error=decision.error)
                with self._stats_lock:
                    self._retry_due = max(self._retry_due, time.monotonic() + decision.delay_s)
                self._count("retried")
                events.emit(events.RETRIED, logging.WARNING, **fields,
                            delay_s=round(decision.delay_s, 3), error=_first_line(decision.error))
            if decision.action == "dead_letter":
                self.queue.dead_letter(msg, decision.error or "failed")
                self._count("dead_lettered")
                events.emit(events.DEAD_LETTERED, logging.ERROR, **fields,
                            error=_first_line(decision.error))
        except LeaseLost:
            self._count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during=decision.action)
        except TableqError as exc:
            # The lease will run out and the message come back: at-least-once holds.
            events.emit("settle_failed", logging.ERROR, **fields, action=decision.action,
                        error=str(exc).splitlines()[0])
        return False

    def _release(self, msg: Message) -> None:
        if msg.lease is None:
            return  # at_most_once: already gone; nothing to give back
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)
        try:
            self.queue.release(msg)
            self._count("released")
            events.emit(events.RELEASED, topic=msg.topic, id=msg.id, attempts=msg.attempts - 1)
        except LeaseLost:
            events.emit(events.LEASE_LOST, logging.WARNING, topic=msg.topic, id=msg.id,
                        attempts=msg.attempts, during="release")
        except TableqError as exc:
            events.emit("release_failed", logging.WARNING, topic=msg.topic, id=msg.id,
                        error=str(exc).splitlines()[0])

    # --- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        events.emit(events.STOPPING, grace_s=self.options.grace_period_s)
        unstarted = [m for lane in self.lanes for m in lane.stop()]
        for m in unstarted:
            self._release(m)
        deadline = time.monotonic() + self.options.grace_period_s
        finished = all([lane.wait_idle(deadline) for lane in self.lanes])  # noqa: C419 - wait for every lane
        if not finished:
            events.emit("grace_expired", logging.WARNING,
                        running=sum(lane.running for lane in self.lanes))
        if self._completer is not None:
            self._completer.close()  # commit the acks of everything that finished
        if self._heartbeater is not None:
            self._heartbeater.close()
        if self._waker is not None:
            self._waker.close()
        self.executor.close()
        self.running.clear()
        events.emit(events.STOPPED, **{k: v for k, v in sorted(self.stats.items())})


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else text[:300]
