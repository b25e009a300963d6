"""The raw-SQL ceilings, on the same server and in the same run as the queues: a bare table
(id, topic, payload, available_at, lease) with one claim index, driven by plain driver
calls. drain_worker = SKIP LOCKED claim+delete of 1 row per transaction (what a per-job ack
costs at least); drain_loop = claim `batch` rows under a lease token in one statement and
delete them fenced on that token (the bare form of receive(max=100) + ack_many); send_one =
a single-row INSERT loop; send_many = COPY (PostgreSQL) or one multi-row INSERT (MariaDB,
SQLite executemany) per batch. This module is the benchmark's own SQL, not the library's."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from typing import Any

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

PG_DDL = """
CREATE TABLE raw_job (id bigserial PRIMARY KEY, topic text NOT NULL, payload jsonb NOT NULL,
  available_at timestamptz NOT NULL DEFAULT now(), lease bigint);
CREATE INDEX raw_job_claim ON raw_job (topic, available_at, id);
"""
MY_DDL = [
    """CREATE TABLE raw_job (id bigint AUTO_INCREMENT PRIMARY KEY, topic varchar(100) NOT NULL,
  payload json NOT NULL, available_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  lease bigint NULL, KEY raw_job_claim (topic, available_at, id)) ENGINE=InnoDB""",
]
LITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # Unix seconds, SQLite's clock
LITE_DDL = f"""
CREATE TABLE IF NOT EXISTS raw_job (id INTEGER PRIMARY KEY, topic TEXT NOT NULL,
  payload TEXT NOT NULL, available_at REAL NOT NULL DEFAULT ({LITE_NOW}),
  lease INTEGER);
CREATE INDEX IF NOT EXISTS raw_job_claim ON raw_job (topic, available_at, id);
"""


# --- connections --------------------------------------------------------------------------

def _pg(t: Target) -> Any:
    import psycopg

    return psycopg.connect(t.dsn, autocommit=True)


def _my(t: Target) -> Any:
    import pymysql

    conn = pymysql.connect(host=t.host, port=t.port, user=t.user, database=t.database,
                           autocommit=True)
    with conn.cursor() as cur:  # as tableq's sessions: no gap locks on the claimed range
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def _lite(t: Target) -> sqlite3.Connection:
    conn = sqlite3.connect(t.database, isolation_level=None, check_same_thread=False,
                           timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={t.synchronous}")
    return conn


def connect(t: Target) -> Any:
    return {"postgres": _pg, "mysql": _my, "sqlite": _lite}[t.db](t)


def setup(t: Target) -> None:
    conn = connect(t)
    if t.db == "postgres":
        conn.execute(PG_DDL)
    elif t.db == "mysql":
        with conn.cursor() as cur:
            for ddl in MY_DDL:
                cur.execute(ddl)
    else:
        conn.executescript(LITE_DDL)
    conn.close()


# --- statements per database ----------------------------------------------------------------

def _insert_many(conn: Any, t: Target, rows: list[str], topic: str = TOPIC) -> None:
    if t.db == "postgres":
        with conn.transaction(), conn.cursor().copy(
                "COPY raw_job (topic, payload) FROM STDIN") as cp:
            for r in rows:
                cp.write_row((topic, r))
    elif t.db == "mysql":
        with conn.cursor() as cur:
            cur.execute("INSERT INTO raw_job (topic, payload) VALUES "
                        + ",".join(["(%s, %s)"] * len(rows)),
                        [v for r in rows for v in (topic, r)])
    else:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO raw_job (topic, payload) VALUES (?, ?)",
                         [(topic, r) for r in rows])
        conn.execute("COMMIT")


def _insert_one(conn: Any, t: Target, row: str, topic: str = TOPIC) -> None:
    if t.db == "postgres":
        conn.execute("INSERT INTO raw_job (topic, payload) VALUES (%s, %s)", (topic, row))
    elif t.db == "mysql":
        with conn.cursor() as cur:
            cur.execute("INSERT INTO raw_job (topic, payload) VALUES (%s, %s)", (topic, row))
    else:
        conn.execute("INSERT INTO raw_job (topic, payload) VALUES (?, ?)", (topic, row))


def _claim_delete_one(conn: Any, t: Target, topic: str = TOPIC) -> Any:
    """Claim and delete one due row in one transaction; returns its payload or None."""
    if t.db == "postgres":
        row = conn.execute(
            "DELETE FROM raw_job WHERE id = (SELECT id FROM raw_job WHERE topic = %s AND "
            "available_at <= now() ORDER BY available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) "
            "RETURNING id, payload", (topic,)).fetchone()
        return row and row[1]
    if t.db == "mysql":
        with conn.cursor() as cur:
            conn.begin()
            cur.execute("SELECT id, payload FROM raw_job WHERE topic = %s AND available_at <= "
                        "NOW(6) ORDER BY available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
                        (topic,))
            row = cur.fetchone()
            if row:
                cur.execute("DELETE FROM raw_job WHERE id = %s", (row[0],))
            conn.commit()
        return row and json.loads(row[1])
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute(
        "DELETE FROM raw_job WHERE id = (SELECT id FROM raw_job WHERE topic = ? AND "
        f"available_at <= {LITE_NOW} ORDER BY available_at, id LIMIT 1) "
        "RETURNING id, payload", (topic,)).fetchone()
    conn.execute("COMMIT")
    return row and json.loads(row[1])


def _lease(conn: Any, t: Target, n: int, lease: int) -> list[tuple[int, Any]]:
    """Claims up to n due rows under `lease` (their due time moved 30 s on)."""
    if t.db == "postgres":
        return conn.execute(
            "WITH c AS (SELECT id FROM raw_job WHERE topic = %s AND available_at <= now() "
            "ORDER BY available_at, id LIMIT %s FOR UPDATE SKIP LOCKED) UPDATE raw_job j SET "
            "available_at = now() + interval '30 seconds', lease = %s FROM c WHERE j.id = c.id "
            "RETURNING j.id, j.payload", (TOPIC, n, lease)).fetchall()
    if t.db == "mysql":
        with conn.cursor() as cur:
            conn.begin()
            cur.execute("SELECT id, payload FROM raw_job WHERE topic = %s AND available_at <= "
                        "NOW(6) ORDER BY available_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
                        (TOPIC, n))
            rows = cur.fetchall()
            if rows:
                cur.execute("UPDATE raw_job SET available_at = NOW(6) + INTERVAL 30 SECOND, "
                            "lease = %s WHERE id IN (" + ",".join(["%s"] * len(rows)) + ")",
                            [lease, *(r[0] for r in rows)])
            conn.commit()
        return [(r[0], json.loads(r[1])) for r in rows]
    conn.execute("BEGIN IMMEDIATE")
    rows = conn.execute(
        f"UPDATE raw_job SET available_at = {LITE_NOW} + 30, lease = ? WHERE id IN "
        f"(SELECT id FROM raw_job WHERE topic = ? AND available_at <= {LITE_NOW} "
        "ORDER BY available_at, id LIMIT ?) RETURNING id, payload", (lease, TOPIC, n)).fetchall()
    conn.execute("COMMIT")
    return [(r[0], json.loads(r[1])) for r in rows]


def _ack(conn: Any, t: Target, ids: list[int], lease: int) -> int:
    """Deletes the rows still held under `lease` (fenced): returns how many."""
    if t.db == "postgres":
        return conn.execute("DELETE FROM raw_job WHERE id = ANY(%s) AND lease = %s",
                            (ids, lease)).rowcount
    if t.db == "mysql":
        with conn.cursor() as cur:
            return cur.execute("DELETE FROM raw_job WHERE lease = %s AND id IN ("
                               + ",".join(["%s"] * len(ids)) + ")", [lease, *ids])
    return conn.execute("DELETE FROM raw_job WHERE lease = ? AND id IN ("
                        + ",".join("?" * len(ids)) + ")", [lease, *ids]).rowcount


# --- cases ------------------------------------------------------------------------------------

def fill(t: Target, n: int, topic: str = TOPIC) -> None:
    conn = connect(t)
    for i in range(0, n, FILL_BATCH):
        _insert_many(conn, t, [json.dumps(payload(j)) for j in range(i, min(n, i + FILL_BATCH))],
                     topic)
    conn.close()


def drain_worker(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """c threads, each its own connection, claim+delete one row per transaction."""
    jobs, c = p["jobs"], p["concurrency"]
    fill(t, jobs)
    conns = [connect(t) for _ in range(c)]

    def consume(i: int) -> int:
        n = 0
        while _claim_delete_one(conns[i], t) is not None:
            n += 1
        return n

    elapsed, counts = timed_threads(c, consume)
    for conn in conns:
        conn.close()
    if sum(counts) != jobs:
        raise RuntimeError(f"raw drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def drain_loop(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    jobs, c, batch = p["jobs"], p["concurrency"], p.get("batch", 100)
    fill(t, jobs)
    conns = [connect(t) for _ in range(c)]

    def consume(i: int) -> int:
        n = 0
        while True:
            lease = uuid.uuid4().int >> 65
            rows = _lease(conns[i], t, batch, lease)
            if not rows:
                return n
            n += _ack(conns[i], t, [r[0] for r in rows], lease)

    elapsed, counts = timed_threads(c, consume)
    for conn in conns:
        conn.close()
    if sum(counts) != jobs:
        raise RuntimeError(f"raw drained {sum(counts)} of {jobs}")
    return {"rate": jobs / elapsed, "seconds": elapsed}


def send_many(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, batch = p["messages"], p["batch"]
    conn = connect(t)
    _insert_many(conn, t, [json.dumps(payload(i)) for i in range(batch)])  # warm
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        # Encoding is inside the timed loop, as it is for every queue measured.
        _insert_many(conn, t, [json.dumps(payload(j)) for j in range(i, min(n, i + batch))])
    elapsed = time.perf_counter() - t0
    conn.close()
    return {"rate": n / elapsed, "seconds": elapsed}


def send_one(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = p["messages"], p["producers"]
    conns = [connect(t) for _ in range(producers)]
    _insert_one(conns[0], t, json.dumps(payload()))
    shares = split(n, producers)

    def produce(i: int) -> None:
        for j in range(shares[i]):
            _insert_one(conns[i], t, json.dumps(payload(j)))

    elapsed, _ = timed_threads(producers, produce)
    for conn in conns:
        conn.close()
    return {"rate": n / elapsed, "seconds": elapsed}


def pickup(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL only: INSERT + pg_notify in one statement; a LISTENing thread wakes and
    claims with the 1-row claim. The floor for any NOTIFY-woken queue on this server."""
    if t.db != "postgres":
        raise ValueError("raw pickup is for PostgreSQL (LISTEN/NOTIFY)")
    samples, gap = p["samples"], idle_gaps(p)
    listen, claim, producer = _pg(t), _pg(t), _pg(t)
    listen.execute("LISTEN raw_pickup")
    started: dict[int, float] = {}
    arrived = threading.Event()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            for _ in listen.notifies(timeout=0.2, stop_after=1):
                while (row := _claim_delete_one(claim, t, "pickup")) is not None:
                    started[row["n"]] = time.perf_counter()
                    arrived.set()

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    time.sleep(0.5)
    out: list[float] = []
    for n in range(samples):
        arrived.clear()
        producer.execute("WITH i AS (INSERT INTO raw_job (topic, payload) VALUES ('pickup', %s) "
                         "RETURNING id) SELECT pg_notify('raw_pickup', '') FROM i",
                         (json.dumps(payload(n)),))
        sent = time.perf_counter()
        if not arrived.wait(30):
            raise RuntimeError(f"raw pickup {n} not seen within 30 s")
        out.append(max(0.0, started[n] - sent) * 1000)
        time.sleep(gap())
    stop.set()
    th.join(5)
    for conn in (listen, claim, producer):
        conn.close()
    return latency_summary(out)


CASES = {"drain_worker": drain_worker, "drain_loop": drain_loop, "send_many": send_many,
         "send_one": send_one, "pickup": pickup}
