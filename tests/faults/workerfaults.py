"""Shared machinery of the worker fault tests (F1, F2, F3/F4, F5, F11, W1, W4, the outage
and locked-database cases): databases on throwaway servers, a fleet of `tableq worker`
processes running tests/faults/apps/fault_app.py that can be killed and restarted, a producer
thread that records every send, and the collection at the end of a run that feeds the
checker. Test code: it may hold SQL and signal processes.

Sizes come from the environment, so the long tier runs the same tests bigger:
  TABLEQ_FAULT_SCALE    multiplies every message count (default 1)
  TABLEQ_FAULT_FAULTS   how many faults (crashes, kills) a test injects (default: per test)
  TABLEQ_FAULT_DOWN_S   how long a crashed server stays down (default 2)
  TABLEQ_FAULT_OUTAGE_S how long the "unreachable" case keeps the server stopped (default:
                        twice the visibility timeout; the long tier uses 60)
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from checker import Fault, Result, check
from history import EffectTable, History, read_records, read_sends
from servers import ThrowawayMariaDB, ThrowawayPostgres

import tableq
from tableq.testing import wait_until

FAULTS_DIR = Path(__file__).parent
APPS_DIR = FAULTS_DIR / "apps"
SRC_DIR = FAULTS_DIR.parents[1] / "src"
SCALE = float(os.environ.get("TABLEQ_FAULT_SCALE", "1") or 1)
DOWN_S = float(os.environ.get("TABLEQ_FAULT_DOWN_S", "2") or 2)
TOPICS = {"alo": "at_least_once", "eo": "exactly_once"}
# Worker log lines that must never appear in a fault run: an outage logged per message, or a
# failure that reached the log instead of being retried.
FORBIDDEN_EVENTS = ("settle_failed", "ack_failed", "heartbeat_failed", "fetch_failed",
                    "start_failed", "release_failed", "worker_error", "settle_abandoned",
                    "periodic_failed", "giving_up")


def n_messages(default: int) -> int:
    return max(1, int(default * SCALE))


def n_faults(default: int) -> int:
    return int(os.environ.get("TABLEQ_FAULT_FAULTS") or default)


def outage_s(default: float) -> float:
    return float(os.environ.get("TABLEQ_FAULT_OUTAGE_S") or default)


def scaled(seconds: float) -> float:
    """A time limit for draining, grown with the message counts."""
    return seconds * max(1.0, SCALE)


# --- databases ------------------------------------------------------------------------------


@dataclass
class FaultDB:
    """One fresh queue database for one test: a SQLite file, or a schema / database on a
    throwaway server."""

    dialect: str
    url: str
    server: ThrowawayPostgres | ThrowawayMariaDB | None
    name: str

    def queue(self, **options: Any) -> tableq.Queue:
        return tableq.connect(self.url, **options)

    def effects(self) -> EffectTable:
        return EffectTable(self.url)

    def kill_connections(self) -> int:
        """Kills every connection tableq's workers and producers hold to this database (not
        the test's own admin session): PostgreSQL pg_terminate_backend on application_name
        tableq, MariaDB KILL CONNECTION on every session of this database."""
        assert self.server is not None
        if isinstance(self.server, ThrowawayPostgres):
            rows = self.server.sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'tableq' AND pid <> pg_backend_pid()")
            return int(rows[0][0])
        conn = self.server.admin()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s "
                            "AND id <> CONNECTION_ID()", (self.name,))
                ids = [r[0] for r in cur.fetchall()]
                killed = 0
                for i in ids:
                    try:
                        cur.execute(f"KILL CONNECTION {int(i)}")
                        killed += 1
                    except Exception:  # noqa: BLE001 - it ended by itself meanwhile
                        pass
                return killed
        finally:
            conn.close()


def make_db(dialect: str, server: ThrowawayPostgres | ThrowawayMariaDB | None,
            tmp_path: Path) -> FaultDB:
    name = "tqf_" + uuid.uuid4().hex[:10]
    if dialect == "sqlite":
        return FaultDB("sqlite", f"sqlite:///{tmp_path}/{name}.db", None, name)
    assert server is not None
    return FaultDB(dialect, server.url(name), server, name)


def drop_db(db: FaultDB) -> None:
    try:
        if isinstance(db.server, ThrowawayPostgres):
            db.server.sql(f'DROP SCHEMA IF EXISTS "{db.name}" CASCADE')
        elif isinstance(db.server, ThrowawayMariaDB):
            db.server.sql(f"DROP DATABASE IF EXISTS `{db.name}`")
    except Exception:  # noqa: BLE001 - the server owns nothing else; it is destroyed later
        pass


class _LazyServers:
    """Throwaway servers shared by the tests that do not crash them, started on first use
    and destroyed at the end of the session."""

    def __init__(self) -> None:
        self._servers: dict[str, ThrowawayPostgres | ThrowawayMariaDB] = {}

    def get(self, dialect: str) -> ThrowawayPostgres | ThrowawayMariaDB:
        if dialect not in self._servers:
            server = ThrowawayPostgres() if dialect == "postgres" else ThrowawayMariaDB()
            server.start()
            self._servers[dialect] = server
        return self._servers[dialect]

    def destroy(self) -> None:
        for server in self._servers.values():
            server.destroy()
        self._servers.clear()


@pytest.fixture(scope="session")
def shared_servers() -> Iterator[_LazyServers]:
    servers = _LazyServers()
    try:
        yield servers
    finally:
        servers.destroy()


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def fault_db(request: pytest.FixtureRequest, shared_servers: _LazyServers,
             tmp_path: Path) -> Iterator[FaultDB]:
    """A fresh queue database per test, on every backend (servers shared, never crashed)."""
    server = None if request.param == "sqlite" else shared_servers.get(request.param)
    db = make_db(request.param, server, tmp_path)
    try:
        yield db
    finally:
        drop_db(db)


@pytest.fixture(params=["postgres", "mysql"])
def server_db(request: pytest.FixtureRequest, shared_servers: _LazyServers,
              tmp_path: Path) -> Iterator[FaultDB]:
    """As fault_db, on the server databases only (faults that SQLite does not have)."""
    db = make_db(request.param, shared_servers.get(request.param), tmp_path)
    try:
        yield db
    finally:
        drop_db(db)


def prepare(db: FaultDB) -> None:
    """Migrates the queue and creates the effect table."""
    tableq.connect(db.url, migrate=True).close()
    db.effects().create()


# --- worker processes ---------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Live child processes of pid (from /proc: no psutil needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def logs_info(s: Slot) -> bool:
    """Whether the slot's worker logs INFO lines (`--log-level`, INFO by default)."""
    level = s.args[s.args.index("--log-level") + 1] if "--log-level" in s.args else "INFO"
    return level.upper() in ("DEBUG", "INFO")


@dataclass
class Slot:
    """One `tableq worker` command line the fleet keeps running (or restarts on demand)."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0


class Fleet:
    """`tableq worker fault_app:app` processes, each logging to its own file in `workdir`."""

    def __init__(self, db: FaultDB, workdir: Path, env: dict[str, str],
                 slots: Iterable[list[str]] = ([],)) -> None:
        self.db, self.workdir = db, workdir
        self.env = {**os.environ, "TABLEQ_URL": db.url, "FAULT_DIR": str(workdir),
                    "PYTHONPATH": os.pathsep.join([str(APPS_DIR), str(FAULTS_DIR), str(SRC_DIR),
                                                   os.environ.get("PYTHONPATH", "")]),
                    **env}
        self.env.pop("TABLEQ_WORKER_PARENT", None)
        self.slots = [Slot(list(a)) for a in slots]

    def start(self, slot: Slot | None = None) -> None:
        for s in [slot] if slot else self.slots:
            s.starts += 1
            log = self.workdir / f"worker-{self.slots.index(s)}-{s.starts}.log"
            with open(log, "ab") as out:
                s.proc = subprocess.Popen(
                    [sys.executable, "-m", "tableq.cli", "worker", "fault_app:app", *s.args],
                    env={**self.env, **s.env}, cwd=str(APPS_DIR), stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True)

    def worker_pids(self) -> list[int]:
        """Pids running handlers: standalone workers and the children of supervisors."""
        return [pid for s in self.slots for pid in self._slot_pids(s)]

    @staticmethod
    def _slot_pids(s: Slot) -> list[int]:
        if s.proc is None or s.proc.poll() is not None:
            return []
        return children_of(s.proc.pid) if "--processes" in s.args else [s.proc.pid]

    def kill_random(self, rng: random.Random) -> int | None:
        pids = self.worker_pids()
        if not pids:
            return None
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return pid

    def revive(self) -> int:
        """Restarts standalone workers that died (supervisors restart their own children)."""
        n = 0
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is not None:
                self.start(s)
                n += 1
        return n

    def expected_workers(self) -> int:
        return sum(int(s.args[s.args.index("--processes") + 1]) if "--processes" in s.args
                   else 1 for s in self.slots)

    def wait_whole(self, timeout_s: float = 60.0) -> None:
        """Waits until every worker process is up again (supervisors replace killed
        children after a delay), so a stop does not meet a child just killed."""
        wait_until(lambda: self.revive() >= 0
                   and len(self.worker_pids()) == self.expected_workers(), timeout=timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Waits until every worker process alive now has logged worker_started (its signal
        handlers are in place: one signalled earlier would die of the signal). fault_app puts
        the process id in every log line. A slot started with `--log-level WARNING` (the
        soak's) never logs that INFO line, so it is not waited for: waiting would only time
        out."""
        def ready() -> bool:
            started = set(re.findall(r" (\d+) INFO tableq\.worker worker_started\b",
                                     "".join(self.logs())))
            return all(str(pid) in started for s in self.slots if logs_info(s)
                       for pid in self._slot_pids(s))
        wait_until(ready, timeout=timeout_s)

    def alive(self) -> bool:
        return all(s.proc is not None and s.proc.poll() is None for s in self.slots)

    def stop(self, timeout_s: float = 60.0) -> list[int | None]:
        self.wait_ready()
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        codes = []
        for s in self.slots:
            if s.proc is None:
                codes.append(None)
                continue
            try:
                s.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(s.proc.pid, signal.SIGKILL)
                s.proc.wait(10)
            codes.append(s.proc.returncode)
        return codes

    def kill_all(self) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                os.killpg(s.proc.pid, signal.SIGKILL)
                s.proc.wait(10)

    def logs(self) -> list[str]:
        return [p.read_text(errors="replace")
                for p in sorted(self.workdir.glob("worker-*.log"))]


def events_in(log: str, event: str, levels: str = "INFO|WARNING|ERROR") -> int:
    return len(re.findall(rf" (?:{levels}) tableq\.worker {re.escape(event)}\b", log))


def forbidden_lines(logs: Iterable[str]) -> list[str]:
    pattern = re.compile(r" (?:WARNING|ERROR) tableq\.worker (" + "|".join(FORBIDDEN_EVENTS)
                         + r")\b")
    return [line for log in logs for line in log.splitlines() if pattern.search(line)]


# --- producers ----------------------------------------------------------------------------


class Producer(threading.Thread):
    """Sends `n` values per topic ("<topic>-<i>", as {"v": value}) in batches, spread over
    about `duration_s`, recording each send's outcome: ok, or info when it failed with the
    outcome unknown (a failed send is not retried: the checker counts only acknowledged sends
    as owed, and reports how many of the unknown ones arrived anyway)."""

    def __init__(self, db: FaultDB, history_path: Path, topics: Iterable[str], n: int, *,
                 batch: int = 20, duration_s: float = 0.0, first: int = 0) -> None:
        super().__init__(daemon=True)
        self.db, self.topics, self.n, self.batch = db, list(topics), n, batch
        self.first = first  # values are <topic>-<first> .. <topic>-<first + n - 1>
        self.history = History(history_path, "producer")
        # One round sends a batch to every topic; rounds are paced on a schedule, so the
        # time the sends take does not add up (nor does a topic count as a round of its own).
        self.interval_s = duration_s / max(1, math.ceil(n / batch))
        self.failed = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        """Sends no further batch (the ones sent stay in the history)."""
        self._halt.set()

    def run(self) -> None:
        try:
            q = self.db.queue()
            try:
                began = time.monotonic()
                for k, start in enumerate(range(0, self.n, self.batch)):
                    if self._halt.is_set():
                        break
                    for topic in self.topics:
                        values = [f"{topic}-{self.first + i}"
                                  for i in range(start, min(self.n, start + self.batch))]
                        self._send(q, topic, values)
                    time.sleep(max(0.0, began + (k + 1) * self.interval_s - time.monotonic()))
            finally:
                q.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test via .error
            self.error = exc

    def _send(self, q: tableq.Queue, topic: str, values: list[str]) -> None:
        try:
            q.send_many(topic, [{"v": v} for v in values])
        except tableq.TableqError:
            self.failed += 1
            for v in values:
                self.history.send(v, "info")
            time.sleep(0.2)
            return
        for v in values:
            self.history.send(v, "ok")


def prefill(db: FaultDB, workdir: Path, topics: Iterable[str], n: int) -> None:
    """Sends n values per topic before the workers start (all acknowledged)."""
    p = Producer(db, workdir / "sends.jsonl", topics, n, batch=500)
    p.run()
    if p.error is not None:
        raise p.error
    assert p.failed == 0


# --- the end of a run ----------------------------------------------------------------------


def wait_drained(db: FaultDB, topics: Iterable[str], timeout_s: float) -> None:
    q = db.queue()
    try:
        wait_until(lambda: all(q.stats(t)[0].live == 0 for t in topics), timeout=timeout_s)
    finally:
        q.close()


def collect(test: str, db: FaultDB, workdir: Path, topic: str, *,
            faults: Iterable[Fault] = (), note: str = "") -> Result:
    """Checks one topic of a run: sends from the producers' history, effects from the effect
    table, dead letters from the queue, deliveries from the handlers' history."""
    prefix = f"{topic}-"
    sends = [s for s in read_sends([workdir / "sends.jsonl"]) if s.value.startswith(prefix)]
    effects = [e for e in db.effects().read() if e.value.startswith(prefix)]
    q = db.queue()
    try:
        dead = [d.payload["v"] for d in q.dead_letters(topic, limit=100_000)]
    finally:
        q.close()
    deliveries = sum(1 for r in read_records(sorted(workdir.glob("deliver-*.jsonl")))
                     if r.get("op") == "deliver" and r["value"].startswith(prefix))
    return check(test, db.dialect, sends=sends, effects=effects, dead=dead,
                 deliveries=deliveries, faults=list(faults), mode=TOPICS[topic], note=note)


def dead_without_a_run(db: FaultDB, workdir: Path, topic: str) -> list[str]:
    """Dead-lettered values whose processing never began: neither the handler's history nor
    the worker's log (`received`: charged, then the handler called or, exactly-once, its
    transaction opened) shows a run. Attempt accounting must never produce one: a worker
    killed while holding prefetched messages spends no last attempt."""
    runs = deliveries_by_value(workdir)
    received = {int(i) for log in sorted(workdir.glob("worker-*.log"))
                for i in re.findall(rf" received topic={re.escape(topic)} id=(\d+) ",
                                    log.read_text(errors="replace"))}
    q = db.queue()
    try:
        return [d.payload["v"] for d in q.dead_letters(topic, limit=100_000)
                if d.payload["v"] not in runs and d.id not in received]
    finally:
        q.close()


def lease_lapses(workdir: Path, topic: str) -> Counter[int]:
    """How often each message of `topic` (by id) lost its lease, by the workers' logs: an
    attempt whose lease ran out before its handler started is spent without a run (the
    lease's holder was too slow to extend it, e.g. a disk stall holding SQLite's lock)."""
    return Counter(int(i) for log in sorted(workdir.glob("worker-*.log"))
                   for i in re.findall(rf" lease_lost topic={re.escape(topic)} id=(\d+) ",
                                       log.read_text(errors="replace")))


def log_lines(workdir: Path, topic: str, msg_id: int) -> list[str]:
    """The workers' log lines about one message (for a failed assertion's message)."""
    mark = f" topic={topic} id={msg_id} "
    return [line for log in sorted(workdir.glob("worker-*.log"))
            for line in log.read_text(errors="replace").splitlines() if mark in line]


def deliveries_by_value(workdir: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in read_records(sorted(workdir.glob("deliver-*.jsonl"))):
        if r.get("op") == "deliver":
            out.setdefault(r["value"], []).append(r)
    return out


def report(result: Result) -> None:
    """Prints the checker line (pytest -s and the CI log show it) and asserts the run."""
    print(result.line(), flush=True)
    assert result.ok, result.explain()
