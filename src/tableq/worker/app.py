"""The App: where users register handlers (`@app.handler(topic)`) and periodic jobs
(`app.every(...)`) and start workers (`app.run_worker()`). It opens its Queue lazily, so an
App can be imported, forked or configured before any connection exists. No SQL."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from tableq.errors import ConfigurationError, InvalidArgument
from tableq.message import OnDuplicate, SendResult
from tableq.names import check_topic
from tableq.queue import Queue, seconds
from tableq.url import DEFAULT_URL, redact
from tableq.worker.periodic import PeriodicJob
from tableq.worker.poller import POLL_INTERVAL_MIN_S, PollPolicy
from tableq.worker.retry import Backoff
from tableq.worker.runner import Worker
from tableq.worker.spec import MODES, HandlerSpec, WorkerMode, WorkerOptions

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_CONCURRENCY = 8
DEFAULT_GRACE_PERIOD_S = 30.0
URL_ENV = "TABLEQ_URL"


def _count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a whole number >= 1, not {value!r}")
    return value


def _concurrency(value: object) -> tuple[int, int]:
    """`8` means 1..8 threads, growing with the backlog; `(2, 8)` keeps at least 2."""
    if isinstance(value, tuple) and len(value) == 2:
        lo, hi = _count("concurrency minimum", value[0]), _count("concurrency maximum", value[1])
        if lo > hi:
            raise InvalidArgument(f"concurrency (min, max) needs min <= max, not {value!r}")
        return lo, hi
    if isinstance(value, tuple):
        raise InvalidArgument(f"concurrency takes a number or a (min, max) pair, not {value!r}")
    return 1, _count("concurrency", value)


class App:
    """Handlers and periodic jobs of one application, on one queue database.

    `app = tableq.App("postgresql://...")`, or `App()` for $TABLEQ_URL or the embedded
    SQLite file. Extra keyword arguments go to tableq.connect() (max_attempts,
    visibility_timeout, migrate, ...). Worker settings: poll_interval_min/max (adaptive
    polling; the max defaults to 2 s with a NOTIFY or SQLite listener and 0.08 s without
    one), grace_period (shutdown), prefetch (messages always fetched beyond free
    threads), prefetch_wait (fetch ahead what the threads start within this many seconds;
    0 fetches only for free threads, so a worker killed -9 never holds unstarted messages),
    use_notify (PostgreSQL LISTEN/NOTIFY wake-up)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        queue: Queue | None = None,
        poll_interval_min: float = POLL_INTERVAL_MIN_S,
        poll_interval_max: float | None = None,
        grace_period: float | timedelta = DEFAULT_GRACE_PERIOD_S,
        prefetch: int = 0,
        prefetch_wait: float = 0.5,
        use_notify: bool = True,
        **connect_options: Any,
    ) -> None:
        if queue is not None and (url is not None or connect_options):
            raise InvalidArgument("pass either queue= or a url (and connect options), not both")
        self._url = url
        self._queue = queue
        self._connect_options = connect_options
        self._lock = threading.Lock()
        self.poll = PollPolicy(seconds("poll_interval_min", poll_interval_min, 0.0),
                               None if poll_interval_max is None else
                               seconds("poll_interval_max", poll_interval_max, 0.0))
        self.grace_period_s = seconds("grace_period", grace_period, DEFAULT_GRACE_PERIOD_S)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgument(f"prefetch must be a whole number >= 0, not {prefetch!r}")
        self.prefetch = prefetch
        self.prefetch_wait_s = seconds("prefetch_wait", prefetch_wait, 0.5)
        self.use_notify = bool(use_notify)
        self.handlers: dict[str, HandlerSpec] = {}
        self.periodic: dict[str, PeriodicJob] = {}

    def __repr__(self) -> str:
        return f"<tableq.App {redact(self.url)!r} handlers={sorted(self.handlers)}>"

    # --- the database -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._queue is not None:
            return str(self._queue.where)
        return self._url or os.environ.get(URL_ENV) or DEFAULT_URL

    @property
    def migrates(self) -> bool:
        """Whether the App applies migrations when it connects (App(migrate=True))."""
        return bool(self._connect_options.get("migrate"))

    def use_url(self, url: str) -> None:
        """Points the App at another database (the CLI's --url); only before it connects."""
        with self._lock:
            if self._queue is not None:
                raise ConfigurationError("this App is already connected; set its URL before "
                                         "it is used")
            self._url = url

    def use_queue(self, queue: Any) -> None:
        """Runs the App on `queue` instead of its URL: a Queue, or any object with the
        Queue methods a worker uses, such as tableq.client.Client (`tableq worker --api`).
        Only before it connects."""
        with self._lock:
            if self._queue is not None:
                raise ConfigurationError("this App is already connected; give it a queue "
                                         "before it is used")
            self._queue = queue

    @property
    def queue(self) -> Queue:
        """The App's Queue, connected on first use."""
        with self._lock:
            if self._queue is None:
                import tableq

                self._queue = tableq.connect(self.url, **self._connect_options)
            return self._queue

    def close(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._queue.close()
                self._queue = None

    def send(self, topic: str, payload: Any, *, key: str | None = None,
             kind: str | None = None, headers: Mapping[str, str] | None = None,
             priority: int = 0, delay: float | timedelta | None = None,
             at: datetime | None = None, on_duplicate: OnDuplicate = "ignore",
             connection: Any = None) -> SendResult:
        """Shortcut for app.queue.send()."""
        return self.queue.send(topic, payload, key=key, kind=kind, headers=headers,
                               priority=priority, delay=delay, at=at,
                               on_duplicate=on_duplicate, connection=connection)

    # --- registration ---------------------------------------------------------------------------

    def handler(
        self,
        topic: str,
        *,
        max_attempts: int | None = None,
        visibility_timeout: float | timedelta | None = None,
        retry: Backoff | None = None,
        mode: WorkerMode = "at_least_once",
        concurrency: int | tuple[int, int] = DEFAULT_CONCURRENCY,
        timeout: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Registers `f(message)` (or `async def f(message)`) for `topic`. A return means
        success (ack); an exception means failure (retry after `retry`'s delay, dead-letter
        after `max_attempts` deliveries). Defaults come from the queue: max_attempts 5,
        visibility_timeout 30 s."""
        check_topic(topic)
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {MODES}, not {mode!r}")
        if max_attempts is not None:
            _count("max_attempts", max_attempts)
        if retry is not None and not isinstance(retry, Backoff):
            raise InvalidArgument("retry= takes tableq.Backoff(base=1, factor=2, max=300, "
                                  f"jitter=True), not {type(retry).__name__}")
        cmin, cmax = _concurrency(concurrency)
        vt = None if visibility_timeout is None else seconds(
            "visibility_timeout", visibility_timeout, 30.0)
        if vt is not None and vt <= 0:
            raise InvalidArgument("visibility_timeout must be > 0 seconds")
        timeout_s = None if timeout is None else seconds("timeout", timeout, 0.0)
        if timeout_s is not None and (timeout_s <= 0 or math.isinf(timeout_s)):
            raise InvalidArgument("timeout must be > 0 seconds, or None for no limit")

        def register(fn: F) -> F:
            if not callable(fn):
                raise InvalidArgument(f"@app.handler({topic!r}) must decorate a function")
            if topic in self.handlers:
                raise ConfigurationError(
                    f"topic {topic!r} already has a handler "
                    f"({getattr(self.handlers[topic].fn, '__qualname__', '?')}); one handler "
                    "per topic: dispatch on message.kind inside it")
            self.handlers[topic] = HandlerSpec(
                topic=topic, fn=fn, max_attempts=max_attempts,
                visibility_timeout_s=vt if vt is not None else -1.0,
                retry=retry if retry is not None else Backoff(), mode=mode,
                concurrency_min=cmin, concurrency_max=cmax, timeout_s=timeout_s)
            return fn
        return register

    def every(
        self,
        name: str,
        *,
        cron: str | None = None,
        seconds: float | None = None,
        payload: Any = None,
        topic: str | None = None,
        priority: int = 0,
    ) -> None:
        """Enqueues `payload` on `topic` (default: `name`) once per tick of `cron` or every
        `seconds`, however many workers run; ticks follow the database clock. The message is
        sent ahead, scheduled at its tick, with headers tableq-tick and tableq-periodic."""
        check_topic(name)
        if name in self.periodic:
            raise ConfigurationError(f"a periodic job named {name!r} already exists")
        self.periodic[name] = PeriodicJob(name=name, topic=topic or name, cron=cron,
                                          seconds=seconds, payload=payload, priority=priority)

    # --- running ----------------------------------------------------------------------------------

    def check(self, topics: Sequence[str] | None = None) -> None:
        """Fails fast, with the database's own error (unreachable, not migrated) or a topic
        with no handler, instead of letting a worker start and retry forever (or N children
        fail one after the other). Cheap: one clock read, one index probe."""
        if topics:
            self._specs(topics)
        q = self.queue
        q.now()
        chosen = list(topics) if topics else list(self.handlers) or [
            j.topic for j in self.periodic.values()]
        if chosen:
            q.peek(chosen[0], 1)

    def _await_database(self, topics: Sequence[str] | None) -> None:
        """check(), for a supervised child: its supervisor already checked, so an outage now
        (a child replaced while the database is down) is waited out, logged once, instead of
        exiting at once until the supervisor gives up on the crash loop."""
        import random

        from tableq.errors import TableqError
        from tableq.worker.health import Health, retry_delay

        health, rng, attempt = Health(), random.Random(), 0
        while True:
            try:
                self.check(topics)
            except TableqError as exc:
                if not health.failed(exc, "start"):
                    raise
                health.wait_up(retry_delay(attempt, rng))
                attempt += 1
                continue
            health.ok()
            return

    def _specs(self, topics: Iterable[str] | None) -> list[HandlerSpec]:
        import dataclasses

        if topics is None:
            chosen = list(self.handlers)
        else:
            chosen = list(dict.fromkeys(topics))
            missing = [t for t in chosen if t not in self.handlers]
            if missing:
                raise ConfigurationError(
                    f"no handler for topic(s) {missing}; this app handles "
                    f"{sorted(self.handlers) or 'nothing yet'}")
        vt_default = self.queue.visibility_timeout_s
        out = []
        for t in chosen:
            spec = self.handlers[t]
            if spec.visibility_timeout_s < 0:
                spec = dataclasses.replace(spec, visibility_timeout_s=vt_default)
            out.append(spec)
        return out

    def worker(
        self,
        topics: Sequence[str] | None = None,
        *,
        concurrency: int | None = None,
        burst: bool = False,
        prefetch: int | None = None,
        grace_period: float | None = None,
        periodic: bool = True,
        exit_on_timeout: bool = False,
    ) -> Worker:
        """A Worker for these topics (default: all with handlers), not yet running: call
        .run() (blocks until .stop() or, with burst, until drained)."""
        if concurrency is not None:
            _count("concurrency", concurrency)
        options = WorkerOptions(
            concurrency=concurrency, burst=burst,
            prefetch=self.prefetch if prefetch is None else prefetch,
            prefetch_wait_s=self.prefetch_wait_s,
            grace_period_s=self.grace_period_s if grace_period is None else grace_period,
            poll=self.poll, use_listener=self.use_notify, exit_on_timeout=exit_on_timeout)
        jobs = list(self.periodic.values()) if periodic and not burst else []
        return Worker(self.queue, self._specs(topics), jobs, options)

    def run_worker(
        self,
        topics: Sequence[str] | None = None,
        concurrency: int | None = None,
        burst: bool = False,
        *,
        processes: int | None = None,
        install_signals: bool = True,
        prefetch: int | None = None,
        grace_period: float | None = None,
        exit_on_timeout: bool = False,
    ) -> int:
        """Runs handlers until SIGTERM/SIGINT (graceful: running handlers get the grace
        period, fetched-but-unstarted messages are released; a second signal exits at once)
        or, with burst=True, until no message is due, none is running and every retry this
        worker scheduled has come due and been run. processes=N runs N
        worker processes (fork) for CPU-bound handlers. Returns an exit code (0 = clean)."""
        from tableq.worker import supervisor

        if processes is not None and _count("processes", processes) > 1:
            import multiprocessing

            if self._queue is not None:
                raise ConfigurationError("run_worker(processes=N) must start before the App "
                                         "connects (children cannot share its connections)")
            self.check(topics)
            self.close()  # children open their own connections
            ctx = multiprocessing.get_context("fork")

            def start(_: int) -> supervisor.Child:
                p = ctx.Process(target=self._child_main, args=(
                    topics, concurrency, burst, prefetch, grace_period, os.getpid()),
                    daemon=False)
                p.start()
                return supervisor.ProcessChild(p)
            return supervisor.supervise(start, processes, burst=burst,
                                        install_signals=install_signals)
        if os.environ.get(supervisor.PARENT_ENV):
            self._await_database(topics)
        else:
            self.check(topics)
        worker = self.worker(topics, concurrency=concurrency, burst=burst, prefetch=prefetch,
                             grace_period=grace_period, exit_on_timeout=exit_on_timeout)
        supervisor.run_foreground(worker, install_signals=install_signals)
        return supervisor.EXIT_RESTART if worker.restart_requested else 0

    def _child_main(self, topics: Any, concurrency: Any, burst: bool, prefetch: Any,
                    grace_period: Any, parent: int) -> None:
        from tableq.worker import supervisor

        supervisor.detach_from_terminal_signals()
        os.environ[supervisor.PARENT_ENV] = str(parent)
        code = self.run_worker(topics, concurrency, burst, prefetch=prefetch,
                               grace_period=grace_period, exit_on_timeout=True)
        self.close()
        os._exit(code)
