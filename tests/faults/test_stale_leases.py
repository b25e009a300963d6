"""F9 and F10: a lease holder that comes back after its lease ended changes nothing.

- F10 (deterministic, through the API, under the test clock): receive, move the clock past
  the lease, receive again (a new holder), then the old delivery's ack / nack / heartbeat /
  dead_letter must each raise LeaseLost and leave every row as it was; the new holder's acks
  then all succeed.
- F9 (a real pause): a lease-holding process is stopped with SIGSTOP for twice its visibility
  timeout while another consumer takes its messages over, then resumed with SIGCONT: 100% of
  its late heartbeats, acks and nacks get LeaseLost and change no row.

Each prints its checker line: a message counts as processed when an ack of it succeeded, so
an ack that got through on a stale lease would show up as a duplicate.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checker import Effect, Fault, SendOp, check
from history import read_records
from sizes import size

import tableq
from tableq.testing import advance_clock, wait_until

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _dialect(url: str) -> str:
    return url.split(":", 1)[0].replace("postgresql", "postgres")


def _rows(q: tableq.Queue, topic: str) -> list[tuple[object, ...]]:
    """What a stale operation must not change: every live row's id, attempts, due time,
    error and progress, in delivery order."""
    return [(m.id, m.attempts, m.available_at, m.last_error, m.progress)
            for m in q.peek(topic, limit=10_000)]


def test_f10_stale_settles_through_the_api(db_url: str) -> None:
    n = size("f10_n", 1000)
    vt = 5.0
    q = tableq.connect(db_url, migrate=True, test_clock=True)
    sends: list[SendOp] = []
    effects: list[Effect] = []
    rejected = 0
    ops = ("ack", "nack", "heartbeat", "dead_letter")
    try:
        batch = 250
        for start in range(0, n, batch):
            values = [f"m{i}" for i in range(start, min(n, start + batch))]
            q.send_many("t", [{"v": v} for v in values])
            sends += [SendOp(v, "ok") for v in values]
            old = q.receive("t", max=len(values), visibility_timeout=vt)
            advance_clock(q, vt + 1)  # the first leases are over
            new = q.receive("t", max=len(values), visibility_timeout=vt)
            assert {m.id for m in new} == {m.id for m in old}
            before = _rows(q, "t")
            stats_before = q.stats("t")
            for i, m in enumerate(old):
                op = ops[i % len(ops)]
                with pytest.raises(tableq.LeaseLost):
                    if op == "ack":
                        q.ack(m)
                    elif op == "nack":
                        q.nack(m, delay=1, error="stale")
                    elif op == "heartbeat":
                        q.heartbeat(m, extend=60, progress={"stale": True})
                    else:
                        q.dead_letter(m, "stale")
                rejected += 1
            assert _rows(q, "t") == before, "a stale operation changed a row"
            assert q.stats("t") == stats_before
            q.ack_many(new)  # the new holder still holds every lease
            effects += [Effect(m.payload["v"], m.lease) for m in new]
        s = q.stats("t")[0]
        assert (s.ready, s.scheduled, s.in_flight, s.dead) == (0, 0, 0, 0)
    finally:
        q.close()
    result = check("F10", _dialect(db_url), sends=sends, effects=effects,
                   note=f"{rejected} stale settles of {n} -> {rejected} LeaseLost, "
                        "0 rows changed")
    print("\n" + result.line())
    assert rejected == n
    assert result.ok, result.explain()


def _holder(url: str, topic: str, path: Path, vt: float, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)])}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(HERE / "_lease_holder.py"), url, topic,
                                 str(path), str(vt)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def test_f9_paused_holder_gets_lease_lost(db_url: str, tmp_path: Path) -> None:
    per_pause, pauses = size("f9_per_pause", 40), size("f9_pauses", 3)
    vt = 1.5
    rng = random.Random(9)
    q = tableq.connect(db_url, migrate=True)
    path, log = tmp_path / "history.jsonl", tmp_path / "holder.log"
    holder = _holder(db_url, "t", path, vt, log)
    sends: list[SendOp] = []
    faults: list[Fault] = []
    taken: list[tuple[float, set[int]]] = []  # per pause: (resumed at, ids taken over)
    effects: list[Effect] = []
    changed = 0
    try:
        for p in range(pauses):
            values = [f"p{p}m{i}" for i in range(per_pause)]
            q.send_many("t", [{"v": v} for v in values])
            sends += [SendOp(v, "ok") for v in values]
            # Pause it in the work of a random one of its next messages, holding leases.
            _pause_while_working(holder, path, rng.randint(1, 6), log)
            stopped, db_stopped = time.time(), q.now()
            # Twice the visibility timeout on the database clock: every lease it held ended;
            # then another consumer takes every due message, its old ones included.
            wait_until(lambda d=db_stopped: (q.now() - d).total_seconds() >= 2 * vt,
                       timeout=30)
            mine = q.receive("t", max=10_000, visibility_timeout=60)
            ids = {m.id for m in mine}
            before = [row for row in _rows(q, "t") if row[0] in ids]
            resumed = time.time()
            os.kill(holder.pid, signal.SIGCONT)
            faults.append(Fault("pause", stopped, resumed))
            wait_until(lambda r=resumed: any(x["t"] >= r for x in _records(path, "batch_done")),
                       timeout=30, message="the resumed holder did not finish its batch")
            after = [row for row in _rows(q, "t") if row[0] in ids]
            changed += len(set(before) ^ set(after))
            q.ack_many(mine)  # and every lease the paused holder lost is still ours
            effects += [Effect(m.payload["v"], m.lease, time.time()) for m in mine]
            taken.append((resumed, ids))
        wait_until(lambda: (lambda s: s.ready + s.in_flight + s.scheduled)(q.stats("t")[0]) == 0
                   or holder.poll() is not None, timeout=120)
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.terminate()
        holder.wait(30)
        q.close()
    records = list(read_records([path]))
    # Late: a settle by the holder, started after a pause, of a message taken over in it.
    late = [r for r in records if r.get("outcome")
            and any(r["started"] >= t and r["id"] in ids for t, ids in taken)]
    late_lost = sum(1 for r in late if r["outcome"] == "LeaseLost")
    effects += [Effect(r["value"], r["lease"], r["t"]) for r in records
                if r.get("op") == "ack" and r.get("outcome") == "ok"]
    result = check("F9", _dialect(db_url), sends=sends, effects=effects, faults=faults,
                   note=f"{late_lost} of {len(late)} late settles and heartbeats got "
                        f"LeaseLost, {changed} rows changed by them")
    print("\n" + result.line())
    assert late, "no settle happened after a pause: nothing was tested"
    assert late_lost == len(late), [r for r in late if r["outcome"] != "LeaseLost"][:5]
    assert changed == 0
    assert result.ok, result.explain()


def _pause_while_working(holder: subprocess.Popen[bytes], path: Path, skip: int,
                         log: Path) -> None:
    """SIGSTOPs the holder during the work of the skip-th message from now: its last record
    must then be `working` (after a heartbeat, before the settle), so no database call of its
    own is in flight; if it had moved on, it is resumed and stopped at the next one."""
    target = _count(path, "working") + skip
    while True:
        wait_until(lambda t=target: _count(path, "working") >= t or holder.poll() is not None,
                   timeout=60, interval=0.005)
        assert holder.poll() is None, log.read_text()[-2000:]
        os.kill(holder.pid, signal.SIGSTOP)
        records = list(read_records([path]))
        if records[-1].get("op") == "working":
            return
        os.kill(holder.pid, signal.SIGCONT)
        target = _count(path, "working") + 1


def _records(path: Path, op: str) -> list[dict]:
    return [r for r in read_records([path]) if r.get("op") == op]


def _count(path: Path, op: str) -> int:
    return len(_records(path, op))
