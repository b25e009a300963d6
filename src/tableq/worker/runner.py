"""One worker process's engine: starts the lanes (lane.py), fetches for them (fetcher.py)
when the poller says so (poller.py), runs periodic jobs, and stops: stop fetching, give back
what never started, wait for running handlers up to the grace period, commit what they
settled (settling.py). Holds leases only on what it can start soon.

It rides out database outages (health.py): the first failure anywhere is logged once; while
the database is unreachable nothing is fetched and no handler starts, the next fetch is a
probe after a jittered, capped wait, heartbeats and settlements are kept and retried, and
work resumes by itself when any of them gets through. It never exits for an outage and never
dead-letters a message because of one. Uses the Queue API only; no SQL."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence

from tableq.errors import ConfigurationError, SchemaNotMigrated, TableqError
from tableq.queue import Queue
from tableq.worker import events
from tableq.worker.executor import Executor
from tableq.worker.fetcher import Fetcher
from tableq.worker.health import Health, first_line, retry_delay
from tableq.worker.lane import Lane
from tableq.worker.periodic import PeriodicJob, Scheduler
from tableq.worker.poller import Waker
from tableq.worker.settling import Settling
from tableq.worker.spec import HandlerSpec, WorkerOptions

ERROR_BACKOFF_S = 1.0
DEFAULT_OPTIONS = WorkerOptions()


class Worker:
    """Runs the handlers of some topics until stopped (or, in burst mode, until no message is
    due and none is running)."""

    def __init__(self, queue: Queue, specs: Sequence[HandlerSpec],
                 periodic: Sequence[PeriodicJob] = (), options: WorkerOptions = DEFAULT_OPTIONS,
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
        self.executor = Executor()
        self._stop = threading.Event()
        self._slot_event = threading.Event()  # set when a handler finishes
        self._rng = random.Random()
        self.settling = Settling(queue, self.health, self._rng,
                                 exit_on_timeout=options.exit_on_timeout, stop=self.stop)
        self.stats = self.settling.stats
        self.lanes: list[Lane] = []
        for spec in specs:
            cmax = options.concurrency if options.concurrency is not None else spec.concurrency_max
            cmin = min(spec.concurrency_min, cmax)
            self.lanes.append(Lane(
                spec, cmin, cmax, options.prefetch, options.prefetch_wait_s, queue=queue,
                health=self.health, settling=self.settling, executor=self.executor,
                rng=self._rng, stop=self._stop, slot_freed=self._slot_event))
        self.fetcher = Fetcher(queue, self.health, self.settling, self.lanes, self._stop)
        self.scheduler = Scheduler(queue, list(periodic), self.health)
        self._waker: Waker | None = None
        self.running = threading.Event()
        self.waiting = threading.Event()  # set while parked waiting for work (tests, demos)

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

    @property
    def restart_requested(self) -> bool:
        """A handler timed out with exit_on_timeout: the process should be replaced."""
        return self.settling.restart_requested

    # --- the fetch loop -------------------------------------------------------------------------

    def run(self) -> None:
        topics = [lane.spec.topic for lane in self.lanes]
        self.settling.start()
        self._waker = Waker(self.queue, topics, use_listener=self.options.use_listener,
                            health=self.health)
        self.health.on_recovery(self._recovered)
        for lane in self.lanes:
            lane.ensure_min()
        self.fetcher.start()
        events.emit(events.STARTED, topics=",".join(topics) or "-",
                    wakeup=self._waker.mode,
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
                self.health.wait_up(retry_delay(probes, self._rng))
                probes += 1
                if self._stop.is_set():
                    break
            else:
                probes = 0
            try:
                if self.health.up:
                    self.scheduler.check()
                found = self.fetcher.fetch_round()
                if (not found and self.options.burst and self.health.up
                        and not any(lane.busy() for lane in self.lanes)
                        and time.monotonic() >= self.settling.retry_due
                        and not self.settling.pending()):
                    # Nothing due, nothing running, no retry of ours still to come: drained.
                    if self.fetcher.drained():
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
                self._waker.found()
                delay = 0.0
                continue
            if not self.health.up:
                continue
            if not any(lane.want() > 0 for lane in self.lanes):
                # Every thread is busy: wait for one to finish, not for the database.
                self._slot_event.clear()
                if not any(lane.want() > 0 for lane in self.lanes):
                    if not self._slot_event.wait(min(0.5, self.scheduler.seconds_until_check())):
                        self._waker.busy()  # long jobs hold every thread: no need to be woken
                continue
            delay = self.options.poll.next_delay(delay, False, self._waker.listening)
            events.emit(events.IDLE, logging.DEBUG, wait_s=round(delay, 3))
            self.waiting.set()
            try:
                hits = self._waker.wait(min(delay, self.scheduler.seconds_until_check()))
            finally:
                self.waiting.clear()
            if hits:
                delay = 0.0

    # --- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stop.set()
        self.health.wake()
        events.emit(events.STOPPING, grace_s=self.options.grace_period_s)
        deadline = time.monotonic() + self.options.grace_period_s
        for lane in self.lanes:
            for job in lane.stop():
                self.settling.give_back(job.msg, charged=job.charged)
        finished = all([lane.wait_idle(deadline) for lane in self.lanes])  # noqa: C419 - wait for every lane
        if not finished:
            events.emit("grace_expired", logging.WARNING,
                        running=sum(lane.running for lane in self.lanes))
        # A fetch-ahead still in flight finds its lane stopped and gives its messages back
        # when it ends: wait for it, so those releases go out with the rest.
        self.fetcher.close(max(1.0, deadline - time.monotonic()))
        # Commit the settlements of everything that finished; if the database is still
        # unreachable, wait out the grace period, then leave them to their leases.
        self.settling.close(max(1.0, deadline - time.monotonic()))
        if self._waker is not None:
            self._waker.close()
        self.executor.close()
        self.running.clear()
        events.emit(events.STOPPED, **{k: v for k, v in sorted(self.stats.items())})
