"""Running `tableq worker` processes ride out database outages without being restarted:
server crashes and restarts (F3 PostgreSQL immediate stop and kill -9 of the postmaster, F4
kill -9 of mariadbd), connections killed every ~200 ms (F5), a server stopped for longer than
the leases, and a SQLite database locked by another process past the busy timeout. Each run
prints its checker line; each asserts 0 lost and 0 duplicated (exactly-once) / 0 handed out
while leased (at-least-once), no dead letter, and that the worker logged each outage once,
not once per message."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from checker import Fault
from workerfaults import (
    DOWN_S,
    FaultDB,
    Fleet,
    Producer,
    collect,
    drop_db,
    events_in,
    forbidden_lines,
    make_db,
    n_faults,
    n_messages,
    outage_s,
    prefill,
    prepare,
    report,
    scaled,
    wait_drained,
)

import tableq
from tableq.testing import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(params=[("postgres", "immediate"), ("postgres", "kill9"), ("mysql", "kill9")],
                ids=["F3-postgres-immediate", "F3-postgres-kill9", "F4-mysql-kill9"])
def crash_case(request, pg_server, maria_server, tmp_path):
    dialect, how = request.param
    server = pg_server if dialect == "postgres" else maria_server
    db = make_db(dialect, server, tmp_path)
    try:
        yield db, how
    finally:
        if not server.is_running():
            server.start()
        drop_db(db)


def wait_recovered(fleet: Fleet, outages: int) -> None:
    """Every worker has seen the database come back from the last outage (a worker with
    nothing left to do may notice only at its next poll)."""
    wait_until(lambda: all(events_in(log, "database_reachable") >= outages
                           for log in fleet.logs()), timeout=30)


def check_outage_logs(fleet: Fleet, outages: int) -> tuple[int, int]:
    """Each worker process logged each outage once (not once per message) and nothing that
    should have been retried; returns (lease_lost lines, retried lines)."""
    logs = fleet.logs()
    assert forbidden_lines(logs) == []
    for log in logs:
        assert events_in(log, "database_unreachable") == outages, log[-3000:]
        assert events_in(log, "database_reachable") == outages
        assert events_in(log, "dead_lettered") == 0
    return (sum(events_in(log, "lease_lost") for log in logs),
            sum(events_in(log, "retried") for log in logs))


def test_f3_f4_server_crashes_under_load(crash_case, tmp_path):
    """The server is crashed and restarted every few seconds while two `tableq worker`
    processes (never restarted) drain both topics and a producer sends; sends that fail
    during an outage are recorded as unknown and not retried."""
    db, how = crash_case
    n, crashes = n_messages(1000), n_faults(3)
    prepare(db)
    assert db.server is not None
    prefill(db, tmp_path, ["alo", "eo"], n // 2)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "10", "FAULT_SLEEP_S": "0.01",
                                 "FAULT_CONCURRENCY": "4"}, slots=[[], []])
    producer = Producer(db, tmp_path / "sends.jsonl", ["alo", "eo"], n - n // 2, batch=10,
                        duration_s=crashes * (DOWN_S + 4), first=n // 2)
    faults: list[Fault] = []
    fleet.start()
    try:
        wait_until(lambda: len(db.effects().read()) >= 20, timeout=60)
        producer.start()
        for _ in range(crashes):
            time.sleep(3.0)
            start = time.time()
            db.server.crash(how)
            time.sleep(DOWN_S)
            db.server.restart()
            faults.append(Fault("server crash", start, time.time()))
        producer.join(scaled(120))
        assert producer.error is None and not producer.is_alive()
        wait_drained(db, ["alo", "eo"], timeout_s=scaled(120))
        wait_recovered(fleet, crashes)
        assert fleet.alive()  # never exited, never restarted
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0, 0], codes
    lost_leases, retried = check_outage_logs(fleet, crashes)
    for topic in ("alo", "eo"):
        result = collect(db_test_name(db), db, tmp_path, topic, faults=faults,
                         note=f"{how}; {producer.failed} send batches failed; lease_lost "
                              f"{lost_leases}, retried {retried} in the worker logs")
        report(result)
        assert result.dead == 0


def db_test_name(db: FaultDB) -> str:
    return "F3" if db.dialect == "postgres" else "F4"


def test_f5_connections_killed_mid_statement(server_db, tmp_path):
    """F5: every ~200 ms for 40 rounds, every connection the workers hold is killed
    (PostgreSQL pg_terminate_backend, MariaDB KILL CONNECTION), mid-statement and
    mid-transaction, while two workers drain both topics; then they finish the drain."""
    db, n, max_rounds = server_db, n_messages(1000), int(scaled(40))
    prepare(db)
    prefill(db, tmp_path, ["alo", "eo"], n)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "5", "FAULT_SLEEP_S": "0.01"}, slots=[[], []])
    killed = rounds = 0
    fleet.start()
    try:
        fleet.wait_ready()  # a foreground worker fails fast if it cannot connect at start
        q = db.queue()

        def live() -> bool:
            try:
                return any(q.stats(t)[0].live for t in ("alo", "eo"))
            except tableq.DatabaseUnavailable:  # our own connection was killed too
                return True
        try:
            deadline = time.monotonic() + scaled(180)
            while live():
                assert time.monotonic() < deadline, f"not drained in {scaled(180):.0f} s"
                time.sleep(0.2)
                if rounds < max_rounds:
                    killed += db.kill_connections()
                    rounds += 1
        finally:
            q.close()
        assert fleet.alive()
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0, 0], codes
    logs = fleet.logs()
    assert forbidden_lines(logs) == []
    assert sum(events_in(log, "dead_lettered") for log in logs) == 0
    retried = sum(events_in(log, "retried") for log in logs)
    for topic in ("alo", "eo"):
        result = collect("F5", db, tmp_path, topic,
                         faults=[Fault("connection kill round", math.inf, math.inf)] * rounds,
                         note=f"{killed} connections killed in {rounds} rounds; handler "
                              f"failures that reached user code (retried): {retried}")
        report(result)
        assert result.dead == 0


def test_server_unreachable_for_longer_than_the_leases(server_db, tmp_path):
    """The server is stopped for twice the visibility timeout (the long tier: 60 s) while a
    worker holds messages: the worker does not exit, logs the outage once, and resumes; the
    acks it kept are delivered when the server is back."""
    db, n, vt = server_db, n_messages(600), 3.0
    down_s = outage_s(2 * vt)
    prepare(db)
    assert db.server is not None
    prefill(db, tmp_path, ["alo", "eo"], n)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": str(vt), "FAULT_SLEEP_S": "0.02"}, slots=[[]])
    fleet.start()
    try:
        wait_until(lambda: len(db.effects().read()) >= 50, timeout=60)
        start = time.time()
        db.server.stop()
        time.sleep(down_s)
        assert fleet.alive()
        db.server.start()
        healed = time.time()
        wait_drained(db, ["alo", "eo"], timeout_s=scaled(120))
        wait_recovered(fleet, 1)
        assert fleet.alive()
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0], codes
    lost_leases, retried = check_outage_logs(fleet, 1)
    for topic in ("alo", "eo"):
        result = collect("U60", db, tmp_path, topic, faults=[Fault("server stop", start, healed)],
                         note=f"stopped {down_s:.0f} s with vt {vt:.0f} s; lease_lost "
                              f"{lost_leases}, retried {retried}")
        report(result)
        assert result.dead == 0


LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def test_sqlite_locked_past_the_busy_timeout(tmp_path):
    """Another process holds SQLite's write lock for several busy timeouts while a worker
    drains: the worker pauses (one outage line), resumes, and loses nothing."""
    db = make_db("sqlite", None, tmp_path)
    n, lock_s = n_messages(300), 4.0
    prepare(db)
    prefill(db, tmp_path, ["alo", "eo"], n)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "10", "FAULT_SLEEP_S": "0.01",
                                 "FAULT_CONCURRENCY": "2", "FAULT_BUSY_TIMEOUT_S": "0.5"},
                  slots=[[]])
    fleet.start()
    try:
        wait_until(lambda: len(db.effects().read()) >= 50, timeout=60)
        path = db.url.split("///", 1)[1]
        start = time.time()
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, path, str(lock_s)],
                                  stdout=subprocess.PIPE)
        assert locker.stdout is not None and locker.stdout.readline().strip() == b"locked"
        assert locker.wait(lock_s + 30) == 0
        healed = time.time()
        wait_drained(db, ["alo", "eo"], timeout_s=scaled(120))
        wait_recovered(fleet, 1)
        assert fleet.alive()
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0], codes
    lost_leases, retried = check_outage_logs(fleet, 1)
    assert "kind=DatabaseBusy" in "".join(fleet.logs())
    for topic in ("alo", "eo"):
        result = collect("L-lock", db, tmp_path, topic,
                         faults=[Fault("write lock", start, healed)],
                         note=f"locked {lock_s:.0f} s, busy timeout 0.5 s; lease_lost "
                              f"{lost_leases}, retried {retried}")
        report(result)
        assert result.dead == 0
