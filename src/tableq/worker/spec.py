"""What a worker runs and how: a registered handler's spec and the worker's options (frozen
values shared by the runner, its lanes and the App). No SQL, no behaviour."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tableq.message import Message
from tableq.worker.poller import PollPolicy
from tableq.worker.retry import Backoff

WorkerMode = Literal["at_least_once", "at_most_once", "exactly_once"]
"""How a handler's messages are delivered: leased then acked (at_least_once), removed as they
are received (at_most_once), or received, handled and acked in one database transaction with
the handler's own writes (exactly_once)."""
MODES: tuple[WorkerMode, ...] = get_args(WorkerMode)


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
