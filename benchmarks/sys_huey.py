"""huey in the benchmark cases (SQLite only): SqliteHuey with its consumer as its docs run
it (`create_consumer(workers=c, worker_type="thread")`, default polling: 0.1 s growing by
1.15x to 10 s when idle). fsync=True is synchronous=FULL; NORMAL is set on each connection
huey opens. huey has no batch enqueue, so send_many is an enqueue loop. huey is
at-most-once: a task is removed from the queue when a worker takes it (no lease)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from huey import SqliteHuey
from huey.storage import SqliteStorage

from benchmarks.common import Target, idle_gaps, latency_summary, payload, split, timed_threads


class _NormalStorage(SqliteStorage):
    def _create_connection(self):  # type: ignore[no-untyped-def]
        conn = super()._create_connection()
        conn.execute("pragma synchronous=1")
        return conn


class _NormalHuey(SqliteHuey):
    storage_class = _NormalStorage


def _huey(t: Target) -> SqliteHuey:
    if t.synchronous.upper() == "NORMAL":
        return _NormalHuey("bench", filename=t.database)
    return SqliteHuey("bench", filename=t.database, fsync=True)


class _Probe:
    """The tasks and what they record (a counter and the last completion time)."""

    def __init__(self, huey: SqliteHuey, expect: int = 0) -> None:
        self.count = itertools.count(1)
        self.expect = expect
        self.finished = threading.Event()
        self.end = 0.0
        self.started: dict[int, float] = {}
        self.arrived = threading.Event()

        @huey.task(name="noop")
        def noop(n: int, **kw: Any) -> None:
            if next(self.count) == self.expect:
                self.end = time.perf_counter()
                self.finished.set()

        @huey.task(name="probe")
        def probe(n: int, **kw: Any) -> None:
            self.started[n] = time.perf_counter()
            self.arrived.set()

        self.noop, self.probe = noop, probe


def setup(t: Target) -> None:
    _huey(t).storage.conn  # noqa: B018 - opens the file and creates huey's tables


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]
    huey = _huey(t)
    probe = _Probe(huey, jobs)
    for i in range(jobs):
        probe.noop(**payload(i))
    consumer = huey.create_consumer(workers=c, worker_type="thread", periodic=False)
    t0 = time.perf_counter()
    consumer.start()
    if not probe.finished.wait(600):
        raise RuntimeError("huey did not finish within 600 s")
    consumer.stop(graceful=True)
    return {"rate": jobs / (probe.end - t0), "seconds": probe.end - t0}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n = p["messages"]
    huey = _huey(t)
    probe = _Probe(huey)
    probe.noop(**payload())
    t0 = time.perf_counter()
    for i in range(n):
        probe.noop(**payload(i))
    elapsed = time.perf_counter() - t0
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    huey = _huey(t)
    probe = _Probe(huey)
    probe.noop(**payload())
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            probe.noop(**payload(j))

    elapsed, _ = timed_threads(producers, produce)
    return {"rate": n / elapsed, "seconds": elapsed}


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    samples, gap = p["samples"], idle_gaps(p)
    huey = _huey(t)
    probe = _Probe(huey)
    consumer = huey.create_consumer(workers=1, worker_type="thread", periodic=False)
    consumer.start()
    time.sleep(0.5)
    out: list[float] = []
    for n in range(samples):
        probe.arrived.clear()
        probe.probe(**payload(n))
        sent = time.perf_counter()
        if not probe.arrived.wait(30):
            raise RuntimeError(f"huey pickup {n} not seen within 30 s")
        out.append(max(0.0, probe.started[n] - sent) * 1000)
        time.sleep(gap())
    consumer.stop(graceful=True)
    return latency_summary(out)


CASES = {"drain_worker": drain_worker, "send_many": send_many, "send_one": send_one,
         "pickup": pickup}
