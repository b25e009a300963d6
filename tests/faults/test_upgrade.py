"""U1: upgrading schema v1 to the latest under a running worker, on every backend.

The OLD tableq (the last commit whose schema was v1 on every backend, taken from this
repository's git history) creates schema v1, fills it with live, leased, dead and acked
(retained) messages, and runs a `tableq worker`. While that worker is busy, the current
tableq migrates the database to the latest version and sends more work, and a current
`tableq worker` joins in. Then: nothing lost (every message processed or settled), the
leases taken before the upgrade still hold (no worker ran those messages, and their holder
acks them with the old lease tokens), dead letters and retained acks are untouched, and the
old worker carried on across the upgrade and stops cleanly.

PostgreSQL goes v1 -> v2 -> v3 (v2 changes how every reader finds messages: the current code
refuses the old schema with SchemaNotMigrated until it is migrated); MariaDB and SQLite go
v1 -> v3 (v3 adds the HTTP server's tables, so the current code reads a v1 queue as it is).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
from checker import Effect, SendOp, check
from history import EffectTable
from procs import HERE, SRC
from sizes import size

import tableq
from tableq.testing import wait_until

pytestmark = pytest.mark.slow
REPO = HERE.parents[1]
MIGRATIONS = "src/tableq/backends/*/migrations/"


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True,
                          capture_output=True).stdout


def old_tableq(dest: Path) -> Path:
    """src/ of the last commit before any backend had a migration after 0001."""
    later = _git("log", "--diff-filter=A", "--format=%H", "--", *(
        f"{MIGRATIONS.replace('*', db)}000[2-9]_*.sql" for db in ("postgres", "mysql",
                                                                   "sqlite"))).split()
    if not later:
        pytest.fail("no migration after 0001 in the git history: cannot find schema v1's "
                    "code", pytrace=False)
    first_later = later[-1].decode()  # git log lists newest first
    with tarfile.open(fileobj=BytesIO(_git("archive", f"{first_later}^", "src"))) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def _env(url: str, src: Path, who: str) -> dict[str, str]:
    return {**os.environ, "TABLEQ_URL": url, "WHO": who, "WORK_S": "0.01", "VT_S": "5",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(src)]), "PYTHONUNBUFFERED": "1"}


def _worker(url: str, src: Path, who: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tableq.cli", "worker", "u1_app:app",
                                 "--topic", "work"], env=_env(url, src, who), cwd=str(HERE),
                                stdout=out, stderr=subprocess.STDOUT)


def test_u1_upgrade_under_a_running_worker(db_url: str, tmp_path: Path) -> None:
    n_old, n_new = size("u1_old", 300), size("u1_new", 300)
    old_src = old_tableq(tmp_path / "old")
    leases_path, log = tmp_path / "leases.json", tmp_path / "u1.log"
    subprocess.run([sys.executable, str(HERE / "_u1_old.py"), db_url, str(n_old),
                    str(leases_path)], env=_env(db_url, old_src, "setup"), check=True,
                   capture_output=True)
    held = json.loads(leases_path.read_text())
    table = EffectTable(db_url)
    table.create()
    q = tableq.connect(db_url, retention=True)
    kept = ("poison", "finished")  # dead letters and retained acks, untouched by anything
    old_worker = _worker(db_url, old_src, "old", log)
    new_worker = None
    try:
        wait_until(lambda: len(table.read()) >= n_old // 3 or old_worker.poll() is not None,
                   timeout=120)
        assert old_worker.poll() is None, log.read_text()[-3000:]
        behind = q._backend.schema_version() < _latest(db_url)
        if behind:  # the current code on the old schema works, or says what to do
            try:
                q.stats("work")
                stats_worked = True
            except tableq.SchemaNotMigrated:  # never a raw database error
                stats_worked = False
            # PostgreSQL's v2 added the load parts every reader consults; the later versions
            # add tables only the HTTP server reads (tokens, idempotency records).
            assert stats_worked == (q.dialect != "postgres")
        done_before = len(table.read())
        applied = q.migrate()  # the current tableq, while the old worker works
        version = q._backend.schema_version()
        q.send_many("work", [{"v": f"new{i}"} for i in range(n_new)])
        new_worker = _worker(db_url, SRC, "new", log)
        values = {f"old{i}" for i in range(n_old)} | {f"new{i}" for i in range(n_new)}
        wait_until(lambda: {e.value for e in table.read()} >= values
                   or old_worker.poll() is not None, timeout=240, interval=0.2)
        assert old_worker.poll() is None, "the old worker stopped: " + log.read_text()[-3000:]
        # The last effects commit at handler start: wait for their acks too.
        wait_until(lambda: (lambda s: (s.ready, s.in_flight, s.scheduled))(
            q.stats("work")[0]) == (0, len(held), 0), timeout=60)
        effects = table.read()
        ran_held = [e.value for e in effects if e.value.startswith("held")]
        acked = q._backend.message_ack([(i, lease) for i, lease, _ in held], True)
        after = {s.topic: (s.dead, s.done) for s in q.stats() if s.topic in kept}
        work = q.stats("work")[0]
    finally:
        codes = []
        for proc in (old_worker, new_worker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            if proc is not None:
                try:
                    codes.append(proc.wait(30))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    codes.append(proc.wait(10))
        q.close()
    by_worker = {w: sum(1 for e in effects if e.value.startswith(w)) for w in ("old", "new")}
    result = check("U1", db_url.split(":", 1)[0].replace("postgresql", "postgres"),
                   sends=[SendOp(v, "ok") for v in values | {v for _, _, v in held}],
                   effects=effects + [Effect(v) for _, _, v in held], mode="at_least_once",
                   note=f"schema v1 -> v{version} (applied {applied}) after {done_before} of "
                        f"{n_old} old jobs, {len(held)} leases held across it; processed "
                        f"{by_worker['old']} sent before and {by_worker['new']} after; "
                        f"dead/done per topic after: {after}")
    print("\n" + result.line())
    assert not ran_held, f"messages leased before the upgrade were run by a worker: {ran_held}"
    assert acked == {i for i, _, _ in held}, "a lease taken before the upgrade did not hold"
    assert after == {"poison": (10, 0), "finished": (0, 20)}
    assert (work.ready, work.in_flight, work.scheduled) == (0, 0, 0), work
    assert codes == [0, 0], (codes, log.read_text()[-3000:])
    assert version == _latest(db_url)
    assert result.ok, result.explain()


def _latest(url: str) -> int:
    db = "postgres" if url.startswith("postgresql") else url.split(":", 1)[0]
    return max(int(p.name[:4]) for p in (SRC / "tableq" / "backends" / db / "migrations"
                                         ).glob("*.sql"))
