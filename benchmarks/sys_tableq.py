"""tableq in the benchmark cases: the worker runtime, the library loop, sends, pickup
latency and the steady state, through tableq's public API only (App, connect, Queue)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

import tableq
from benchmarks.common import (
    FILL_BATCH,
    Target,
    idle_gaps,
    latency_summary,
    payload,
    split,
    timed_threads,
)

TOPIC = "bench"
CTX = mp.get_context("fork")


def _options(t: Target) -> dict[str, Any]:
    return {"synchronous": t.synchronous} if t.db == "sqlite" else {}


def connect(t: Target, **kw: Any) -> tableq.Queue:
    return tableq.connect(t.tableq_url, **_options(t), **kw)


def fill(q: tableq.Queue, n: int, topic: str = TOPIC, start: int = 0) -> None:
    for i in range(start, start + n, FILL_BATCH):
        q.send_many(topic, [payload(j) for j in range(i, min(start + n, i + FILL_BATCH))])


def setup(t: Target) -> None:
    connect(t, migrate=True).close()


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Burst worker (App.worker(burst=True)) draining `jobs` pre-filled no-op jobs."""
    jobs, c = p["jobs"], p["concurrency"]
    app = tableq.App(t.tableq_url, migrate=True, **_options(t))
    done = [0]

    @app.handler(TOPIC, concurrency=c)
    def noop(message: tableq.Message) -> None:
        done[0] += 1

    fill(app.queue, jobs)
    worker = app.worker(burst=True)
    t0 = time.perf_counter()
    worker.run()
    elapsed = time.perf_counter() - t0
    live = app.queue.stats(TOPIC)
    app.close()
    if live and live[0].live:
        raise RuntimeError(f"{live[0].live} jobs left after the burst worker returned")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def drain_loop(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """The library batch loop: receive(max=batch) + one ack_many, in `concurrency` threads
    sharing one Queue."""
    jobs, c, batch = p["jobs"], p["concurrency"], p.get("batch", 100)
    q = connect(t, migrate=True)
    fill(q, jobs)

    def loop(_: int) -> int:
        n = 0
        while True:
            msgs = q.receive(TOPIC, max=batch, visibility_timeout=60)
            if not msgs:
                return n
            q.ack_many(msgs)
            n += len(msgs)

    elapsed, counts = timed_threads(c, loop)
    q.close()
    if sum(counts) != jobs:
        raise RuntimeError(f"drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, batch = p["messages"], p["batch"]
    q = connect(t, migrate=True)
    items = [payload(i) for i in range(n)]
    q.send_many(TOPIC, items[:batch])  # warm: prepared statements, pool
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        q.send_many(TOPIC, items[i:i + batch])
    elapsed = time.perf_counter() - t0
    q.close()
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    q = connect(t, migrate=True)
    q.send(TOPIC, payload())  # warm
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            q.send(TOPIC, payload(j))

    elapsed, _ = timed_threads(producers, produce)
    q.close()
    return {"rate": n / elapsed, "seconds": elapsed}


def _load(url: str, options: dict[str, Any], stop: Any, ready: Any) -> None:
    """Background load for busy pickup: 4 worker threads draining topic 'load' while a
    producer keeps refilling it in batches (another process, so it has its own GIL)."""
    app = tableq.App(url, **options)

    @app.handler("load", concurrency=4)
    def noop(message: tableq.Message) -> None:
        pass

    worker = app.worker(["load"])
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    q = app.queue
    ready.set()
    while not stop.is_set():
        st = q.stats("load")
        if not st or st[0].ready < 2000:
            q.send_many("load", [payload(i) for i in range(500)])
        time.sleep(0.02)
    worker.stop()
    runner.join(30)
    app.close()


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Send committed -> handler started, in ms, for one idle worker (concurrency 1) on its
    own topic; with busy=True while 4 other workers drain another topic of the same queue."""
    samples, busy, notify = p["samples"], p.get("busy", False), p.get("notify", True)
    gap = idle_gaps(p)
    app = tableq.App(t.tableq_url, migrate=True, use_notify=notify, **_options(t))
    started: dict[int, float] = {}
    arrived = threading.Event()

    @app.handler("pickup", concurrency=1)
    def handle(message: tableq.Message) -> None:
        started[message.payload["n"]] = time.perf_counter()
        arrived.set()

    load = stop = None
    if busy:
        stop, ready = CTX.Event(), CTX.Event()
        load = CTX.Process(target=_load, args=(t.tableq_url, _options(t), stop, ready))
        load.start()
        ready.wait(60)
    worker = app.worker(["pickup"])
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    worker.running.wait(10)
    producer = connect(t)
    out: list[float] = []
    try:
        time.sleep(0.5)  # the worker settles into its idle wait
        for n in range(samples):
            arrived.clear()
            producer.send("pickup", payload(n))
            sent = time.perf_counter()  # send() returned: committed
            if not arrived.wait(30):
                raise RuntimeError(f"message {n} not picked up within 30 s")
            out.append(max(0.0, started[n] - sent) * 1000)
            time.sleep(gap())
    finally:
        worker.stop()
        runner.join(30)
        producer.close()
        app.close()
        if load is not None:
            stop.set()
            load.join(60)
    return latency_summary(out)


def _produce(url: str, options: dict[str, Any], producers: int, seconds: float,
             out: Any) -> None:
    q = tableq.connect(url, **options)
    deadline = time.monotonic() + seconds

    def produce(i: int) -> int:
        n = 0
        while time.monotonic() < deadline:
            q.send(TOPIC, payload(n, ts=time.time()))
            n += 1
        return n

    _, counts = timed_threads(producers, produce)
    q.close()
    out.put(sum(counts))


def steady(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Producers (single sends, as fast as they go, in their own process) and a worker at
    `concurrency` together for `seconds`: completed jobs/s and pickup (send -> start)."""
    seconds, producers, c = p["seconds"], p["producers"], p["concurrency"]
    app = tableq.App(t.tableq_url, migrate=True, **_options(t))
    lat: list[float] = []
    lock = threading.Lock()

    @app.handler(TOPIC, concurrency=c)
    def handle(message: tableq.Message) -> None:
        ms = (time.time() - message.payload["ts"]) * 1000
        with lock:
            lat.append(ms)

    worker = app.worker([TOPIC])
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    worker.running.wait(10)
    out = CTX.Queue()
    proc = CTX.Process(target=_produce, args=(t.tableq_url, _options(t), producers, seconds,
                                              out))
    t0 = time.perf_counter()
    proc.start()
    sent = out.get(timeout=seconds + 120)
    proc.join(30)
    # Completed within the window (jobs still queued at the end count as not done).
    elapsed = time.perf_counter() - t0
    done_in_window = len(lat)
    worker.stop()
    runner.join(30)
    app.close()
    summary = latency_summary(lat) if lat else {}
    return {"rate": done_in_window / elapsed, "sent_rate": sent / elapsed,
            "backlog_at_end": sent - done_in_window, **summary}


CASES = {"drain_worker": drain_worker, "drain_loop": drain_loop, "send_many": send_many,
         "send_one": send_one, "pickup": pickup, "steady": steady}
