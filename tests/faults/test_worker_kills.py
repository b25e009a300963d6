"""Worker processes killed with kill -9, on every database (throwaway servers): at random
moments under load (F1), at precise points of a delivery (F2, and F11 for exactly-once
handlers killed between their write and the commit), poison messages (W1), and a worker
that crash-loops while holding a prefetched batch (W4). Each test prints its checker line."""

from __future__ import annotations

import math
import random
import time
from collections import Counter

import pytest
from checker import Fault
from history import History, read_records
from workerfaults import (
    Fleet,
    Producer,
    collect,
    dead_without_a_run,
    deliveries_by_value,
    forbidden_lines,
    lease_lapses,
    log_lines,
    n_faults,
    n_messages,
    prefill,
    prepare,
    report,
    scaled,
    wait_drained,
)

from tableq.testing import wait_until

pytestmark = pytest.mark.slow


def test_f1_random_kills_under_load(fault_db, tmp_path):
    """F1: two `tableq worker` processes and one `--processes 2` supervisor drain both
    topics while a producer sends; a random worker process is killed with -9 every 1-2.5 s
    and restarted (the supervisor replaces its own children)."""
    db, n, kills = fault_db, n_messages(1000), n_faults(6)
    prepare(db)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "2", "FAULT_SLEEP_S": "0.004"},
                  slots=[[], [], ["--processes", "2"]])
    producer = Producer(db, tmp_path / "sends.jsonl", ["alo", "eo"], n, batch=25,
                        duration_s=4.0 + 2.0 * kills)
    rng = random.Random(1)
    faults: list[Fault] = []
    fleet.start()
    try:
        producer.start()
        for _ in range(kills):
            time.sleep(rng.uniform(1.0, 2.5))
            t = time.time()
            if fleet.kill_random(rng) is not None:
                faults.append(Fault("kill -9", t, t))
            fleet.revive()
        producer.join(scaled(120))
        assert producer.error is None and not producer.is_alive()
        wait_drained(db, ["alo", "eo"], timeout_s=scaled(120))
        fleet.wait_whole()
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0, 0, 0], codes
    assert forbidden_lines(fleet.logs()) == []
    for topic in ("alo", "eo"):
        result = collect("F1", db, tmp_path, topic, faults=faults)
        report(result)
        # A message running when its worker is killed spends that attempt (as with every
        # queue that counts deliveries); one that never ran must never be dead-lettered.
        assert dead_without_a_run(db, tmp_path, topic) == []


POINTS_ALO = ("received", "handler", "before_ack")


def test_f2_f11_kills_at_precise_points(fault_db, tmp_path):
    """F2: at-least-once handlers kill their own process right after receive, mid-handler,
    and after their effect committed but before the ack. F11: exactly-once handlers kill it
    after writing their effect inside the transaction, before the commit: exactly one
    committed effect per message. Each planned value kills its worker once."""
    db, n = fault_db, n_messages(120)
    prepare(db)
    every = max(2, n // n_faults(6))
    kill_alo = {p: [f"alo-{i}" for i in range(0, n, every) if (i // every) % 3 == k]
                for k, p in enumerate(POINTS_ALO)}
    kill_eo = [f"eo-{i}" for i in range(every // 2, n, every)]
    plan = ";".join(f"{p}={','.join(vs)}" for p, vs in kill_alo.items())
    plan += ";after_write=" + ",".join(kill_eo)
    prefill(db, tmp_path, ["alo", "eo"], n)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "1", "FAULT_SLEEP_S": "0.004",
                                 "FAULT_KILL": plan}, slots=[[], []])
    fleet.start()
    try:
        deadline = time.monotonic() + scaled(180)
        q = db.queue()
        try:
            while any(q.stats(t)[0].live for t in ("alo", "eo")):
                assert time.monotonic() < deadline, f"not drained in {scaled(180):.0f} s"
                fleet.revive()
                time.sleep(0.1)
        finally:
            q.close()
        codes = fleet.stop()
    finally:
        fleet.kill_all()
    assert codes == [0, 0], codes
    assert forbidden_lines(fleet.logs()) == []
    kills = [r for r in read_records(sorted(tmp_path.glob("deliver-*.jsonl")))
             if r.get("op") == "kill"]
    planned = {v for vs in (*kill_alo.values(), kill_eo) for v in vs}
    assert sorted(k["value"] for k in kills) == sorted(planned)  # each killed exactly once
    by_point = Counter(k["point"] for k in kills)
    alo = collect("F2", db, tmp_path, "alo", faults=[
        Fault("kill -9", k["t"], k["t"]) for k in kills if k["value"].startswith("alo-")],
        note=f"after receive {by_point['received']}, mid-handler {by_point['handler']}, "
             f"between effect and ack {by_point['before_ack']}")
    report(alo)
    eo = collect("F11", db, tmp_path, "eo", faults=[
        Fault("kill -9", k["t"], k["t"]) for k in kills if k["value"].startswith("eo-")],
        note="each between the handler's write and the commit")
    report(eo)
    # Kills this dense can dead-letter a message that was running at several of them; never
    # one that never ran.
    assert dead_without_a_run(db, tmp_path, "alo") == []
    assert dead_without_a_run(db, tmp_path, "eo") == []
    # Exactly one committed effect per exactly-once message, including every killed one.
    assert not eo.duplicated and not eo.lost


def test_w1_poison_dead_lettered_after_exactly_max_attempts(fault_db, tmp_path):
    """W1: handlers that always raise are dead-lettered after exactly max_attempts runs,
    with the last run's error; everything else is processed; no crash loop. An attempt may
    go without a run only where the worker's log shows that message's lease lost (a lease
    that ran out before its handler started counts, as a receive does in SQS); the lease is
    long (nothing here needs one to run out), so that takes a stall of seconds."""
    db, n, max_attempts = fault_db, n_messages(200), 4
    prepare(db)
    poison = [f"alo-{i}" for i in range(0, n, 20)] + [f"eo-{i}" for i in range(7, n, 20)]
    prefill(db, tmp_path, ["alo", "eo"], n)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "10", "FAULT_SLEEP_S": "0.002",
                                 "FAULT_POISON": ",".join(poison), "FAULT_RETRY_S": "0.1",
                                 "FAULT_MAX_ATTEMPTS": str(max_attempts)},
                  slots=[["--burst"]])
    fleet.start()
    try:
        assert fleet.slots[0].proc is not None
        code = fleet.slots[0].proc.wait(120)
    finally:
        fleet.kill_all()
    assert code == 0
    runs = deliveries_by_value(tmp_path)
    short: Counter[str] = Counter()  # per topic: dead letters with an attempt lost to a lapse
    q = db.queue()
    try:
        for topic in ("alo", "eo"):
            lapsed = lease_lapses(tmp_path, topic)
            for d in q.dead_letters(topic, limit=10_000):
                v = d.payload["v"]
                assert v in poison
                unrun = max_attempts - len(runs[v])
                assert d.attempts == max_attempts and 0 <= unrun <= lapsed[d.id], (
                    v, d, runs[v], log_lines(tmp_path, topic, d.id))
                assert d.error is not None and f"failed on attempt {max_attempts}" in d.error
                short[topic] += unrun > 0
    finally:
        q.close()
    for topic in ("alo", "eo"):
        p = [v for v in poison if v.startswith(topic)]
        lapses = f" ({short[topic]} a run short: a lease lost before the start)" \
            if short[topic] else ""
        result = collect("W1", db, tmp_path, topic,
                         faults=[Fault("poison message", math.inf, math.inf)] * len(p),
                         note=f"each dead-lettered after exactly {max_attempts} runs{lapses}, "
                              "last error kept")
        report(result)
        assert result.dead == len(p)


def test_w4_crash_looping_worker_spends_no_attempts_it_did_not_start(fault_db, tmp_path):
    """W4: a worker holding a batch of 10 (one running, nine prefetched) is killed with -9
    six times in a row; then a message that kills its worker whenever it runs is added. With
    max_attempts 5, every dead-lettered message was started exactly 5 times: none that was
    only held. (Charged at receive, all ten would be dead after five kills, nine of them
    never started.)"""
    db, max_attempts, cycles = fault_db, 5, n_faults(6)
    prepare(db)
    prefill(db, tmp_path, ["alo"], 10)
    fleet = Fleet(db, tmp_path, {"FAULT_VT_S": "1", "FAULT_SLEEP_S": "2",
                                 "FAULT_MAX_ATTEMPTS": str(max_attempts)},
                  slots=[["--topic", "alo", "--concurrency", "1", "--prefetch", "9"]])
    q = db.queue()
    try:
        def starts() -> int:
            return sum(len(r) for r in deliveries_by_value(tmp_path).values())

        for _ in range(cycles):
            before = starts()
            fleet.start()
            # Holding all ten: one handler started (and recorded) in this process, ten leased.
            wait_until(lambda b=before: starts() > b and q.stats("alo")[0].in_flight >= 9,
                       timeout=30)
            fleet.kill_all()
        assert starts() == cycles
        # The poison that kills its worker whenever it runs, first in line.
        q.send("alo", {"v": "alo-killer"}, priority=1)
        History(tmp_path / "sends.jsonl").send("alo-killer", "ok")
        fleet.env.update(FAULT_KILL_ALWAYS="alo-killer", FAULT_SLEEP_S="0.01")
        def killer_dead() -> bool:
            return any(d.payload["v"] == "alo-killer" for d in q.dead_letters("alo"))

        for _ in range(max_attempts + 1):  # each run of the killer kills its worker
            if killer_dead():
                break
            fleet.start()
            wait_until(lambda: not fleet.alive() or killer_dead(), timeout=30)
            fleet.kill_all()
        fleet.slots[0].args = ["--topic", "alo", "--burst"]
        fleet.start()
        assert fleet.slots[0].proc is not None and fleet.slots[0].proc.wait(60) == 0
        dead = q.dead_letters("alo")
    finally:
        fleet.kill_all()
        q.close()
    runs = deliveries_by_value(tmp_path)
    started = {v: len(r) for v, r in runs.items()}
    assert "alo-killer" in [d.payload["v"] for d in dead]
    for d in dead:
        assert d.attempts == max_attempts == started.get(d.payload["v"]), (d, started)
    never_started = [d for d in dead if d.payload["v"] not in started]
    result = collect("W4", db, tmp_path, "alo", faults=[Fault("kill -9", math.inf, math.inf)] * (
        cycles + started["alo-killer"]), note=f"{len(never_started)} never-started "
        f"dead-lettered; {len(dead)} dead-lettered, each after exactly {max_attempts} runs")
    report(result)
    assert never_started == []
