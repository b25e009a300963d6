"""kombu's SQLAlchemy transport in the benchmark cases (SQLite and MariaDB): SimpleQueue
put/get/ack as kombu's docs show, one Connection per thread. On SQLite it runs with
SQLAlchemy's defaults (rollback journal, synchronous FULL): the transport offers no hook
for PRAGMAs, so it is only measured beside SQLite FULL. get(block=True) polls at the
transport's default interval."""

from __future__ import annotations

import threading
import time
from typing import Any

from kombu import Connection

from benchmarks.common import Target, idle_gaps, latency_summary, payload, split, timed_threads

QUEUE = "bench"


def _conn(t: Target) -> Connection:
    return Connection("sqla+" + t.sqlalchemy_url)


def setup(t: Target) -> None:
    with _conn(t) as c:
        c.SimpleQueue(QUEUE).close()


def _fill(t: Target, n: int) -> None:
    with _conn(t) as c:
        q = c.SimpleQueue(QUEUE)
        for i in range(n):
            q.put(payload(i))
        q.close()


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]
    _fill(t, jobs)
    conns = [_conn(t) for _ in range(c)]
    queues = [x.SimpleQueue(QUEUE) for x in conns]

    def consume(i: int) -> int:
        n = 0
        while True:
            try:
                msg = queues[i].get(block=False)
            except queues[i].Empty:
                return n
            msg.ack()
            n += 1

    elapsed, counts = timed_threads(c, consume)
    for q, x in zip(queues, conns, strict=True):
        q.close()
        x.release()
    if sum(counts) != jobs:
        raise RuntimeError(f"kombu drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    conns = [_conn(t) for _ in range(producers)]
    queues = [x.SimpleQueue(QUEUE) for x in conns]
    queues[0].put(payload())
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            queues[i].put(payload(j))

    elapsed, _ = timed_threads(producers, produce)
    for q, x in zip(queues, conns, strict=True):
        q.close()
        x.release()
    return {"rate": n / elapsed, "seconds": elapsed}


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    samples, gap = p["samples"], idle_gaps(p)
    started: dict[int, float] = {}
    arrived = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []
    with _conn(t) as c:  # declare the queue once, before two sessions race to create it
        c.SimpleQueue("pickup").close()

    def consume() -> None:
        try:
            with _conn(t) as c:
                q = c.SimpleQueue("pickup")
                while not stop.is_set():
                    try:
                        msg = q.get(block=True, timeout=1)
                    except q.Empty:
                        continue
                    started[msg.payload["n"]] = time.perf_counter()
                    msg.ack()
                    arrived.set()
                q.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the measuring loop
            errors.append(exc)
            arrived.set()

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    out: list[float] = []
    with _conn(t) as c:
        q = c.SimpleQueue("pickup")
        time.sleep(0.5)
        for n in range(samples):
            arrived.clear()
            q.put(payload(n))
            sent = time.perf_counter()
            if not arrived.wait(30) or errors:
                raise RuntimeError(f"kombu pickup {n} not seen within 30 s") from (
                    errors[0] if errors else None)
            out.append(max(0.0, started[n] - sent) * 1000)
            time.sleep(gap())
        q.close()
    stop.set()
    th.join(10)
    return latency_summary(out)


CASES = {"drain_worker": drain_worker, "send_one": send_one, "pickup": pickup}
