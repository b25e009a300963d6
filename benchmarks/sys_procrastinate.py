"""procrastinate in the benchmark cases, used as its docs describe: PsycopgConnector, async
no-op tasks, one worker with `concurrency=c` (`wait=False` stops it when the queue is
caught up), LISTEN/NOTIFY on (its default), batch_defer_async for batches."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import procrastinate

from benchmarks.common import FILL_BATCH, Target, idle_gaps, latency_summary, payload, split

QUEUE = "bench"


def _app(t: Target) -> tuple[procrastinate.App, dict[str, Any]]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=t.dsn))
    seen: dict[str, Any] = {"done": 0, "started": {}, "event": None}

    @app.task(name="noop", queue=QUEUE)
    async def noop(**kw: Any) -> None:
        seen["done"] += 1

    @app.task(name="probe", queue="pickup")
    async def probe(n: int, **kw: Any) -> None:
        seen["started"][n] = time.perf_counter()
        seen["event"].set()

    return app, seen


def setup(t: Target) -> None:
    async def run() -> None:
        app, _ = _app(t)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(run())


async def _fill(app: procrastinate.App, n: int) -> None:
    task = app.tasks["noop"]
    for i in range(0, n, FILL_BATCH):
        await task.batch_defer_async(*(payload(j) for j in range(i, min(n, i + FILL_BATCH))))


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]

    async def run() -> float:
        app, seen = _app(t)
        async with app.open_async():
            await _fill(app, jobs)
            t0 = time.perf_counter()
            await app.run_worker_async(queues=[QUEUE], concurrency=c, wait=False)
            took = time.perf_counter() - t0
        if seen["done"] != jobs:
            raise RuntimeError(f"procrastinate ran {seen['done']} of {jobs}")
        return took

    elapsed = asyncio.run(run())
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, batch = p["messages"], p["batch"]
    items = [payload(i) for i in range(n)]

    async def run() -> float:
        app, _ = _app(t)
        async with app.open_async():
            task = app.tasks["noop"]
            await task.batch_defer_async(*items[:batch])
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                await task.batch_defer_async(*items[i:i + batch])
            return time.perf_counter() - t0

    elapsed = asyncio.run(run())
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]

    async def run() -> float:
        app, _ = _app(t)
        async with app.open_async():
            task = app.tasks["noop"]
            await task.defer_async(**payload())

            async def produce(k: int) -> None:
                for j in range(k):
                    await task.defer_async(**payload(j))

            t0 = time.perf_counter()
            await asyncio.gather(*(produce(k) for k in split(n, producers)))
            return time.perf_counter() - t0

    elapsed = asyncio.run(run())
    return {"rate": n / elapsed, "seconds": elapsed}


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    samples, gap = p["samples"], idle_gaps(p)
    out: list[float] = []

    async def run() -> None:
        app, seen = _app(t)
        seen["event"] = asyncio.Event()
        async with app.open_async():
            worker = asyncio.create_task(app.run_worker_async(queues=["pickup"],
                                                              concurrency=1))
            await asyncio.sleep(1.0)
            task = app.tasks["probe"]
            for n in range(samples):
                seen["event"].clear()
                await task.defer_async(**payload(n))
                sent = time.perf_counter()
                await asyncio.wait_for(seen["event"].wait(), 30)
                out.append(max(0.0, seen["started"][n] - sent) * 1000)
                await asyncio.sleep(gap())
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(run())
    return latency_summary(out)


CASES = {"drain_worker": drain_worker, "send_many": send_many, "send_one": send_one,
         "pickup": pickup}
