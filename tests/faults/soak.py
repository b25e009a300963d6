"""The worker soak (long tier, not a pytest test): two `tableq worker` processes run
tests/faults/apps/fault_app.py against a throwaway server for --minutes while a producer
sends a steady stream to both topics (1% poison messages that always fail), optionally
crashing the server every --crash-every-s. Every --sample-s it records the queue tables'
size, the backlog and each worker's resident memory; at the end it drains, prints one
checker line per topic and the table-size and memory figures, and exits non-zero if the
checker failed or a worker's memory grew by more than --max-rss-growth-mib.

    cd tests/faults && ../../.venv/bin/python soak.py --minutes 60 --db postgres
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from checker import Fault  # noqa: E402
from servers import ThrowawayMariaDB, ThrowawayPostgres  # noqa: E402
from workerfaults import (  # noqa: E402
    FaultDB,
    Fleet,
    Producer,
    collect,
    events_in,
    forbidden_lines,
    make_db,
    prepare,
)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def table_mib(db: FaultDB) -> float:
    """Size of tableq's tables (data and indexes) in the database under test."""
    if db.dialect == "sqlite":
        path = Path(db.url.split("///", 1)[1])
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20
    assert db.server is not None
    if isinstance(db.server, ThrowawayPostgres):
        rows = db.server.sql(
            "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "AND c.relkind = 'r'", (db.name,))
        return float(rows[0][0]) / 2**20
    rows = db.server.sql("SELECT COALESCE(sum(data_length + index_length), 0) FROM "
                         "information_schema.tables WHERE table_schema = %s", (db.name,))
    return float(rows[0][0]) / 2**20


def drain(db: FaultDB, topics: list[str], stall_s: float = 120.0) -> float:
    """Waits until the topics hold no live message for as long as the backlog keeps
    shrinking (an hour of load on a busy machine can leave a backlog no fixed timeout fits),
    and returns the seconds it took. Raises TimeoutError when the backlog has not shrunk for
    stall_s: the workers stopped making progress."""
    started = last_progress = time.monotonic()
    best: int | None = None
    q = None
    while True:
        try:
            q = q or db.queue()
            backlog = sum(q.stats(t)[0].live for t in topics)
        except Exception:  # noqa: BLE001 - the server may still be restarting after a crash
            if q is not None:
                q.close()
            q, backlog = None, None
        now = time.monotonic()
        if backlog == 0:
            if q is not None:
                q.close()
            return now - started
        if backlog is not None and (best is None or backlog < best):
            best, last_progress = backlog, now
        if now - last_progress > stall_s:
            if q is not None:
                q.close()
            raise TimeoutError(f"the backlog stayed at {best} messages for {stall_s:g} s")
        time.sleep(1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--db", choices=["sqlite", "postgres", "mysql"], default="postgres")
    ap.add_argument("--rate", type=float, default=100.0, help="messages per second per topic")
    ap.add_argument("--crash-every-s", type=float, default=0.0)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--max-rss-growth-mib", type=float, default=50.0)
    args = ap.parse_args()
    server = None
    if args.db == "postgres":
        server = ThrowawayPostgres()
    elif args.db == "mysql":
        server = ThrowawayMariaDB()
    if server is not None:
        server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="tq-soak-") as tmp:
            return soak(args, server, Path(tmp))
    finally:
        if server is not None:
            server.destroy()


def soak(args: argparse.Namespace, server: ThrowawayPostgres | ThrowawayMariaDB | None,
         tmp: Path) -> int:
    db = make_db(args.db, server, tmp)
    prepare(db)
    duration_s = args.minutes * 60
    n = int(args.rate * duration_s)
    poison = [f"{t}-{i}" for t in ("alo", "eo") for i in range(50, n, 100)]
    fleet = Fleet(db, tmp, {"FAULT_VT_S": "10", "FAULT_SLEEP_S": "0.005",
                            "FAULT_POISON": ",".join(poison), "FAULT_RETRY_S": "0.5"},
                  # An hour of per-message INFO lines would only fill the disk.
                  slots=[["--log-level", "WARNING"], ["--log-level", "WARNING"]])
    producer = Producer(db, tmp / "sends.jsonl", ["alo", "eo"], n, batch=10,
                        duration_s=duration_s)
    faults: list[Fault] = []
    samples: list[tuple[float, float, int, list[float | None]]] = []
    stop = threading.Event()

    def crasher() -> None:
        while args.crash_every_s and server is not None and not stop.wait(args.crash_every_s):
            start = time.time()
            server.crash()
            time.sleep(2)
            server.restart()
            faults.append(Fault("server crash", start, time.time()))

    fleet.start()
    started = time.monotonic()
    producer.start()
    threading.Thread(target=crasher, daemon=True).start()
    q = None
    try:
        # The producer paces itself to finish in --minutes, but a slow database lags it:
        # stop it on time so the soak lasts what it says (the checker counts what was sent).
        while producer.is_alive() and time.monotonic() - started < duration_s:
            time.sleep(args.sample_s)
            try:
                if q is None:
                    q = db.queue()
                backlog = sum(q.stats(t)[0].live for t in ("alo", "eo"))
                size = table_mib(db)
            except Exception as exc:  # noqa: BLE001 - a sample taken during a crash
                print(f"sample skipped: {type(exc).__name__}", flush=True)
                q = None
                continue
            rss = [rss_mib(pid) for pid in fleet.worker_pids()]
            samples.append((time.monotonic() - started, size, backlog, rss))
            print(f"t={samples[-1][0]:7.0f}s table={size:8.1f} MiB backlog={backlog:7d} "
                  f"rss={[round(r or 0, 1) for r in rss]} MiB", flush=True)
        producer.stop()
        producer.join()
        stop.set()
        backlog_at_end = samples[-1][2] if samples else 0
        drain_s = drain(db, ["alo", "eo"])
        print(f"drained a backlog of about {backlog_at_end} in {drain_s:.0f} s", flush=True)
        end_size = table_mib(db)
        codes = fleet.stop()
    finally:
        stop.set()
        fleet.kill_all()
        if q is not None:
            q.close()
    ok = codes == [0, 0] and not forbidden_lines(fleet.logs())
    first_rss = [round(r, 1) for r in samples[0][3] if r is not None] if samples else []
    last_rss = [round(r, 1) for r in samples[-1][3] if r is not None] if samples else []
    growth = max((b - a for a, b in zip(first_rss, last_rss, strict=False)), default=0.0)
    peak_rss = [round(max((s[3][i] or 0.0) for s in samples if len(s[3]) > i), 1)
                for i in range(len(first_rss))]
    for topic in ("alo", "eo"):
        result = collect("B3-soak", db, tmp, topic, faults=faults,
                         note=f"{args.minutes:g} min at {args.rate:g}/s per topic")
        print(result.line(), flush=True)
        ok = ok and result.ok
    print(f"table size: first sample {samples[0][1] if samples else 0:.1f} MiB, peak "
          f"{max((s[1] for s in samples), default=0):.1f} MiB, after drain {end_size:.1f} MiB; "
          f"worker RSS first {first_rss} MiB, last {last_rss} MiB, peak {peak_rss} MiB, "
          f"growth {growth:.1f} MiB; "
          f"outages logged {sum(events_in(log, 'database_unreachable') for log in fleet.logs())}")
    ok = ok and growth <= args.max_rss_growth_mib
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
