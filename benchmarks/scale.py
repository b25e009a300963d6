"""The scale cases of issue 15 (goals 4, 5 and 8), for tableq and, under a held snapshot,
the raw SKIP LOCKED ceiling: backlog size vs drain rate and stats() time, table and index
size after churn, a REPEATABLE READ transaction held open while the queue churns, a receive
beside an open bulk load, and worker memory over a long run. Catalog queries (sizes, dead
tuples, history list length) are the benchmark's own SQL, not the library's."""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time
import uuid
from typing import Any

import tableq
from benchmarks import sys_raw
from benchmarks.common import FILL_BATCH, Target, payload
from benchmarks.sys_tableq import TOPIC, connect, fill
from tableq.bulk import Bulk

CTX = mp.get_context("fork")
SEGMENT = 20_000  # messages per fill+drain segment of the churn loops


def setup(t: Target) -> None:
    connect(t, migrate=True).close()


def _drain(q: tableq.Queue, n: int | None = None, topic: str = TOPIC,
           batch: int = 100) -> tuple[int, float]:
    """The library loop, one thread: receive(max=batch) + ack_many until n done or empty."""
    done, t0 = 0, time.perf_counter()
    while n is None or done < n:
        msgs = q.receive(topic, max=batch if n is None else min(batch, n - done),
                         visibility_timeout=60)
        if not msgs:
            break
        q.ack_many(msgs)
        done += len(msgs)
    return done, time.perf_counter() - t0


def _stats_ms(q: tableq.Queue, calls: int = 5) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        q.stats(TOPIC)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


# --- catalog figures (the benchmark's own SQL) ------------------------------------------------

def _pg(t: Target) -> Any:
    import psycopg

    return psycopg.connect(t.dsn, autocommit=True)


def table_bytes(t: Target, table: str = "message") -> int:
    """Heap + indexes (+ TOAST) of tableq's live-message table."""
    if t.db == "postgres":
        with _pg(t) as c:
            return int(c.execute("SELECT pg_total_relation_size(%s)",
                                 (f"tableq.{table}",)).fetchone()[0])
    conn = sys_raw._my(t)
    with conn.cursor() as cur:
        cur.execute(f"ANALYZE TABLE tableq_{table}")
        cur.fetchall()
        cur.execute("SELECT data_length + index_length FROM information_schema.TABLES WHERE "
                    "table_schema = %s AND table_name = %s", (t.database, f"tableq_{table}"))
        size = int(cur.fetchone()[0])
    conn.close()
    return size


def dead_rows(t: Target, table: str) -> dict[str, float]:
    """PostgreSQL: dead tuples of `table`; MariaDB: InnoDB's history list length."""
    if t.db == "postgres":
        with _pg(t) as c:
            c.execute("SELECT pg_stat_force_next_flush()")
            row = c.execute("SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE "
                            "relname = %s", (table,)).fetchone()
        return {"dead_tuples": float(row[0]) if row else float("nan")}
    conn = sys_raw._my(t)
    with conn.cursor() as cur:
        cur.execute("SHOW ENGINE INNODB STATUS")
        status = cur.fetchone()[2]
    conn.close()
    hll = next((line.split()[-1] for line in status.splitlines()
                if line.startswith("History list length")), "nan")
    return {"history_list_length": float(hll)}


# --- cases ------------------------------------------------------------------------------------

def backlog(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """A backlog of `backlog` messages: stats() time, then the rate of draining `drain` of
    them with the library loop (receive 100 + ack_many, one thread), `repeats` times, the
    backlog topped up to its size between drains; the median drain counts. One drain of 20k
    takes about a second, and single drains swung 0.71x-1.20x between runs of an hour."""
    n, drain_n, repeats = p["backlog"], p["drain"], p.get("repeats", 5)
    q = connect(t, migrate=True)
    t0 = time.perf_counter()
    fill(q, n)
    fill_s = time.perf_counter() - t0
    stats_ms = _stats_ms(q)
    rates = []
    for i in range(repeats):
        if i:
            fill(q, drain_n, start=n + (i - 1) * drain_n)  # back to `backlog` messages
        done, took = _drain(q, drain_n)
        rates.append(done / took)
    q.close()
    return {"rate": statistics.median(rates), "drain_rates": [round(r) for r in rates],
            "stats_ms": stats_ms, "fill_rate": n / fill_s}


def bloat(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Table + index bytes: empty, with a `SEGMENT` backlog, and with the same backlog again
    after `through` messages went through the queue (send_many 1000 + receive/ack 1000 at a
    time, autovacuum / purge left to the server)."""
    through = p["through"]
    q = connect(t, migrate=True)
    empty = table_bytes(t)
    fill(q, SEGMENT)
    start = table_bytes(t)
    sent, t0 = 0, time.perf_counter()
    while sent < through:
        q.send_many(TOPIC, [payload(i) for i in range(FILL_BATCH)])
        _drain(q, FILL_BATCH)
        sent += FILL_BATCH
    took = time.perf_counter() - t0
    end = table_bytes(t)
    q.close()
    return {"empty_bytes": empty, "start_bytes": start, "end_bytes": end,
            "ratio": end / start, "through": through, "rate": through / took}


def _hold(t: Target, ready: Any, stop: Any) -> None:
    """A REPEATABLE READ transaction that reads once (taking its snapshot) and stays open."""
    if t.db == "postgres":
        conn = _pg(t)
        conn.autocommit = False
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM pg_class").fetchone()
        ready.set()
        stop.wait()
        conn.rollback()
        conn.close()
        return
    conn = sys_raw._my(t)
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES")
        cur.fetchall()
        ready.set()
        stop.wait()
        conn.rollback()
    conn.close()


def held_snapshot(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Churn for `seconds` in segments (fill SEGMENT with send_many, drain them with the
    library loop), with or without (`held`) a REPEATABLE READ transaction open throughout.
    `impl` = tableq or raw (claim 100 under a lease + fenced delete)."""
    seconds, held, impl = p["seconds"], p["held"], p.get("impl", "tableq")
    if impl == "tableq":
        q = connect(t, migrate=True)
        table = "message"

        def segment() -> tuple[int, float]:
            fill(q, SEGMENT)
            return _drain(q)
    else:
        sys_raw.setup(t)
        conn = sys_raw.connect(t)
        table = "raw_job"

        def segment() -> tuple[int, float]:
            sys_raw.fill(t, SEGMENT)
            done, t0 = 0, time.perf_counter()
            while True:
                lease = uuid.uuid4().int >> 65
                rows = sys_raw._lease(conn, t, 100, lease)
                if not rows:
                    return done, time.perf_counter() - t0
                done += sys_raw._ack(conn, t, [r[0] for r in rows], lease)

    stop, ready = threading.Event(), threading.Event()
    holder = None
    if held:
        holder = threading.Thread(target=_hold, args=(t, ready, stop), daemon=True)
        holder.start()
        ready.wait(30)
    rates: list[float] = []
    total_n, total_s = 0, 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n, s = segment()
        rates.append(n / s)
        total_n += n
        total_s += s
    dead = dead_rows(t, table if t.db == "postgres" else "")
    stop.set()
    if holder is not None:
        holder.join(30)
    if impl == "tableq":
        q.close()
    else:
        conn.close()
    return {"rate": total_n / total_s, "first_rate": rates[0], "last_rate": rates[-1],
            "min_rate": min(rates), "segments": len(rates), "messages": total_n,
            "segment_rates": [round(r) for r in rates], **dead}


def open_load(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """Median time of a receive(max=1) + ack on a topic holding `rows` staged rows of an
    open (unpublished) bulk load, against the same on a topic without one."""
    rows, calls = p["rows"], p.get("calls", 20)
    q = connect(t, migrate=True)
    job = "bench-load-" + uuid.uuid4().hex[:8]
    for i in range(0, rows, 10_000):
        Bulk(q).stage_many(job, 0, "loaded", [payload(j) for j in range(i, min(rows, i + 10_000))])
    for topic in ("loaded", "plain"):
        q.send_many(topic, [payload(i) for i in range(calls + 5)])

    def timed(topic: str) -> float:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            msgs = q.receive(topic, max=1, visibility_timeout=60)
            times.append((time.perf_counter() - t0) * 1000)
            q.ack_many(msgs)
        return statistics.median(times)

    plain_ms, loaded_ms = timed("plain"), timed("loaded")
    Bulk(q).discard_staged(job)
    q.close()
    return {"plain_ms": plain_ms, "loaded_ms": loaded_ms, "ratio": loaded_ms / plain_ms}


def _feed(url: str, options: dict[str, Any], rate: int, stop: Any) -> None:
    q = tableq.connect(url, **options)
    batch = max(1, rate // 10)
    while not stop.is_set():
        t0 = time.monotonic()
        q.send_many(TOPIC, [payload(i) for i in range(batch)])
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
    q.close()


def rss(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """A worker at concurrency 16 running no-op jobs fed at `rate`/s by another process, for
    `seconds`; this process's RSS sampled every `every_s` seconds (after a 10 s warm-up)."""
    import psutil

    seconds, rate, every = p["seconds"], p.get("rate", 2000), p.get("every_s", 5.0)
    app = tableq.App(t.tableq_url, migrate=True)
    done = [0]

    @app.handler(TOPIC, concurrency=16)
    def noop(message: tableq.Message) -> None:
        done[0] += 1

    worker = app.worker([TOPIC])
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    worker.running.wait(10)
    stop = CTX.Event()
    feeder = CTX.Process(target=_feed, args=(t.tableq_url, {}, rate, stop))
    feeder.start()
    me = psutil.Process()
    time.sleep(min(10.0, seconds / 4))
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while (now := time.monotonic()) - t0 < seconds:
        samples.append((now - t0, me.memory_info().rss / 2**20))
        time.sleep(every)
    stop.set()
    feeder.join(30)
    worker.stop()
    runner.join(30)
    app.close()
    mb = [m for _, m in samples]
    xs = [x for x, _ in samples]
    slope = statistics.linear_regression(xs, mb).slope * 60 if len(samples) > 2 else 0.0
    return {"start_mb": mb[0], "end_mb": mb[-1], "max_mb": max(mb), "slope_mb_per_min": slope,
            "jobs": done[0], "samples": [[round(x, 1), round(m, 1)] for x, m in samples]}


CASES = {"backlog": backlog, "bloat": bloat, "held_snapshot": held_snapshot,
         "open_load": open_load, "rss": rss}
