"""persist-queue in the benchmark cases (SQLite only): SQLiteAckQueue, the variant with
acks, one instance shared by the threads (multithreading=True, as its docs show), consumers
get(block=False) then ack. It has no worker runtime and no batch put: send_many is a put
loop. synchronous is set on each connection it opens (WAL is its own default)."""

from __future__ import annotations

import os
import time
from typing import Any

import persistqueue
from persistqueue import SQLiteAckQueue

from benchmarks.common import Target, payload, split, timed_threads


class _Queue(SQLiteAckQueue):
    synchronous = "FULL"

    def _new_db_connection(self, path, multithreading, timeout):  # type: ignore[no-untyped-def]
        conn = super()._new_db_connection(path, multithreading, timeout)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return conn


def _queue(t: Target) -> SQLiteAckQueue:
    cls = type("Q", (_Queue,), {"synchronous": t.synchronous.upper()})
    path = t.database + ".pq"
    os.makedirs(path, exist_ok=True)
    return cls(path, multithreading=True, auto_commit=True)


def setup(t: Target) -> None:
    _queue(t).close()


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c = p["jobs"], p["concurrency"]
    q = _queue(t)
    for i in range(jobs):
        q.put(payload(i))

    def consume(_: int) -> int:
        n = 0
        while True:
            try:
                item = q.get(block=False, raw=True)
            except persistqueue.Empty:
                return n
            q.ack(id=item["pqid"])
            n += 1

    elapsed, counts = timed_threads(c, consume)
    if sum(counts) != jobs:
        raise RuntimeError(f"persist-queue drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n = p["messages"]
    q = _queue(t)
    q.put(payload())
    t0 = time.perf_counter()
    for i in range(n):
        q.put(payload(i))
    elapsed = time.perf_counter() - t0
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    q = _queue(t)
    q.put(payload())
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            q.put(payload(j))

    elapsed, _ = timed_threads(producers, produce)
    return {"rate": n / elapsed, "seconds": elapsed}


CASES = {"drain_worker": drain_worker, "send_many": send_many, "send_one": send_one}
