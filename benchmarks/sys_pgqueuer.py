"""pgqueuer in the benchmark cases, used as its docs and its own benchmark tool do: asyncpg
driver (the one its docs recommend), one QueueManager per consumer with dequeue batches of
10, `mode=drain` to stop when the queue is empty, batch enqueue by lists."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from datetime import timedelta
from typing import Any

import asyncpg
from pgqueuer import Queries, QueueManager
from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
from pgqueuer.types import QueueExecutionMode

from benchmarks.common import FILL_BATCH, Target, idle_gaps, latency_summary, payload, split

ENTRY = "bench"
BATCH = 10
CTX = mp.get_context("fork")


async def _conn(t: Target) -> asyncpg.Connection:
    return await asyncpg.connect(host=t.host, port=t.port, user=t.user, database=t.database)


async def _install(t: Target) -> None:
    conn = await _conn(t)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


def setup(t: Target) -> None:
    asyncio.run(_install(t))


async def _fill(t: Target, n: int, entry: str = ENTRY) -> None:
    conn = await _conn(t)
    q = Queries(AsyncpgDriver(conn))
    for i in range(0, n, FILL_BATCH):
        k = min(FILL_BATCH, n - i)
        await q.enqueue([entry] * k, [json.dumps(payload(i + j)).encode() for j in range(k)],
                        [0] * k)
    await conn.close()


async def _drain(t: Target, consumers: int, entry: str = ENTRY) -> int:
    done = [0]
    qms = []
    for _ in range(consumers):
        qm = QueueManager(Queries(AsyncpgDriver(await _conn(t))))

        @qm.entrypoint(entry)
        async def noop(job: Any) -> None:
            done[0] += 1

        qms.append(qm)
    await asyncio.gather(*(qm.run(batch_size=BATCH, mode=QueueExecutionMode.drain,
                                  log_aggregation_interval=timedelta(0)) for qm in qms))
    return done[0]


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]
    asyncio.run(_fill(t, jobs))
    t0 = time.perf_counter()
    done = asyncio.run(_drain(t, c))
    elapsed = time.perf_counter() - t0
    if done != jobs:
        raise RuntimeError(f"pgqueuer drained {done} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, batch = p["messages"], p["batch"]
    items = [json.dumps(payload(i)).encode() for i in range(n)]

    async def run() -> float:
        conn = await _conn(t)
        q = Queries(AsyncpgDriver(conn))
        await q.enqueue([ENTRY] * batch, items[:batch], [0] * batch)  # warm
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            chunk = items[i:i + batch]
            await q.enqueue([ENTRY] * len(chunk), chunk, [0] * len(chunk))
        took = time.perf_counter() - t0
        await conn.close()
        return took

    elapsed = asyncio.run(run())
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """`producers` concurrent producers, each on its own connection (asyncio tasks)."""
    n, producers = p["messages"], p["producers"]
    body = json.dumps(payload()).encode()

    async def run() -> float:
        conns = [await _conn(t) for _ in range(producers)]
        qs = [Queries(AsyncpgDriver(c)) for c in conns]
        await qs[0].enqueue(ENTRY, body)  # warm

        async def produce(q: Queries, k: int) -> None:
            for _ in range(k):
                await q.enqueue(ENTRY, body)

        t0 = time.perf_counter()
        await asyncio.gather(*(produce(q, k) for q, k in zip(qs, split(n, producers),
                                                              strict=True)))
        took = time.perf_counter() - t0
        for c in conns:
            await c.close()
        return took

    elapsed = asyncio.run(run())
    return {"rate": n / elapsed, "seconds": elapsed}


def _load(t: Target, stop: Any, ready: Any) -> None:
    """Busy pickup's background: 4 QueueManagers draining entrypoint 'load' while it is
    refilled in batches (another process)."""

    async def run() -> None:
        await _fill(t, 2000, "load")
        ready.set()
        while not stop.is_set():
            await asyncio.gather(_drain(t, 4, "load"), _fill(t, 2000, "load"))

    asyncio.run(run())


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Enqueue returned -> handler started, ms, one idle QueueManager (LISTEN/NOTIFY)."""
    samples, busy, gap = p["samples"], p.get("busy", False), idle_gaps(p)
    started: dict[int, float] = {}
    load = stop = None
    if busy:
        stop, ready = CTX.Event(), CTX.Event()
        load = CTX.Process(target=_load, args=(t, stop, ready))
        load.start()
        ready.wait(60)
    out: list[float] = []

    async def run() -> None:
        arrived = asyncio.Event()
        qm = QueueManager(Queries(AsyncpgDriver(await _conn(t))))

        @qm.entrypoint("pickup")
        async def handle(job: Any) -> None:
            started[json.loads(job.payload)["n"]] = time.perf_counter()
            arrived.set()

        runner = asyncio.create_task(qm.run(batch_size=BATCH))
        producer = Queries(AsyncpgDriver(await _conn(t)))
        await asyncio.sleep(0.5)
        for n in range(samples):
            arrived.clear()
            await producer.enqueue("pickup", json.dumps(payload(n)).encode())
            sent = time.perf_counter()
            await asyncio.wait_for(arrived.wait(), 30)
            out.append(max(0.0, started[n] - sent) * 1000)
            await asyncio.sleep(gap())
        qm.shutdown.set()
        await asyncio.wait_for(runner, 30)

    # The measuring loop and the worker share one event loop, as an app's would; the
    # producer side is a plain await with no other work pending.
    try:
        asyncio.run(run())
    finally:
        if load is not None:
            stop.set()
            load.join(60)
    return latency_summary(out)


def _produce(t: Target, producers: int, seconds: float, out: Any) -> None:
    async def run() -> int:
        qs = [Queries(AsyncpgDriver(await _conn(t))) for _ in range(producers)]
        deadline = time.monotonic() + seconds

        async def produce(q: Queries) -> int:
            n = 0
            while time.monotonic() < deadline:
                await q.enqueue(ENTRY, json.dumps(payload(n, ts=time.time())).encode())
                n += 1
            return n

        return sum(await asyncio.gather(*(produce(q) for q in qs)))

    out.put(asyncio.run(run()))


def steady(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    seconds, producers, c = p["seconds"], p["producers"], p["concurrency"]
    lat: list[float] = []
    result: dict[str, Any] = {}

    async def run() -> None:
        qms = []
        for _ in range(c):
            qm = QueueManager(Queries(AsyncpgDriver(await _conn(t))))

            @qm.entrypoint(ENTRY)
            async def handle(job: Any) -> None:
                lat.append((time.time() - json.loads(job.payload)["ts"]) * 1000)

            qms.append(qm)
        runners = [asyncio.create_task(qm.run(batch_size=BATCH)) for qm in qms]
        await asyncio.sleep(0.5)
        out = CTX.Queue()
        proc = CTX.Process(target=_produce, args=(t, producers, seconds, out))
        t0 = time.perf_counter()
        proc.start()
        while proc.is_alive():
            await asyncio.sleep(0.05)
        sent = out.get(timeout=30)
        elapsed = time.perf_counter() - t0
        done = len(lat)
        result.update(rate=done / elapsed, sent_rate=sent / elapsed, backlog_at_end=sent - done)
        for qm in qms:
            qm.shutdown.set()
        await asyncio.wait_for(asyncio.gather(*runners), 60)

    asyncio.run(run())
    return {**result, **(latency_summary(lat) if lat else {})}


CASES = {"drain_worker": drain_worker, "send_many": send_many, "send_one": send_one,
         "pickup": pickup, "steady": steady}
