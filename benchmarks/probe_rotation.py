"""A probe for goal 5 (held snapshot), not tableq code and not part of `make bench`: would
rotating the hot table keep a SKIP LOCKED drain's rate while a REPEATABLE READ transaction is
held open? Raw SQL, one client, the benchmark's churn (fill SEGMENT rows, drain them: claim 100
under a lease, then a delete fenced on it), in phases of `--phase-s` seconds without and with
a held snapshot, alternating. Variants:

  start   one table; each claim reads the claim index from the topic's start (the plain queue);
  floor   one table; each claim reads from a floor, the first row the previous claim took
          ((available_at, id): the rows of one fill share their available_at);
  rotate  two tables; fills go to the current one, which hands over after --rotate-rows; the
          other is drained first and, once empty, TRUNCATEd (lock wait 200 ms / 1 s); claims
          read from floors.

One client only, so a floor needs no view of other writers here (tableq's floors do). Run on a
server nobody else is churning; tables are named tq_probe_*. On MariaDB, --isolation sets the
churn's level (tableq's sessions run READ COMMITTED; the held transaction is REPEATABLE READ
either way), and each phase prints its handler and buffer-pool reads per message.

    python -m benchmarks.probe_rotation --db postgres --variant rotate --phase-s 30 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from benchmarks import sys_raw
from benchmarks.common import Target
from benchmarks.scale import _hold

SEGMENT = 20_000
PAYLOAD = json.dumps({"n": 1, "body": "x" * 80})
TABLES = ("tq_probe_a", "tq_probe_b")
SEQUENCE = "tq_probe_seq"


class Probe:
    """One variant's tables, floors and time split on one database."""

    def __init__(self, db: str, address: str, variant: str, rotate_rows: int,
                 isolation: str = "READ COMMITTED", innodb_metrics: bool = False) -> None:
        self.db, self.variant, self.rotate_rows = db, variant, rotate_rows
        self.isolation, self.innodb_metrics = isolation, innodb_metrics
        host, port = address.split(":")
        user = "postgres" if db == "postgres" else "root"
        self.target = Target(db, host, int(port), "test", user)
        self.tables = list(TABLES if variant == "rotate" else TABLES[:1])
        self.conn = self.connect()
        self.start: tuple[datetime, int] = (
            datetime(1970, 1, 2, tzinfo=UTC if db == "postgres" else None), 0)
        self.floor = {t: self.start for t in self.tables}
        self.current, self.taken, self.next_id = 0, 0, 1
        self.dirty: set[str] = set()  # written since its last TRUNCATE
        self.truncates = 0
        self.spent = dict.fromkeys(("fill", "claim", "ack", "truncate"), 0.0)
        for t in self.tables:
            self.create(t)

    # --- per database ---------------------------------------------------------------------

    def connect(self) -> Any:
        if self.db == "postgres":
            conn = sys_raw._pg(self.target)
            # As tableq's sessions plan: the lease UPDATE joins its claim by id, never by a
            # scan of the whole table (which a drained table's statistics invite).
            for setting in ("enable_seqscan", "enable_bitmapscan", "jit"):
                conn.execute(f"SET {setting} = off")
            return conn
        conn = sys_raw._my(self.target)  # READ COMMITTED, as tableq's sessions
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {self.isolation}")
        return conn

    def sql(self, statement: str, params: Any = None) -> list[Any]:
        if self.db == "postgres":
            cur = self.conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())

    def create(self, t: str) -> None:
        self.sql(f"DROP TABLE IF EXISTS {t}")
        if self.db == "postgres":
            self.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, topic text NOT NULL, payload "
                     "jsonb NOT NULL, available_at timestamptz NOT NULL DEFAULT now(), "
                     "lease bigint)")
            self.sql(f"CREATE INDEX {t}_claim ON {t} (topic, available_at, id)")
            self.sql(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
            self.sql(f"CREATE SEQUENCE {SEQUENCE}")
        else:
            self.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, topic varchar(100) NOT NULL, "
                     "payload json NOT NULL, available_at datetime(6) NOT NULL DEFAULT "
                     "CURRENT_TIMESTAMP(6), lease bigint NULL, KEY claim (topic, available_at, "
                     "id)) ENGINE=InnoDB")

    def insert(self, t: str) -> None:
        if self.db == "postgres":
            ids = self.sql(f"SELECT nextval('{SEQUENCE}') FROM generate_series(1, %s)",
                           (SEGMENT,))
            with self.conn.cursor().copy(f"COPY {t} (id, topic, payload) FROM STDIN") as copy:
                for (i,) in ids:
                    copy.write_row((i, "bench", PAYLOAD))
            return
        with self.conn.cursor() as cur:
            for _ in range(0, SEGMENT, 1000):
                rows = [(self.next_id + i, "bench", PAYLOAD) for i in range(1000)]
                self.next_id += 1000
                cur.executemany(f"INSERT INTO {t} (id, topic, payload) VALUES (%s, %s, %s)", rows)

    def lease(self, t: str, floor: tuple[datetime, int], lease: int) -> list[tuple[int, Any]]:
        """Claims up to 100 due rows at or after floor: (id, available_at before the claim)."""
        if self.db == "postgres":
            return [(r[0], r[1]) for r in self.sql(
                f"WITH c AS (SELECT id, available_at FROM {t} WHERE topic = 'bench' "
                "AND available_at <= now() AND (available_at, id) >= (%s, %s) "
                "ORDER BY topic, available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) "
                f"UPDATE {t} SET lease = %s, available_at = now() + interval '60 s' FROM c "
                f"WHERE {t}.id = c.id RETURNING {t}.id, c.available_at",
                (floor[0], floor[1], lease))]
        self.conn.begin()
        rows = self.sql(
            f"SELECT id, available_at FROM {t} WHERE topic = 'bench' AND available_at <= NOW(6)"
            " AND (available_at > %s OR (available_at = %s AND id >= %s))"
            " ORDER BY topic, available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED",
            (floor[0], floor[0], floor[1]))
        if rows:
            self.sql(f"UPDATE {t} SET lease = %s, available_at = NOW(6) + INTERVAL 60 SECOND "
                     "WHERE id IN %s", (lease, [r[0] for r in rows]))
        self.conn.commit()
        return [(r[0], r[1]) for r in rows]

    def truncate(self, t: str) -> bool:
        """TRUNCATE t unless its lock is not had within the wait: False, try again later."""
        try:
            if self.db == "postgres":
                with self.conn.transaction():
                    self.sql("SET LOCAL lock_timeout = '200ms'")
                    self.sql(f"TRUNCATE {t}")
            else:
                self.sql("SET SESSION lock_wait_timeout = 1")
                self.sql(f"TRUNCATE TABLE {t}")
        except Exception as exc:
            # PostgreSQL's LockNotAvailable (55P03), MariaDB's lock wait timeout (1205)
            if getattr(exc, "sqlstate", None) == "55P03" or exc.args[:1] == (1205,):
                return False
            raise
        return True

    def footprint(self) -> str:
        if self.db == "postgres":
            size = sum(self.sql(f"SELECT pg_total_relation_size('{t}')")[0][0]
                       for t in self.tables)
            return f"size={size / 1e6:.1f}MB"
        history = self.sql("SELECT count FROM information_schema.INNODB_METRICS "
                           "WHERE name = 'trx_rseg_history_len'")[0][0]
        return f"history={history}"

    def reads(self) -> dict[str, int]:
        """MariaDB's running counts of the rows the churn's session read and the pages every
        session asked the buffer pool for (nothing else runs)."""
        if self.db != "mysql":
            return {}
        rows = self.sql("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_key', "
                        "'Handler_read_next', 'Innodb_buffer_pool_read_requests')")
        counts = {name: int(value) for name, value in rows}
        if self.innodb_metrics:  # every enabled counter, server-wide
            counts |= {f"innodb.{name}": int(n) for name, n in self.sql(
                "SELECT name, count FROM information_schema.INNODB_METRICS "
                "WHERE enabled = 1")}
        return counts

    # --- the churn ------------------------------------------------------------------------

    def fill(self) -> None:
        t0 = time.perf_counter()
        t = self.tables[self.current]
        self.dirty.add(t)
        self.insert(t)
        self.taken += SEGMENT
        if self.variant == "rotate" and self.taken >= self.rotate_rows:
            self.current, self.taken = 1 - self.current, 0
        self.spent["fill"] += time.perf_counter() - t0

    def claim(self, t: str) -> int:
        t0 = time.perf_counter()
        lease = uuid.uuid4().int >> 65
        rows = self.lease(t, self.floor[t] if self.variant != "start" else self.start, lease)
        t1 = time.perf_counter()
        self.spent["claim"] += t1 - t0
        if not rows:
            return 0
        if self.variant != "start":
            self.floor[t] = min((at, i) for i, at in rows)
        self.sql(f"DELETE FROM {t} WHERE id IN %s AND lease = %s" if self.db == "mysql" else
                 f"DELETE FROM {t} WHERE id = ANY(%s) AND lease = %s",
                 ([i for i, _ in rows], lease))
        self.spent["ack"] += time.perf_counter() - t1
        return len(rows)

    def drain(self) -> int:
        """Drains every table, the one not taking fills first; truncates it once empty."""
        done = 0
        other = self.tables[1 - self.current] if self.variant == "rotate" else None
        for t in ([other] if other else []) + [self.tables[self.current]]:
            while n := self.claim(t):
                done += n
            if t == other and t in self.dirty:
                t0 = time.perf_counter()
                if not self.sql(f"SELECT 1 FROM {t} LIMIT 1") and self.truncate(t):
                    self.truncates += 1
                    self.floor[t] = self.start
                    self.dirty.discard(t)
                self.spent["truncate"] += time.perf_counter() - t0
        return done

    def phase(self, seconds: float, held: bool) -> float:
        ready, stop = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold, args=(self.target, ready, stop))
        if held:
            holder.start()
            ready.wait()
        self.spent = dict.fromkeys(self.spent, 0.0)
        reads0 = self.reads()
        rates: list[float] = []
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s0 = time.perf_counter()
            self.fill()
            n = self.drain()
            done += n
            rates.append(n / (time.perf_counter() - s0))
        rate = done / (time.perf_counter() - t0)
        footprint = self.footprint()
        moved = {name: (n - reads0.get(name, 0)) / max(done, 1)
                 for name, n in self.reads().items()}
        # InnoDB's counters only where they moved by a tenth a message or more.
        per_msg = " ".join(f"{name}/msg={d:.1f}" for name, d in moved.items()
                           if not name.startswith("innodb.") or abs(d) >= 0.1)
        if held:
            stop.set()
            holder.join()
        split = " ".join(f"{k}={v:.1f}s" for k, v in self.spent.items())
        print(f"{self.db} {self.variant} held={held} rate={rate:,.0f}/s segments first/last/min "
              f"{rates[0]:,.0f}/{rates[-1]:,.0f}/{min(rates):,.0f} {footprint} "
              f"truncates so far={self.truncates} {split} {per_msg}", flush=True)
        return rate

    def close(self) -> None:
        for t in self.tables:
            self.sql(f"DROP TABLE IF EXISTS {t}")
        if self.db == "postgres":
            self.sql(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
        self.conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("postgres", "mysql"), required=True)
    ap.add_argument("--variant", choices=("start", "floor", "rotate"), required=True)
    ap.add_argument("--address", help="HOST:PORT (default 127.0.0.1:5432 or :3306)")
    ap.add_argument("--phase-s", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rotate-rows", type=int, default=100_000)
    ap.add_argument("--isolation", choices=("read-committed", "repeatable-read"),
                    default="read-committed", help="MariaDB: the churn's isolation level")
    ap.add_argument("--innodb-metrics", action="store_true",
                    help="MariaDB: also print each enabled INNODB_METRICS counter a message "
                    "(enable them with innodb_monitor_enable=all, a global setting: on a "
                    "server of your own, not a shared one)")
    a = ap.parse_args()
    address = a.address or ("127.0.0.1:5432" if a.db == "postgres" else "127.0.0.1:3306")
    probe = Probe(a.db, address, a.variant, a.rotate_rows,
                  a.isolation.replace("-", " ").upper(), a.innodb_metrics)
    try:
        probe.fill()
        probe.drain()
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(a.rounds):
            for held in (False, True):
                rates[held].append(probe.phase(a.phase_s, held))
                if a.db == "mysql":
                    time.sleep(5)  # purge catches up a little between phases
        unheld, held_rate = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"RESULT {a.db} {a.variant} {a.isolation}: unheld {unheld:,.0f} "
              f"held {held_rate:,.0f} ratio {held_rate / unheld:.2f}")
    finally:
        probe.close()


if __name__ == "__main__":
    main()
