"""The worker runtime: runs users' handlers reliably (concurrency, polling and NOTIFY
wake-up, leases and heartbeats, retries and dead-lettering, periodic jobs, shutdown) on top
of the Queue API. No SQL in this package."""

from tableq.worker.app import App
from tableq.worker.periodic import PeriodicJob
from tableq.worker.poller import PollPolicy
from tableq.worker.retry import Backoff
from tableq.worker.runner import Worker
from tableq.worker.spec import HandlerSpec, WorkerMode, WorkerOptions

__all__ = ["App", "Backoff", "HandlerSpec", "PeriodicJob", "PollPolicy", "Worker",
           "WorkerMode", "WorkerOptions"]
