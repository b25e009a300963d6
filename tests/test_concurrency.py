"""Many processes at once, on every backend: no message lost, none delivered twice while its
lease lives, dedup holds under concurrent senders, migrations can race."""

from __future__ import annotations

import multiprocessing as mp
import random
from collections import Counter

import pytest

import tableq

CTX = mp.get_context("fork")


def _drain(url: str, topic: str, out: mp.Queue) -> None:
    seen: list[int] = []
    with tableq.connect(url) as q:
        idle = 0
        while idle < 3:
            msgs = q.receive(topic, max=10, visibility_timeout=120)
            if not msgs:
                idle += 1
                continue
            idle = 0
            seen.extend(m.id for m in msgs)
            q.ack_many(msgs)
    out.put(seen)


def _run_all(target, args_list) -> list:  # type: ignore[no-untyped-def]
    out: mp.Queue = CTX.Queue()
    procs = [CTX.Process(target=target, args=(*args, out)) for args in args_list]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.slow
def test_eight_receiver_processes_drain_without_loss_or_double_delivery(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True) as q:
        sent = [r.id for r in q.send_many("drain", ({"n": i} for i in range(10_000)))]
    results = _run_all(_drain, [(db_url, "drain")] * 8)
    delivered = Counter(i for seen in results for i in seen)
    lost = set(sent) - set(delivered)
    twice = [i for i, n in delivered.items() if n > 1]
    assert (len(lost), len(twice)) == (0, 0), f"lost={len(lost)} delivered_twice={len(twice)}"
    assert sum(1 for seen in results if seen) >= 2  # the work really was shared
    with tableq.connect(db_url) as q:
        assert q.stats("drain")[0].live == 0


def _send_keys(url: str, seed: int, out: mp.Queue) -> None:
    keys = [f"key-{i}" for i in range(300)]
    random.Random(seed).shuffle(keys)
    statuses: Counter = Counter()
    with tableq.connect(url) as q:
        for k in keys:
            statuses[q.send("dedup", {"k": k, "from": seed}, key=k).status] += 1
    out.put(dict(statuses))


@pytest.mark.slow
def test_concurrent_senders_of_the_same_keys_make_one_live_message_each(db_url: str) -> None:
    tableq.connect(db_url, migrate=True).close()
    results = _run_all(_send_keys, [(db_url, seed) for seed in range(4)])
    total = Counter()
    for r in results:
        total.update(r)
    assert total == {"sent": 300, "duplicate": 900}
    with tableq.connect(db_url) as q:
        live = q.peek("dedup", limit=10_000)
        assert len(live) == 300 and len({m.key for m in live}) == 300


def _migrate(url: str, out: mp.Queue) -> None:
    with tableq.connect(url) as q:
        out.put(q.migrate())


def test_concurrent_migrations_apply_each_version_once(db_url: str) -> None:
    results = _run_all(_migrate, [(db_url,)] * 4)
    applied = sorted(v for r in results for v in r)
    assert applied == list(range(1, len(applied) + 1))  # each version once, none skipped
    with tableq.connect(db_url) as q:
        assert q.migrate() == [] and q.backend.schema_version() == applied[-1]
        q.send("after", 1)
        assert q.receive("after")[0].payload == 1


def _kill_sessions(q: tableq.Queue) -> None:
    """Ends every other session of this database user from the server side, as a restart or
    an operator's kill would."""
    from dbhelpers import driver_connection

    admin = driver_connection(q.backend.url.raw)
    cur = admin.cursor()
    if q.dialect == "postgres":
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'tableq' AND pid <> pg_backend_pid()")
    else:
        cur.execute("SELECT id FROM information_schema.processlist "
                    "WHERE db = DATABASE() AND id <> CONNECTION_ID()")
        for (pid,) in cur.fetchall():
            cur.execute(f"KILL CONNECTION {int(pid)}")
    admin.commit()
    admin.close()


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
def test_connections_killed_by_the_server_are_replaced_not_surfaced(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True) as q:
        q.send("k", 1)
        q.stats()
        _kill_sessions(q)
        from tableq.testing import wait_until

        wait_until(lambda: all(q.backend.pool._stale(c) for c in q.backend.pool._idle),
                   timeout=5)
        assert q.send("k", 2).status == "sent"  # no DatabaseUnavailable reaches the caller
        assert [m.payload for m in q.receive("k", max=5)] == [1, 2]
