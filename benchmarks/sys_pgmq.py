"""PGMQ in the benchmark cases: the SQL-only install bundled in the `pgmq` PyPI package
(pgmq/sql/pgmq.sql, applied by pgmq.install.install_pgmq_from_sql into the case's own
database) and that package's sync client. PGMQ has no worker runtime: a consumer is the loop
its docs show, read(vt, qty) then delete, here with qty=10 as in issue 15's table."""

from __future__ import annotations

import time
from typing import Any

from pgmq import PGMQueue
from pgmq.install import get_embedded_sql_version, install_pgmq_from_sql

from benchmarks.common import FILL_BATCH, Target, payload, split, timed_threads

QUEUE = "bench"
READ_QTY = 10


def client(t: Target, pool: int = 4) -> PGMQueue:
    return PGMQueue(host=t.host, port=str(t.port), database=t.database, username=t.user,
                    password="", pool_size=pool, init_extension=False)


def setup(t: Target) -> None:
    install_pgmq_from_sql(dsn=t.dsn)
    q = client(t, 1)
    q.create_queue(QUEUE)
    q.close()


def version() -> str:
    return get_embedded_sql_version()


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]
    q = client(t, c + 1)
    for i in range(0, jobs, FILL_BATCH):
        q.send_batch(QUEUE, [payload(j) for j in range(i, min(jobs, i + FILL_BATCH))])
    qty = p.get("qty", READ_QTY)

    def consume(_: int) -> int:
        n = 0
        while True:
            msgs = q.read_batch(QUEUE, vt=30, batch_size=qty)
            if not msgs:
                return n
            q.delete_batch(QUEUE, [m.msg_id for m in msgs])
            n += len(msgs)

    elapsed, counts = timed_threads(c, consume)
    q.close()
    if sum(counts) != jobs:
        raise RuntimeError(f"PGMQ drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, batch = p["messages"], p["batch"]
    q = client(t, 1)
    items = [payload(i) for i in range(n)]
    q.send_batch(QUEUE, items[:batch])
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        q.send_batch(QUEUE, items[i:i + batch])
    elapsed = time.perf_counter() - t0
    q.close()
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    q = client(t, producers + 1)
    q.send(QUEUE, payload())
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            q.send(QUEUE, payload(j))

    elapsed, _ = timed_threads(producers, produce)
    q.close()
    return {"rate": n / elapsed, "seconds": elapsed}


CASES = {"drain_worker": drain_worker, "send_many": send_many, "send_one": send_one}
