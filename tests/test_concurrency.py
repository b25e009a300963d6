"""Many processes at once, on every backend: no message lost, none delivered twice while its
lease lives, dedup holds under concurrent senders, migrations can race."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import tableq
from tableq.testing import wait_until
from tableq.url import parse_url

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
    return _run_each([(target, args) for args in args_list])


def _run_each(calls) -> list:  # type: ignore[no-untyped-def]
    """Runs each (target, args) in a process of its own, which puts its result on the queue
    passed last; returns the results in the order they came."""
    out: mp.Queue = CTX.Queue()
    procs = [CTX.Process(target=target, args=(*args, out)) for target, args in calls]
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



def _send_singles(url: str, seed: int, out: mp.Queue) -> None:
    with tableq.connect(url) as q:
        out.put(("sent", [q.send("race", {"from": seed, "n": i}).id for i in range(400)]))


def _drain_until(url: str, expected: int, total: Any, out: mp.Queue) -> None:
    """Receives until the receivers together have seen `expected` messages (or 3 minutes)."""
    seen: list[int] = []
    deadline = time.monotonic() + 180
    with tableq.connect(url) as q:
        while total.value < expected and time.monotonic() < deadline:
            msgs = q.receive("race", max=25, visibility_timeout=120)
            seen.extend(m.id for m in msgs)
            q.ack_many(msgs)
            with total.get_lock():
                total.value += len(msgs)
    out.put(("seen", seen))


@pytest.mark.slow
def test_single_sends_racing_each_other_and_receivers_lose_nothing(db_url: str) -> None:
    """A single unkeyed send is one statement with no transaction around it (SQLite skips
    BEGIN IMMEDIATE): under writers and claimers at once, each commits once, with its own id."""
    tableq.connect(db_url, migrate=True).close()
    total = CTX.Value("i", 0)
    results = _run_each([(_send_singles, (db_url, seed)) for seed in range(4)]
                        + [(_drain_until, (db_url, 1600, total)) for _ in range(2)])
    sent = [i for role, ids in results if role == "sent" for i in ids]
    assert len(sent) == len(set(sent)) == 1600
    delivered = Counter(i for role, ids in results if role == "seen" for i in ids)
    with tableq.connect(db_url) as q:
        left = [m.id for m in q.receive("race", max=1600)]
    delivered.update(left)
    assert set(delivered) == set(sent) and max(delivered.values()) == 1


MIGRATORS = 4


def _migrate(url: str, barrier: Any, stamps: Any, slot: int, out: mp.Queue) -> None:
    with tableq.connect(url) as q:
        q.now()  # connected already: after the barrier, migrate() is the first thing we do
        barrier.wait(timeout=120)
        stamps[2 * slot] = time.monotonic()  # the same clock in every process (Linux)
        applied = q.migrate()
        stamps[2 * slot + 1] = time.monotonic()
    out.put(applied)


@contextmanager
def _migration_lock_held(url: str) -> Iterator[Callable[[], int | None]]:
    """Holds the lock migrate() takes, from a connection of our own. Yields a function that
    counts the sessions waiting for it (None where the database cannot tell: SQLite)."""
    from dbhelpers import driver_connection

    u = parse_url(url)
    conn = driver_connection(url)
    cur = conn.cursor()
    try:
        if u.dialect == "postgres":
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('tableq.migrate.' || %s))",
                        (u.namespace,))
            mine = conn.info.backend_pid
            watcher = driver_connection(url)
            watcher.autocommit = True

            def waiting() -> int | None:
                return watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                       "%s = ANY(pg_blocking_pids(pid))", (mine,)).fetchone()[0]
        elif u.dialect == "mysql":
            cur.execute("SELECT GET_LOCK(CONCAT('tableq.migrate.', DATABASE(), '.', %s), 0)",
                        (u.namespace,))
            assert cur.fetchone()[0] == 1
            watcher = driver_connection(url)
            watcher.autocommit(True)

            def waiting() -> int | None:
                with watcher.cursor() as w:
                    w.execute("SELECT count(*) FROM information_schema.processlist WHERE "
                              "db = DATABASE() AND state = 'User lock'")
                    return w.fetchone()[0]
        else:
            conn.isolation_level = None
            conn.execute("PRAGMA journal_mode=WAL")  # as tableq's connections will set it
            conn.execute("BEGIN IMMEDIATE")  # the write lock migrate() begins with
            watcher = None

            def waiting() -> int | None:
                return None
        yield waiting
    finally:
        conn.rollback() if u.dialect != "sqlite" else conn.execute("ROLLBACK")
        conn.close()
        if watcher is not None:
            watcher.close()


def test_concurrent_migrations_apply_each_version_once(db_url: str) -> None:
    barrier = CTX.Barrier(MIGRATORS + 1)
    stamps = CTX.Array("d", 2 * MIGRATORS)
    out: mp.Queue = CTX.Queue()
    # Forked before our own connections exist: a child must not inherit an open database
    # connection (SQLite would even inherit the lock state in memory and wait forever).
    procs = [CTX.Process(target=_migrate, args=(db_url, barrier, stamps, i, out))
             for i in range(MIGRATORS)]
    for proc in procs:
        proc.start()
    with _migration_lock_held(db_url) as waiting:
        barrier.wait(timeout=120)  # all connected; now they all call migrate() at once
        wait_until(lambda: all(stamps[2 * i] for i in range(MIGRATORS)), timeout=60)
        if waiting() is not None:  # and they really queue on the lock
            wait_until(lambda: waiting() == MIGRATORS, timeout=60)
        released = time.monotonic()
    results = [out.get(timeout=240) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    starts, ends = stamps[0::2], stamps[1::2]
    # Every migrator was inside migrate() while the lock was held: they overlapped.
    assert max(starts) < released < min(ends), (starts, released, ends)
    applied = sorted(v for r in results for v in r)
    assert sum(1 for r in results if r) == 1  # one migrator did it all; the others found it done
    with tableq.connect(db_url) as q:
        # Each version once, none skipped (versions need not be contiguous: a backend ships
        # only the migrations it needs).
        assert applied == sorted(q._backend.migrations_known())
        assert q.migrate() == [] and q._backend.schema_version() == applied[-1]
        q.send("after", 1)
        assert q.receive("after")[0].payload == 1


def _kill_sessions(q: tableq.Queue) -> None:
    """Ends every other session of this database user from the server side, as a restart or
    an operator's kill would."""
    from dbhelpers import driver_connection

    admin = driver_connection(q._backend.url.raw)
    cur = admin.cursor()
    if q.dialect == "postgres":
        # Only this test's sessions: the server is shared with other tests (and engineers).
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (q._backend.connect_kwargs["application_name"],))
    else:
        cur.execute("SELECT id FROM information_schema.processlist "
                    "WHERE db = DATABASE() AND id <> CONNECTION_ID()")
        for (pid,) in cur.fetchall():
            cur.execute(f"KILL CONNECTION {int(pid)}")
    admin.commit()
    admin.close()


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
def test_connections_killed_by_the_server_are_replaced_not_surfaced(db_url: str) -> None:
    own = {"application_name": f"tableq-{uuid.uuid4().hex[:8]}"} if "postgres" in db_url else {}
    with tableq.connect(db_url, migrate=True, **own) as q:
        q.send("k", 1)
        q.stats()
        _kill_sessions(q)
        from tableq.testing import wait_until

        wait_until(lambda: all(q._backend.pool._stale(c) for c in q._backend.pool._idle),
                   timeout=5)
        assert q.send("k", 2).status == "sent"  # no DatabaseUnavailable reaches the caller
        assert [m.payload for m in q.receive("k", max=5)] == [1, 2]
