"""Quick core benchmark (a program, not a test): send_many, single sends, and receive+ack
throughput with 1 and 4 worker processes, per backend, printed as a table.

    .venv/bin/python benchmarks/core_bench.py [--rounds 3] [--backends sqlite,postgres,mysql]

Each figure is the median of the rounds (the range in brackets); every round uses a fresh
database file, schema or database. Durability is the server's own setting (printed)."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid

import tableq

PG = os.environ.get("TABLEQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MY = os.environ.get("TABLEQ_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
CTX = mp.get_context("fork")


def fresh(dialect: str) -> tuple[str, callable]:  # type: ignore[valid-type]
    name = "bench_" + uuid.uuid4().hex[:8]
    if dialect == "sqlite":
        d = tempfile.mkdtemp()
        return f"sqlite:///{d}/{name}.db", lambda: None
    if dialect == "postgres":
        import psycopg

        def drop() -> None:
            with psycopg.connect(PG, autocommit=True) as c:
                c.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        return f"{PG}?schema={name}", drop
    import pymysql

    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE `{name}`")

    def drop_db() -> None:
        admin.cursor().execute(f"DROP DATABASE `{name}`")
    return MY.rsplit("/", 1)[0] + f"/{name}", drop_db


def durability(dialect: str, url: str) -> str:
    if dialect == "sqlite":
        return "synchronous=FULL, WAL"
    if dialect == "postgres":
        import psycopg

        with psycopg.connect(PG) as c:
            f = c.execute("SHOW fsync").fetchone()[0]
            s = c.execute("SHOW synchronous_commit").fetchone()[0]
        return f"fsync={f}, synchronous_commit={s}"
    import pymysql

    c = pymysql.connect(host="127.0.0.1", user="root")
    cur = c.cursor()
    cur.execute("SELECT @@innodb_flush_log_at_trx_commit")
    return f"innodb_flush_log_at_trx_commit={cur.fetchone()[0]}"


def bench_send_many(url: str, n: int) -> float:
    with tableq.connect(url, migrate=True) as q:
        items = [{"n": i, "body": "x" * 80} for i in range(n)]
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            q.send_many("bench", items[i:i + 1000])
        return n / (time.perf_counter() - t0)


def bench_send_one(url: str, n: int) -> float:
    with tableq.connect(url, migrate=True) as q:
        t0 = time.perf_counter()
        for i in range(n):
            q.send("bench", {"n": i, "body": "x" * 80})
        return n / (time.perf_counter() - t0)


def _worker(url: str, batch: int, start: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    done = 0
    with tableq.connect(url) as q:
        q.now()  # connect before the clock starts
        start.wait()
        while True:
            msgs = q.receive("bench", max=batch, visibility_timeout=60)
            if not msgs:
                break
            if batch == 1:
                msgs[0].ack()
            else:
                q.ack_many(msgs)
            done += len(msgs)
    out.put(done)


def bench_drain(url: str, n: int, workers: int, batch: int) -> float:
    with tableq.connect(url, migrate=True) as q:
        q.purge("bench")
        for i in range(0, n, 1000):
            q.send_many("bench", [{"n": j, "body": "x" * 80} for j in range(i, min(n, i + 1000))])
    start, out = CTX.Event(), CTX.Queue()
    procs = [CTX.Process(target=_worker, args=(url, batch, start, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    start.set()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    assert total == n, (total, n)
    return n / elapsed


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):>9,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="sqlite,postgres,mysql")
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args()
    cases = [
        ("send_many (batches of 1000)", lambda u: bench_send_many(u, 50_000)),
        ("send, one per call", lambda u: bench_send_one(u, 2_000)),
        ("receive+ack 1 at a time, 1 worker", lambda u: bench_drain(u, 3_000, 1, 1)),
        ("receive+ack 1 at a time, 4 workers", lambda u: bench_drain(u, 6_000, 4, 1)),
        ("receive 100 + ack_many, 1 worker", lambda u: bench_drain(u, args.n, 1, 100)),
        ("receive 100 + ack_many, 4 workers", lambda u: bench_drain(u, args.n, 4, 100)),
    ]
    backends = args.backends.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    notes = {}
    for _ in range(args.rounds):
        for name, fn in cases:  # interleaved: every backend in every round
            for b in backends:
                url, drop = fresh(b)
                try:
                    notes[b] = durability(b, url)
                    results.setdefault((name, b), []).append(fn(url))
                finally:
                    drop()
    print(f"\nmessages/s, median of {args.rounds} rounds [range]; ~100-byte JSON payloads")
    print(f"{'measure':38}" + "".join(f"{b:>28}" for b in backends))
    for name, _ in cases:
        print(f"{name:38}" + "".join(f"{fmt(results[(name, b)]):>28}" for b in backends))
    for b in backends:
        print(f"  {b}: {notes[b]}")


if __name__ == "__main__":
    main()
