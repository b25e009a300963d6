"""Periodic jobs: one message per tick, however many workers run. Ticks are computed from the
database clock (q.now()), never the host's.

How "exactly one per tick" holds: every worker enqueues the *next* tick ahead of time, as a
message scheduled at the tick (`at=tick`) with a key derived from the tick. Until the tick
comes, that message is live but not yet due, so every other worker's send of the same key is
a duplicate and is ignored. A worker does not send a tick closer than `margin` ahead, so its
send cannot arrive after the tick's message was already delivered and acked. The cost: a
tick is only enqueued by workers that were running at least `margin` before it. No SQL: the
decisions are pure functions and sending goes through the Queue API."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tableq.errors import InvalidArgument, TableqError
from tableq.names import check_topic
from tableq.worker import events
from tableq.worker.health import Health

TICK_HEADER = "tableq-tick"
JOB_HEADER = "tableq-periodic"


@dataclass(frozen=True, slots=True)
class PeriodicJob:
    name: str
    topic: str
    cron: str | None
    seconds: float | None
    payload: Any = None
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.seconds is None):
            raise InvalidArgument(f"every({self.name!r}) takes exactly one of cron='*/5 * * * *' "
                                  "or seconds=300")
        if self.seconds is not None and (isinstance(self.seconds, bool) or not isinstance(
                self.seconds, (int, float)) or not math.isfinite(self.seconds)
                or self.seconds < 1):
            raise InvalidArgument(f"every({self.name!r}): seconds must be a number >= 1, "
                                  f"not {self.seconds!r}")
        if self.cron is not None:
            from croniter import croniter

            if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
                raise InvalidArgument(f"every({self.name!r}): {self.cron!r} is not a valid cron "
                                      "expression, e.g. '*/5 * * * *' (minute hour day month "
                                      "weekday)")
        check_topic(self.topic)

    def period_s(self, now: datetime) -> float:
        """The length of the current tick interval (for cron, the gap after the next tick)."""
        if self.seconds is not None:
            return float(self.seconds)
        first = next_tick(self, now)
        return (next_tick(self, first) - first).total_seconds()


def next_tick(job: PeriodicJob, now: datetime) -> datetime:
    """The first tick strictly after `now` (aware UTC). Interval ticks are aligned to the Unix
    epoch, so every worker computes the same ticks."""
    now = now.astimezone(UTC)
    if job.seconds is not None:
        ts = now.timestamp()
        n = math.floor(ts / job.seconds) + 1
        return datetime.fromtimestamp(n * job.seconds, UTC)
    from croniter import croniter

    nxt: datetime = croniter(job.cron, now).get_next(datetime)
    return nxt if nxt.tzinfo else nxt.replace(tzinfo=UTC)


def tick_key(job: PeriodicJob, tick: datetime) -> str:
    return f"every:{job.name}@{tick.astimezone(UTC).isoformat(timespec='milliseconds')}"


def send_margin_s(period_s: float) -> float:
    """How close to a tick a worker still enqueues it (see the module docstring)."""
    return min(1.0, period_s / 4.0)


def check_interval_s(period_s: float) -> float:
    """How often a worker looks at the clock: a few times inside each send window."""
    return max(0.05, min(1.0, period_s / 4.0))


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scheduler check decided for one job."""

    tick: datetime
    send: bool


def plan(job: PeriodicJob, now: datetime) -> Plan:
    tick = next_tick(job, now)
    return Plan(tick, (tick - now).total_seconds() >= send_margin_s(job.period_s(now)))


class Scheduler:
    """Runs inside a worker's fetch loop: every check interval, enqueue each job's next tick
    (deduplicated across workers by its key)."""

    def __init__(self, queue: Any, jobs: list[PeriodicJob], health: Health | None = None) -> None:
        self._queue = queue
        self._jobs = jobs
        self._health = health if health is not None else Health()
        self._next_check = 0.0  # monotonic
        self._sent: dict[str, datetime] = {}
        self._next_due_mono: float | None = None

    @property
    def active(self) -> bool:
        return bool(self._jobs)

    def seconds_until_check(self) -> float:
        if not self._jobs:
            return math.inf
        left = self._next_check - time.monotonic()
        if self._next_due_mono is not None:
            # Wake when a tick becomes due too, so it is picked up on time while idle.
            left = min(left, self._next_due_mono - time.monotonic())
        return max(0.0, left)

    def check(self) -> None:
        if not self._jobs or time.monotonic() < self._next_check:
            return
        try:
            now = self._queue.now()
        except TableqError as exc:
            if not self._health.failed(exc, "periodic"):  # an outage is logged once, there
                events.emit("periodic_failed", 30, error=str(exc).splitlines()[0])
            self._next_check = time.monotonic() + 1.0
            return
        mono = time.monotonic()
        soonest = math.inf
        due_soonest = math.inf
        for job in self._jobs:
            p = plan(job, now)
            period = job.period_s(now)
            soonest = min(soonest, check_interval_s(period))
            due_soonest = min(due_soonest, (p.tick - now).total_seconds())
            if p.send and self._sent.get(job.name) != p.tick:
                self._enqueue(job, p.tick)
        self._next_check = mono + soonest
        self._next_due_mono = mono + due_soonest + 0.01 if math.isfinite(due_soonest) else None

    def _enqueue(self, job: PeriodicJob, tick: datetime) -> None:
        stamp = tick.isoformat(timespec="milliseconds")
        try:
            result = self._queue.send(
                job.topic, job.payload, key=tick_key(job, tick), at=tick,
                priority=job.priority, on_duplicate="ignore",
                headers={TICK_HEADER: stamp, JOB_HEADER: job.name},
            )
        except TableqError as exc:
            if not self._health.failed(exc, "periodic"):
                events.emit("periodic_failed", 30, job=job.name, tick=stamp,
                            error=str(exc).splitlines()[0])
            return
        self._sent[job.name] = tick
        if result.status == "sent":
            events.emit(events.ENQUEUED, job=job.name, topic=job.topic, id=result.id, tick=stamp)


