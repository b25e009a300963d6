"""Prometheus metrics of one server: per-topic depth, in flight, dead and oldest age read
from q.stats() at scrape time (cached briefly, so many scrapers cost one query), counters of
what went through this server, and request latencies. One registry per app, never the global
one, so several apps in a process do not collide."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from tableq.stats import TopicStats

STATS_CACHE_S = 1.0
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25)


class _QueueCollector:
    """Reads the queue's per-topic stats when scraped."""

    def __init__(self, stats: Callable[[], list[TopicStats]]) -> None:
        self._stats = stats
        self._lock = threading.Lock()
        self._cached: tuple[float, list[TopicStats]] | None = None
        self.errors = 0

    def current(self) -> list[TopicStats]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > STATS_CACHE_S:
                self._cached = (now, self._stats())
            return self._cached[1]

    def describe(self) -> list[Metric]:
        # Names only: registering must not query the database.
        return [GaugeMetricFamily(name, "") for name in (
            "tableq_database_up", "tableq_ready_messages", "tableq_scheduled_messages",
            "tableq_in_flight_messages", "tableq_dead_messages",
            "tableq_oldest_ready_age_seconds")]

    def collect(self) -> Iterator[Metric]:
        families = {
            "ready": GaugeMetricFamily("tableq_ready_messages", "Messages due now, per topic",
                                       labels=["topic"]),
            "scheduled": GaugeMetricFamily("tableq_scheduled_messages",
                                           "Messages due later, per topic", labels=["topic"]),
            "in_flight": GaugeMetricFamily("tableq_in_flight_messages",
                                           "Messages leased to a receiver", labels=["topic"]),
            "dead": GaugeMetricFamily("tableq_dead_messages", "Messages in the dead-letter "
                                      "store", labels=["topic"]),
            "oldest_ready_age": GaugeMetricFamily(
                "tableq_oldest_ready_age_seconds", "Age of the oldest ready message (0 when "
                "none is ready)", labels=["topic"]),
        }
        up = GaugeMetricFamily("tableq_database_up", "1 when the last stats query succeeded")
        try:
            rows = self.current()
            up.add_metric([], 1)
        except Exception:  # noqa: BLE001 - a scrape must report the outage, not fail
            self.errors += 1
            rows = []
            up.add_metric([], 0)
        for s in rows:
            for name, family in families.items():
                value = getattr(s, name)
                family.add_metric([s.topic], float(value or 0))
        yield up
        yield from families.values()


class Metrics:
    def __init__(self, stats: Callable[[], list[TopicStats]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.queue = _QueueCollector(stats)
        self.registry.register(self.queue)
        self.sent = Counter("tableq_sent", "Messages sent through this server", ["topic"],
                            registry=self.registry)
        self.acked = Counter("tableq_acked", "Messages acked through this server", ["topic"],
                             registry=self.registry)
        self.failed = Counter("tableq_failed", "Messages nacked (failed, to be retried) "
                              "through this server", ["topic"], registry=self.registry)
        self.dead_lettered = Counter("tableq_dead_lettered", "Messages dead-lettered through "
                                     "this server", ["topic"], registry=self.registry)
        self.received = Counter("tableq_received", "Messages received through this server",
                                ["topic"], registry=self.registry)
        self.requests = Histogram("tableq_http_request_duration_seconds",
                                  "HTTP request latency by route", ["method", "route", "status"],
                                  buckets=LATENCY_BUCKETS_S, registry=self.registry)

    def exposition(self, visible: Callable[[str], bool]) -> bytes:
        """The text format, with per-topic series only for topics `visible` allows."""
        return generate_latest(_Scoped(self.registry, visible))


class _Scoped:
    def __init__(self, registry: CollectorRegistry, visible: Callable[[str], bool]) -> None:
        self._registry, self._visible = registry, visible

    def collect(self) -> Iterator[Any]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples
                              if "topic" not in s.labels or self._visible(s.labels["topic"])]
            yield metric
