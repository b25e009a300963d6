"""When to look for work next: the pure adaptive-polling rule, and the Waker that sleeps
until the next poll or until the Queue's listener hints that a message became due
(PostgreSQL LISTEN/NOTIFY; SQLite's commit counter, which names no topic). A hint only cuts
latency; correctness comes from polling, so a lost one delays work by at most one poll
interval. No SQL: the listener comes from the Queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tableq.errors import InvalidArgument, TableqError
from tableq.names import ANY_TOPIC
from tableq.worker import events

POLL_INTERVAL_MIN_S = 0.01
POLL_INTERVAL_MAX_S = 2.0  # with a listener: its hints end the wait, polling is the safety net
# Polling alone (MariaDB, use_notify=False): a send waits no longer than this, so that the
# p99 pickup (this plus a claim) stays under 100 ms; 0.01 s doubled three times.
POLLING_INTERVAL_MAX_S = 0.08
LISTEN_SLICE_S = 0.25  # how long one listener wait may block a stop request
LISTEN_RETRY_S = 5.0  # after losing the LISTEN connection, try a new one this often


@dataclass(frozen=True, slots=True)
class PollPolicy:
    """Drain without sleeping while receives find work; when they come back empty, wait
    `interval_min_s`, then twice as long each time, up to `interval_max_s`. Left unset (None),
    the cap depends on how the worker hears of new work: POLL_INTERVAL_MAX_S with a listener
    (PostgreSQL's NOTIFY, SQLite's commit counter), POLLING_INTERVAL_MAX_S when polling is all
    it has, so that an idle worker still picks a send up within about that long."""

    interval_min_s: float = POLL_INTERVAL_MIN_S
    interval_max_s: float | None = None
    factor: float = 2.0

    def __post_init__(self) -> None:
        top = self.interval_min_s if self.interval_max_s is None else self.interval_max_s
        if not 0 < self.interval_min_s <= top:
            raise InvalidArgument(
                "poll intervals must satisfy 0 < poll_interval_min <= poll_interval_max, not "
                f"{self.interval_min_s} and {self.interval_max_s}")
        if self.factor < 1:
            raise InvalidArgument(f"poll factor must be >= 1, not {self.factor}")

    def cap(self, listening: bool) -> float:
        """The longest wait between polls, for a worker with or without a listener."""
        if self.interval_max_s is not None:
            return self.interval_max_s
        default = POLL_INTERVAL_MAX_S if listening else POLLING_INTERVAL_MAX_S
        return max(self.interval_min_s, default)

    def next_delay(self, previous_s: float, found_work: bool, listening: bool = True) -> float:
        if found_work:
            return 0.0
        if previous_s <= 0:
            return self.interval_min_s
        return min(self.cap(listening), max(self.interval_min_s, previous_s * self.factor))


class Waker:
    """Sleeps between polls. With a listener (PostgreSQL, SQLite), a hint for one of our
    topics (or for any topic) ends the sleep early; `wake()` ends it from another thread
    (stop, a freed slot)."""

    def __init__(self, queue: Any, topics: Collection[str], *, use_listener: bool = True,
                 health: Any = None) -> None:
        self._topics = set(topics)
        self._event = threading.Event()
        self._listener: Any = None
        self._queue = queue
        self._use_listener = use_listener
        self._retry_at: float | None = None
        self._found = 0  # fetches that found work since the last wait
        # The worker's Health: a listener lost to an outage it already logged is no news.
        self._health = health
        self._outages_seen = self._outages()
        if use_listener:
            self._listener = _open_listener(queue, self._topics)

    def _outages(self) -> int:
        return getattr(self._health, "outages", 0) + getattr(self._health, "blips", 0)

    @property
    def listening(self) -> bool:
        return self._listener is not None

    @property
    def mode(self) -> str:
        """How an idle worker learns of work: the listener's kind, or "polling"."""
        return str(getattr(self._listener, "wakeup", "notify")) if self.listening else "polling"

    def wake(self) -> None:
        self._event.set()

    def found(self) -> None:
        """A fetch found work. From the second since the last wait the worker is draining,
        not making a lone pickup (which would pay the listener two round trips for nothing)."""
        self._found += 1
        if self._found == 2:
            self.busy()

    def busy(self) -> None:
        """The worker is busy: while it is, sends need not notify (PostgreSQL). The next
        wait() says it waits again, and answers at once so that the worker looks."""
        if self._listener is not None:
            try:
                self._listener.pause()
            except Exception as exc:  # noqa: BLE001 - a hint source may fail in any way
                self._lost(exc)

    def wait(self, timeout_s: float) -> set[str]:
        """Sleeps up to timeout_s; returns our topics that were notified (maybe empty)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        hits: set[str] = set()
        self._found = 0
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            self._retry_at = None
            self._listener = _open_listener(self._queue, self._topics)
            if self._listener is None:
                self._retry_at = time.monotonic() + LISTEN_RETRY_S
            else:
                events.emit("listener_restored")
                # What was sent while it was gone notified nobody: look once.
                self._event.clear()
                return set(self._topics)
        while True:
            left = deadline - time.monotonic()
            if self._event.is_set() or left <= 0:
                break
            if self._listener is None:
                self._event.wait(left)
                continue
            try:
                got = self._listener.wait(min(left, LISTEN_SLICE_S))
            except Exception as exc:  # noqa: BLE001 - a hint source may fail in any way
                self._lost(exc)
                continue
            hits = set(self._topics) if ANY_TOPIC in got else {t for t in got if t in self._topics}
            if hits:
                break
        self._event.clear()
        return hits

    def _lost(self, exc: Exception) -> None:
        """A dead LISTEN connection must not stop the worker: fall back to polling."""
        seen, self._outages_seen = self._outages_seen, self._outages()
        explained = seen != self._outages_seen or not getattr(self._health, "up", True)
        events.emit("listener_lost", 20 if explained else 30,
                    error=(str(exc).splitlines() or [type(exc).__name__])[0],
                    retry_in_s=LISTEN_RETRY_S)
        self._close_listener()
        self._retry_at = time.monotonic() + LISTEN_RETRY_S

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection may fail
                events.emit("listener_close_failed", 10, error=type(exc).__name__)
            self._listener = None

    def close(self) -> None:
        self._close_listener()


def _open_listener(queue: Any, topics: Collection[str]) -> Any:
    make = getattr(queue, "listener", None)
    if make is None:
        return None
    try:
        return make(sorted(topics))
    except TableqError as exc:
        events.emit("listener_unavailable", 30, error=str(exc).splitlines()[0])
        return None
