"""One worker process's engine: fetches messages for its topics into lanes (lane.py), runs
them through the executor, and decides what each outcome means (ack, retry with backoff,
dead-letter), handing the settlement to the completer's outbox. Holds leases only on what it
can start soon, and charges prefetched messages their attempt only when they start.

It rides out database outages (health.py): the first failure anywhere is logged once; while
the database is unreachable nothing is fetched and no handler starts, the next fetch is a
probe after a jittered, capped wait, heartbeats and settlements are kept and retried, and
work resumes by itself when any of them gets through. It never exits for an outage and never
dead-letters a message because of one. Uses the Queue API only; no SQL."""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, get_args

from tableq.errors import ConfigurationError, LeaseLost, SchemaNotMigrated, TableqError
from tableq.message import Message, OnDuplicate, SendResult
from tableq.queue import Queue
from tableq.transaction import Transaction
from tableq.worker import events
from tableq.worker.completer import Completer, Settlement, Verdict
from tableq.worker.executor import Executor, Outcome, describe
from tableq.worker.health import Health, first_line, is_outage, retry_delay
from tableq.worker.heartbeat import Heartbeater
from tableq.worker.lane import FETCH_MAX, Job, Lane
from tableq.worker.periodic import PeriodicJob, Scheduler
from tableq.worker.poller import PollPolicy, Waker
from tableq.worker.retry import Backoff, decide

WorkerMode = Literal["at_least_once", "at_most_once", "exactly_once"]
"""How a handler's messages are delivered: leased then acked (at_least_once), removed as they
are received (at_most_once), or received, handled and acked in one database transaction with
the handler's own writes (exactly_once)."""
MODES: tuple[WorkerMode, ...] = get_args(WorkerMode)
P = TypeVar("P")
ERROR_BACKOFF_S = 1.0
START_MARGIN_S = 1.0  # a handler starts only on a lease known to last at least this long


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and how to run it."""

    topic: str
    fn: Callable[[Message], Any]
    max_attempts: int | None
    visibility_timeout_s: float
    retry: Backoff
    mode: WorkerMode
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
    """Stands in for the Queue inside a handler's Message (a message.Settler), to notice
    when the handler settles the message itself (ack, nack, forward, dead_letter), so the
    worker does not."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self.settled = False

    def ack(self, msg: Message) -> None:
        if msg.lease is None:  # at_most_once: already removed, nothing to ack
            self.settled = True
            return
        self._queue.ack(msg)
        self.settled = True

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None) -> None:
        self._queue.nack(msg, delay=delay, error=error)
        self.settled = True

    def heartbeat(self, msg: Message[P], *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message[P]:
        return self._queue.heartbeat(msg, extend=extend, progress=progress)

    def dead_letter(self, msg: Message, error: str) -> None:
        self._queue.dead_letter(msg, error)
        self.settled = True

    def forward(self, msg: Message, topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        if msg.lease is None:  # at_most_once: already removed, so only the send is left
            result = self._queue.send(topic, payload, key=key, kind=kind, headers=headers,
                                      priority=priority, delay=delay, at=at,
                                      on_duplicate=on_duplicate)
        else:
            result = self._queue.forward(msg, topic, payload, key=key, kind=kind,
                                         headers=headers, priority=priority, delay=delay,
                                         at=at, on_duplicate=on_duplicate)
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


class Worker:
    """Runs the handlers of some topics until stopped (or, in burst mode, until no message is
    due and none is running)."""

    def __init__(self, queue: Queue, specs: Sequence[HandlerSpec],
                 periodic: Sequence[PeriodicJob] = (), options: WorkerOptions = WorkerOptions(),
                 ) -> None:
        if not specs and not periodic:
            raise ConfigurationError("no handlers to run: register one with @app.handler(topic) "
                                     "or pick topics that have handlers")
        exactly_once = sorted(s.topic for s in specs if s.mode == "exactly_once")
        if exactly_once and not getattr(queue, "supports_transactions", True):
            # Refused here, before any message is taken: at run time every attempt would fail
            # and the messages would be dead-lettered for a setup mistake.
            raise ConfigurationError(
                f"the exactly_once handlers of {', '.join(exactly_once)} need the database "
                "itself (the handler's writes and the ack commit together), not the HTTP API: "
                "run them with a database URL, or make them at_least_once")
        self.queue = queue
        self.options = options
        self.health = Health()
        self.lanes: list[Lane] = []
        for spec in specs:
            cmax = options.concurrency if options.concurrency is not None else spec.concurrency_max
            cmin = min(spec.concurrency_min, cmax)
            self.lanes.append(Lane(self, spec, cmin, cmax, options.prefetch,
                                   options.prefetch_wait_s))
        self.scheduler = Scheduler(queue, list(periodic), self.health)
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
        self.health.wake()
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

    def _retry_delay(self, attempt: int) -> float:
        return retry_delay(attempt, self._rng)

    # --- the fetch loop -------------------------------------------------------------------------

    def run(self) -> None:
        topics = [lane.spec.topic for lane in self.lanes]
        self._heartbeater = Heartbeater(self.queue, self.health)
        self._completer = Completer(self.queue, self.health, self._settled)
        self._waker = Waker(self.queue, topics, use_listener=self.options.use_listener,
                            health=self.health)
        self.health.on_recovery(self._recovered)
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

    def _recovered(self) -> None:
        for lane in self.lanes:
            lane.restart_clocks()
        self._slot_event.set()
        if self._waker is not None:
            self._waker.wake()

    def _loop(self) -> None:
        assert self._waker is not None
        delay = 0.0
        probes = 0
        while not self._stop.is_set():
            if not self.health.up:
                # An outage: nothing is fetched until the database answers. The next fetch is
                # the probe, after a jittered, capped wait (or at once when a heartbeat or a
                # settlement got through first).
                self.health.wait_up(self._retry_delay(probes))
                probes += 1
                if self._stop.is_set():
                    break
            else:
                probes = 0
            try:
                if self.health.up:
                    self.scheduler.check()
                found = self._fetch_round()
                if (not found and self.options.burst and self.health.up
                        and not any(lane.busy() for lane in self.lanes)
                        and time.monotonic() >= self._retry_due
                        and not (self._completer and self._completer.pending())):
                    # Nothing due, nothing running, no retry of ours still to come: drained.
                    if self._drained():
                        break
                    continue
            except (SchemaNotMigrated, ConfigurationError):
                raise
            except TableqError as exc:
                if self.health.failed(exc, "fetch"):
                    continue
                events.emit("fetch_failed", logging.WARNING, error=first_line(exc))
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            if found:
                delay = 0.0
                continue
            if not self.health.up:
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
            # While the database is down, waiting does not make a fetched message stale
            # (restart_clocks starts its clock again once the database is back).
            stale = lane.take_stale(max(0.5, lane.spec.visibility_timeout_s / 2)) \
                if self.health.up else []
            for job in stale:
                self._give_back(job)
            if self.health.up or not found:
                if lane.want() > 0 and self._fetch(lane):
                    found = True
        return found

    def _fetch(self, lane: Lane) -> bool:
        spec = lane.spec
        want = min(lane.want(), FETCH_MAX)
        if want <= 0 or self._stop.is_set():
            return False
        if spec.mode == "at_most_once":
            msgs = self.queue.receive(spec.topic, max=want,
                                      visibility_timeout=spec.visibility_timeout_s,
                                      mode="at_most_once", max_attempts=spec.max_attempts)
            self.health.ok()
            lane.put([(m, True) for m in msgs], time.monotonic())
            return bool(msgs)
        sent = time.monotonic()
        # Charged now: what starts at once and the charge window, never a last allowed
        # attempt (that one is charged right before its handler starts); lane.py.
        got = self.queue._receive_deferred(
            spec.topic, max=want, charge=min(want, lane.start_soon()), charge_last=0,
            visibility_timeout=spec.visibility_timeout_s, max_attempts=spec.max_attempts)
        self.health.ok()
        if not got:
            return False
        assert self._heartbeater is not None
        for m, _ in got:
            self._heartbeater.hold(m, spec.visibility_timeout_s, since=sent)
        lane.put(got, sent)
        return True

    # --- the gate before a handler starts (called by lane threads) -----------------------------

    def _charge(self, spec: HandlerSpec, msgs: list[Message]) -> dict[int, Message] | None:
        """Charges the attempts of messages about to start; their new state by id (missing:
        lease lost). None if the database was unreachable."""
        assert self._heartbeater is not None
        sent = time.monotonic()
        try:
            done = self.queue._charge(msgs, extend=spec.visibility_timeout_s)
        except TableqError as exc:
            if self.health.failed(exc, "start"):
                return None
            # Not an outage: they do not start; their leases run out and they come back.
            events.emit("start_failed", logging.ERROR, topic=spec.topic, count=len(msgs),
                        error=first_line(exc))
            for m in msgs:
                self._unhold(m)
            return {}
        self.health.ok()
        got = {m.id: m for m in done}
        for m in msgs:
            if m.id in got:
                self._heartbeater.refresh(got[m.id], sent)
            else:
                self._unhold(m)
                self._count("lease_lost")
                events.emit(events.LEASE_LOST, logging.WARNING, topic=m.topic, id=m.id,
                            attempts=m.attempts, during="start")
        return got

    def _confirm_lease(self, spec: HandlerSpec, msg: Message) -> bool | None:
        """True if msg may start (its lease surely lasts START_MARGIN_S more, asking the
        database if unsure), False if it was lost, None if the database was unreachable."""
        if msg.lease is None:
            return True  # at_most_once: nothing to hold
        assert self._heartbeater is not None
        left = self._heartbeater.lease_left(msg)
        if left is None:
            return False
        if left >= min(START_MARGIN_S, spec.visibility_timeout_s / 4):
            return True
        try:
            return self._heartbeater.confirm(msg)
        except TableqError as exc:
            if self.health.failed(exc, "start"):
                return None
            events.emit("start_failed", logging.ERROR, topic=spec.topic, id=msg.id,
                        error=first_line(exc))
            return False

    def _give_back(self, job: Job) -> None:
        """Releases a fetched message that will not start here: its attempt back if it was
        charged, unchanged if not."""
        if job.msg.lease is None:
            return  # at_most_once: already gone; nothing to give back
        assert self._completer is not None and self._heartbeater is not None
        self._heartbeater.settling(job.msg)
        self._completer.settle(Settlement("release", job.msg, refund=job.charged))

    # --- running one message ----------------------------------------------------------------------

    def _process(self, spec: HandlerSpec, msg: Message) -> None:
        events.emit(events.RECEIVED, topic=msg.topic, id=msg.id, attempts=msg.attempts)
        tracker = _Tracker(self.queue)
        handed = dataclasses.replace(msg, _queue=tracker)
        if spec.mode == "exactly_once":
            outcome = self.executor.run(self._exactly_once_body(spec), handed, spec.timeout_s)
            if outcome.ok and isinstance(outcome.value, Outcome):
                outcome = outcome.value  # the body reports the handler's own outcome
        else:
            outcome = self.executor.run(spec.fn, handed, spec.timeout_s)
        lanes = [lane for lane in self.lanes if lane.spec is spec]
        if lanes and outcome.status not in ("timeout", "outage"):
            lanes[0].record(outcome.duration_s)
        self._settle(spec, msg, outcome, tracker)

    def _unhold(self, msg: Message) -> None:
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)

    def _exactly_once_body(self, spec: HandlerSpec) -> Callable[[Message], Outcome]:
        def body(msg: Message) -> Outcome:
            failed: list[Outcome] = []
            try:
                with self.queue.transaction() as tx:
                    ttx = _TrackedTransaction(self.queue, tx.connection, self._unhold)
                    inner = self.executor.run(spec.fn, dataclasses.replace(msg, _transaction=ttx),
                                              None)
                    if not inner.ok:
                        failed.append(inner)
                        # Re-raised as it is, so the transaction's end can tell a handler that
                        # failed on its own from one whose connection died under it.
                        raise inner.exc if inner.exc is not None else _Rollback(inner)
                    if msg.id not in ttx.settled:
                        # Fenced by the lease: if it was lost, LeaseLost rolls back the
                        # handler's writes together with this ack.
                        ttx.ack(msg)
                    committed = Outcome("ok", None, inner.duration_s, "committed")
                return committed
            except _Rollback as rb:
                return rb.outcome
            except Exception as exc:
                if failed and exc is failed[0].exc:
                    return failed[0]  # the handler's own failure, rolled back
                if isinstance(exc, LeaseLost):
                    return Outcome("lease_lost", describe(exc), exc=exc)
                if is_outage(exc):
                    # The connection or the database failed: rolled back, or committed with
                    # its reply lost. _settle asks the database which.
                    return Outcome("outage", describe(exc), exc=exc)
                raise
        return body

    def _probe(self, spec: HandlerSpec, msg: Message) -> Literal["held", "gone", "lost", "down"]:
        """After a failure that may be the database's: is msg still held by us (the database
        answers, so the failure was this delivery's), gone (its exactly-once transaction
        committed), taken by someone else, or is the database down? One fenced heartbeat,
        which also keeps the lease while the settlement is pending."""
        assert self._heartbeater is not None
        for attempt in range(2):  # twice: a connection killed under us is not an outage
            try:
                kept = self.queue.heartbeat_many([msg], extend=spec.visibility_timeout_s)
                if kept:
                    self.health.ok()
                    self._heartbeater.hold(msg, spec.visibility_timeout_s)
                    return "held"
                return "gone" if self.queue.get(msg.id) is None else "lost"
            except TableqError as exc:
                if not self.health.failed(exc, "settle"):
                    return "held"  # not an outage: settle as usual (and meet the error there)
                if attempt == 1:
                    return "down"
        raise AssertionError("unreachable")

    def _settle(self, spec: HandlerSpec, msg: Message, outcome: Outcome,
                tracker: _Tracker) -> None:
        """Acts on the outcome: most settlements go to the completer's outbox, which reports
        back to _settled; the others are done here and the heartbeat is dropped."""
        assert self._completer is not None
        fields: dict[str, Any] = {"topic": msg.topic, "id": msg.id, "attempts": msg.attempts}
        if spec.mode == "at_most_once":
            if outcome.ok:
                self._count("acked")
                events.emit(events.ACKED, **fields, mode="at_most_once",
                            duration_s=round(outcome.duration_s, 4))
            else:
                self._count("failed")
                events.emit(events.FAILED, logging.WARNING, **fields, mode="at_most_once",
                            error=_first_line(outcome.error))
            return
        if outcome.status == "lease_lost":
            self._unhold(msg)
            self._count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during="ack",
                        rolled_back=True)
            return
        if outcome.ok and (tracker.settled or spec.mode == "exactly_once"):
            self._unhold(msg)
            self._count("acked")
            events.emit(events.ACKED, **fields, duration_s=round(outcome.duration_s, 4))
            return
        if tracker.settled and not outcome.ok:
            # The handler settled the message itself, then raised: its settlement stands.
            self._unhold(msg)
            events.emit(events.FAILED, logging.WARNING, **fields, settled_by="handler",
                        error=_first_line(outcome.error))
            return
        if outcome.status == "outage" or (not outcome.ok and is_outage(outcome.exc)):
            state = self._probe(spec, msg)
            if state == "down":
                # The database's failure, not the handler's: once it is back, the message is
                # released with its attempt given back (never dead-lettered for an outage).
                # An exactly-once transaction may have committed before the connection died:
                # the outbox then finds the row gone and counts it acked.
                assert self._heartbeater is not None
                self._heartbeater.settling(msg)
                self._completer.settle(Settlement(
                    "release", msg, refund=True, ambiguous=outcome.status == "outage",
                    handler_ran=outcome.status == "outage"))
                return
            if state != "held":
                self._unhold(msg)
                if state == "gone" and outcome.status == "outage":
                    self._count("acked")
                    events.emit(events.ACKED, **fields, duration_s=round(outcome.duration_s, 4),
                                committed="reply_lost")
                else:
                    self._count("lease_lost")
                    events.emit(events.LEASE_LOST, logging.WARNING, **fields, during="settle")
                return
            # Held: the database answers, so the failure belongs to this delivery (a cut
            # connection, a slow transaction, another database): the usual retry policy.
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
        assert self._heartbeater is not None
        self._heartbeater.settling(msg)
        if decision.action == "ack":
            self._completer.ack(msg, outcome.duration_s)
        elif decision.action == "retry":
            self._completer.settle(Settlement("nack", msg, delay_s=decision.delay_s,
                                              error=decision.error))
        else:
            self._completer.settle(Settlement("dead_letter", msg,
                                              error=decision.error or "failed"))

    def _settled(self, s: Settlement, verdict: Verdict) -> None:
        """The completer's answer for one settlement: log it, count it, stop its heartbeat."""
        msg = s.msg
        self._unhold(msg)
        if verdict == "done" and s.action == "ack":  # the hot path: one per message
            self._count("acked")
            events.emit(events.ACKED, topic=msg.topic, id=msg.id, attempts=msg.attempts,
                        duration_s=round(s.duration_s, 4))
            return
        fields: dict[str, Any] = {"topic": msg.topic, "id": msg.id, "attempts": msg.attempts}
        if verdict == "lost":
            self._count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during=s.action)
            return
        if verdict in ("failed", "abandoned"):
            self._count(f"settle_{verdict}")
            return  # logged once per batch by the completer; the lease will run out
        if s.action == "ack" or (verdict == "gone" and s.handler_ran):
            self._count("acked")
            events.emit(events.ACKED, **fields, duration_s=round(s.duration_s, 4),
                        committed="reply_lost" if s.action != "ack" else None)
        elif s.action == "nack":
            with self._stats_lock:  # due from when the database set it (burst waits for it)
                self._retry_due = max(self._retry_due, time.monotonic() + s.delay_s)
            self._count("retried")
            events.emit(events.RETRIED, logging.WARNING, **fields,
                        delay_s=round(s.delay_s, 3), error=_first_line(s.error))
        elif s.action == "dead_letter":
            self._count("dead_lettered")
            events.emit(events.DEAD_LETTERED, logging.ERROR, **fields,
                        error=_first_line(s.error))
        else:
            self._count("released")
            events.emit(events.RELEASED, topic=msg.topic, id=msg.id,
                        attempts=msg.attempts - (1 if s.refund else 0),
                        after="outage" if s.handler_ran else None)

    # --- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        self.health.wake()
        events.emit(events.STOPPING, grace_s=self.options.grace_period_s)
        deadline = time.monotonic() + self.options.grace_period_s
        for lane in self.lanes:
            for job in lane.stop():
                self._give_back(job)
        finished = all([lane.wait_idle(deadline) for lane in self.lanes])  # noqa: C419 - wait for every lane
        if not finished:
            events.emit("grace_expired", logging.WARNING,
                        running=sum(lane.running for lane in self.lanes))
        if self._completer is not None:
            # Commit the settlements of everything that finished; if the database is still
            # unreachable, wait out the grace period, then leave them to their leases.
            self._completer.close(max(1.0, deadline - time.monotonic()))
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
