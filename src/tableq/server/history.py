"""The last hour of per-topic counts, sampled by one background thread, for the dashboard's
charts; the same thread forgets old idempotency records. The rates are pure functions of the
samples: differences of counts, as `tableq stats --watch` shows them (acked messages are only
counted with retention on; dead letters always)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tableq.errors import TableqError
from tableq.server.store import Store
from tableq.stats import TopicStats

if TYPE_CHECKING:
    from tableq.queue import Queue
    from tableq.server.settings import ServerConfig

log = logging.getLogger("tableq.server")
EXPIRE_EVERY_S = 600.0


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # Unix seconds (this host's clock: for drawing, not for decisions)
    stats: dict[str, TopicStats]


@dataclass(frozen=True, slots=True)
class Point:
    at: float
    done_per_min: float
    dead_per_min: float
    backlog: int
    in_flight: int


def points(samples: list[Sample], topic: str | None) -> list[Point]:
    """Per-interval rates between successive samples, for one topic or all (topic=None)."""
    def total(s: Sample) -> TopicStats:
        rows = [v for k, v in s.stats.items() if topic is None or k == topic]
        return TopicStats(topic or "*", sum(r.ready for r in rows),
                          sum(r.scheduled for r in rows), sum(r.in_flight for r in rows),
                          sum(r.dead for r in rows), None, sum(r.done for r in rows))

    out = []
    for before, after in zip(samples, samples[1:], strict=False):
        a, b = total(before), total(after)
        minutes = (after.at - before.at) / 60
        if minutes <= 0:
            continue
        out.append(Point(after.at, max(0, b.done - a.done) / minutes,
                         max(0, b.dead - a.dead) / minutes, b.live, b.in_flight))
    return out


class Sampler:
    def __init__(self, queue: Queue, config: ServerConfig) -> None:
        self._queue, self._config = queue, config
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=int(config.history_s / config.sample_interval_s) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tableq-server-history",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def take(self) -> None:
        rows = self._queue.stats()
        with self._lock:
            self._samples.append(Sample(time.time(), {s.topic: s for s in rows}))

    def _run(self) -> None:
        next_expiry = time.monotonic()
        while not self._stop.is_set():
            try:
                self.take()
                if time.monotonic() >= next_expiry:
                    gone = Store(self._queue).expire_idempotency(self._config.idempotency_ttl_s)
                    if gone:
                        log.info("tableq.server.idempotency_expired count=%d", gone)
                    next_expiry = time.monotonic() + EXPIRE_EVERY_S
            except TableqError as exc:
                log.warning("tableq.server.sample_failed error=%s", str(exc).splitlines()[0])
            self._stop.wait(self._config.sample_interval_s)
