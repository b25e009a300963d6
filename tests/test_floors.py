"""PostgreSQL claims from floors while a snapshot is held or a topic has open bulk loads
(backends/postgres/floors.py): the decisions, and on a real server, beside a real REPEATABLE
READ snapshot or open loads, claims that return exactly what a plain claim would, message for
message, while sends, outbox transactions, nacks, expired leases, rolled-back claims, sends
due in the past, and loads opened, published and discarded come and go."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import tableq
from tableq.backends.base import ClaimSpec
from tableq.backends.postgres.floors import (
    HELD_AFTER_S,
    LOOK_EVERY_S,
    START,
    WRITE_MARGIN_S,
    Floors,
    Horizon,
    next_floor,
)
from tableq.bulk import Bulk
from tableq.queue import backend_of
from tableq.testing import wait_until
from tableq.url import parse_url
from tests.conftest import PG_URL, _conninfo_pg

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHORT_LEASE_S = 0.1


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# --- decisions -----------------------------------------------------------------------------


def test_a_snapshot_counts_as_held_once_it_is_old_and_every_session_is_seen() -> None:
    assert not Horizon(False, None, None, at(100)).held()
    assert not Horizon(False, at(100 - HELD_AFTER_S / 2), None, at(100)).held()
    assert Horizon(False, at(100 - 2 * HELD_AFTER_S), None, at(100)).held()
    # A session this role cannot see may hold a write in flight: no floor is safe then.
    assert not Horizon(True, at(0), None, at(100)).held()


def test_the_write_bound_is_the_oldest_write_in_flight_less_the_margin() -> None:
    margin = timedelta(seconds=WRITE_MARGIN_S)
    assert Horizon(False, at(0), None, at(100)).write_bound() == at(100) - margin
    assert Horizon(False, at(0), at(40), at(100)).write_bound() == at(40) - margin


def test_a_floor_is_the_first_row_seen_capped_by_the_bound_and_never_moves_back() -> None:
    assert next_floor(None, (at(5), 7), at(10), None) is None  # no bound read yet
    assert next_floor(None, (at(5), 7), at(10), at(8)) == (at(5), 7)
    assert next_floor(None, (at(9), 7), at(10), at(8)) == (at(8), 0)  # a write in flight
    assert next_floor(None, None, at(10), at(20)) == (at(10), 0)  # nothing seen: its start
    assert next_floor((at(6), 1), (at(5), 7), at(10), at(8)) == (at(6), 1)


def test_plain_claims_look_at_the_horizon_once_in_a_while_and_floors_follow_it() -> None:
    floors = Floors()
    assert floors.plan("t").check  # the first claim looks
    assert floors.plan("t").floor is None and not floors.plan("t").check
    floors.checked(Horizon(False, at(0), None, at(100)))
    plan = floors.plan("t")
    assert floors.held and plan.floor == (0, (START, 0)) and plan.bound is not None
    meta = {"hidden": False, "oldest_snapshot": at(0), "oldest_write": None,
            "open_topics": [], "gen": 0, "claimed_at": at(101), "first_at": at(50),
            "first_id": 3}
    floors.learn("t", plan, meta, first_priority=5)
    assert floors.plan("t").floor == (5, (START, 0))  # the priority its messages came from
    floors.learn("t", plan, meta, first_priority=0)
    assert floors.plan("t").floor == (0, (at(50), 3))
    assert floors.plan("u").floor == (0, (START, 0))  # floors are per topic
    floors.checked(Horizon(False, None, None, at(200)))  # the snapshot is gone
    assert not floors.held and floors.plan("t").floor is None
    assert not Floors(enabled=False).plan("t").check  # a test clock: never


def test_floor_claims_read_the_horizon_once_in_a_while_and_go_on_from_the_last_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    floors = Floors()
    floors.checked(Horizon(False, at(0), at(90), at(100)))
    looking = floors.plan("t")
    assert looking.look and looking.params()["look"] is True
    clock[0] += LOOK_EVERY_S / 2
    quiet = floors.plan("t")
    assert not quiet.look and quiet.bound == looking.bound
    # A claim that did not look brings no horizon (its columns are NULL): its floor still
    # follows the rows it saw, capped by the bound an earlier look left.
    meta = {"hidden": None, "oldest_snapshot": None, "oldest_write": None,
            "open_topics": None, "gen": 0, "claimed_at": at(101), "first_at": at(95),
            "first_id": 3}
    floors.learn("t", quiet, meta, first_priority=0)
    margin = timedelta(seconds=WRITE_MARGIN_S)
    assert floors.held and floors.plan("t").floor == (0, (at(90) - margin, 0))
    clock[0] += LOOK_EVERY_S
    later = floors.plan("t")
    assert later.look
    floors.learn("t", later, {**meta, "hidden": False, "claimed_at": at(102)},
                 first_priority=0)  # the look finds the snapshot gone: floors off
    assert not floors.held and floors.plan("t").floor is None


def test_topics_with_open_loads_are_claimed_from_floors_while_no_snapshot_is_held() -> None:
    floors = Floors()
    assert floors.plan("t").check
    floors.checked(Horizon(False, None, None, at(100), frozenset({"t"})))
    assert not floors.held and floors.on("t") and not floors.on("u")
    plan = floors.plan("t")
    assert plan.floor == (0, (START, 0)) and plan.gen == 0 and plan.bound is not None
    assert floors.plan("u").floor is None
    # A session this role cannot see may hold a write in flight: no floor is safe then.
    assert not Horizon(True, None, None, at(100), frozenset({"t"})).open_loads()
    floors.checked(Horizon(False, None, None, at(101)))  # the load was published
    assert not floors.on("t") and floors.plan("t").floor is None


def test_a_publish_sends_the_floor_back_and_older_claims_do_not_move_it() -> None:
    floors = Floors()
    floors.checked(Horizon(False, None, None, at(100), frozenset({"t"})))

    def meta(first: float, gen: int) -> dict[str, Any]:
        return {"hidden": False, "oldest_snapshot": None, "oldest_write": None,
                "open_topics": ["t"], "gen": gen, "claimed_at": at(100),
                "first_at": at(first), "first_id": 1}

    plan = floors.plan("t")
    floors.learn("t", plan, meta(50, 0), first_priority=0)
    assert floors.plan("t").floor == (0, (at(50), 1)) and floors.plan("t").gen == 0
    # A load of the topic was published: the claim read from the start, found its rows at
    # 10, and the floor goes back to them under the new count.
    stale = floors.plan("t")
    floors.learn("t", stale, meta(10, 1), first_priority=0)
    assert floors.plan("t").floor == (0, (at(10), 1)) and floors.plan("t").gen == 1
    # A claim that began before that publish was seen learns nothing any more.
    floors.learn("t", plan, meta(60, 0), first_priority=0)
    assert floors.plan("t").floor == (0, (at(10), 1))
    # Under the new count the floor moves on as before.
    floors.learn("t", floors.plan("t"), meta(20, 1), first_priority=0)
    assert floors.plan("t").floor == (0, (at(20), 1))


# --- on a real server, beside a held snapshot --------------------------------------------


@pytest.fixture
def held() -> Iterator[psycopg.Connection[Any]]:
    """A REPEATABLE READ transaction that took its snapshot and stays open."""
    with psycopg.connect(_conninfo_pg(PG_URL)) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM pg_class").fetchone()
        yield conn
        conn.rollback()


def _wait_held(q: tableq.Queue, topic: str) -> None:
    floors = backend_of(q).floors  # type: ignore[attr-defined]
    wait_until(lambda: q.receive(topic, max=1) == [] and floors.held, timeout=10)


class Truth:
    """What a plain claim would take now: the due rows outside open loads in delivery order
    that no other transaction holds, read (FOR UPDATE SKIP LOCKED) in a transaction rolled
    back at once."""

    def __init__(self, url: str) -> None:
        self.schema = url.rsplit("schema=", 1)[1]
        self.conn = psycopg.connect(_conninfo_pg(PG_URL))

    def next(self, topic: str, n: int) -> list[int]:
        s = self.schema
        rows = self.conn.execute(
            f'SELECT id FROM "{s}".message WHERE topic = %s '
            "AND available_at <= statement_timestamp() AND (load_part IS NULL OR load_part "
            f"""NOT IN (SELECT id FROM "{s}".load_part WHERE state = 'open')) """
            "ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
            (topic, n)).fetchall()
        self.conn.rollback()
        return [r[0] for r in rows]

    def loaded(self, job: str, parts: list[int]) -> set[int]:
        """The ids of the rows that a load's parts hold."""
        s = self.schema
        rows = self.conn.execute(
            f'SELECT m.id FROM "{s}".message m JOIN "{s}".load_part p ON p.id = m.load_part '
            "WHERE p.job = %s AND p.part = ANY(%s)", (job, parts)).fetchall()
        self.conn.rollback()
        return {r[0] for r in rows}

    def hold(self, conn: psycopg.Connection[Any], topic: str, n: int) -> None:
        """Locks the first n due messages on `conn` as a claim in flight does."""
        conn.execute(f'SELECT id FROM "{self.schema}".message WHERE topic = %s '
                     "AND available_at <= statement_timestamp() "
                     "ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
                     (topic, n))

    def rows(self, ids: list[int]) -> list[tuple[Any, ...]]:
        """How these messages stand now, for a failure's message."""
        rows = self.conn.execute(
            f'SELECT id, priority, available_at, lease IS NOT NULL FROM "{self.schema}".message '
            "WHERE id = ANY(%s) ORDER BY priority DESC, available_at, id", (ids,)).fetchall()
        self.conn.rollback()
        return rows


def _floor_now(floors: Floors, topic: str) -> Any:
    """The floor the next claim of `topic` would start from, or None: read without taking a
    plan (plan() takes the next look at the horizon, which the claim itself should)."""
    known = floors._floor.get((topic, floors._level.get(topic, 0)))
    return None if known is None else known[0]


def _claim_ids_and_ack(backend: Any, topic: str, n: int) -> list[int]:
    """The Spark source's claim (ids under one lease of its own), acked at once: the ids."""
    lease = uuid.uuid4().hex
    rows = backend.message_claim(ClaimSpec(topic, n, 30, 1000, lease=lease, ids_only=True)).rows
    got = [r["id"] for r in rows]
    backend.message_ack([(i, lease) for i in got], False)
    return got


def _drain(q: tableq.Queue, topic: str, delivered: list[int]) -> None:
    """Receives and acks until nothing is live (leases left to expire come back)."""
    while True:
        msgs = q.receive(topic, max=100, max_attempts=1000)
        q.ack_many(msgs)
        delivered.extend(m.id for m in msgs)
        if not msgs:
            stats = q.stats(topic, exact=True)
            if not stats or stats[0].live == 0:
                return
            wait_until(lambda: q.stats(topic, exact=True)[0].ready > 0)


def test_claims_from_floors_take_what_a_plain_claim_would(
        pg_url: str, held: psycopg.Connection[Any]) -> None:
    rng = random.Random(7)
    topic = "t"
    q = tableq.connect(pg_url, migrate=True)
    backend = backend_of(q)
    truth = Truth(pg_url)
    outbox = psycopg.connect(_conninfo_pg(PG_URL))
    rival = psycopg.connect(_conninfo_pg(PG_URL))
    delivered: list[int] = []
    sent: set[int] = set()
    bulk = Bulk(q)
    loads: list[str] = []  # open loads, one part each
    try:
        _wait_held(q, topic)
        outbox_open = 0  # claims until the open outbox transaction commits
        moved = 0  # claims that started from a floor past the start
        expiring = 0.0  # when the last short lease left running ends (time.monotonic())
        rival_open = 0  # claims until the rival claim rolls back
        for step in range(400):
            roll = rng.random()
            if roll < 0.25:
                batch = [{"s": step, "i": i} for i in range(rng.choice([1, 5, 40, 600]))]
                sent.update(r.id for r in q.send_many(
                    topic, batch, priority=rng.choice([0, 0, 0, 0, 5, -1])))
            elif roll < 0.3 and not outbox_open:
                # An outbox send: visible at its commit, some claims later, due at its send.
                sent.add(q.send(topic, {"outbox": step}, connection=outbox).id)
                outbox_open = rng.randint(1, 6)
            elif roll < 0.33:
                # Due before it was sent, so before this process's floors.
                sent.add(q.send(topic, {"past": step}, at=datetime.now(UTC) - timedelta(
                    seconds=rng.choice([1, 60, 3600]))).id)
            elif roll < 0.36:
                # A claim rolled back: its messages keep their place.
                with pytest.raises(RuntimeError), q.transaction() as tx:
                    tx.receive(topic, max=3)
                    raise RuntimeError("rolled back")
            elif roll < 0.4 and not rival_open:
                # Another claim holds the first due messages over some claims of ours, then
                # rolls back (its process died): ours pass over them, and find them after.
                truth.hold(rival, topic, rng.choice([1, 5]))
                rival_open = rng.randint(1, 4)
            elif roll < 0.43:
                # Loads beside the held snapshot: floors pass their open rows, until published.
                if loads and rng.random() < 0.6:
                    job = loads.pop(rng.randrange(len(loads)))
                    sent.update(truth.loaded(job, [0]))
                    bulk.publish_staged(job, [0])
                else:
                    loads.append(f"load-{step}")
                    bulk.stage_many(loads[-1], 0, topic, [{"load": step, "i": i} for i in
                                                          range(rng.choice([1, 30, 800]))])
            else:
                n = rng.choice([1, 3, 10, 50])
                # A lease running out between the two reads would change the answer.
                wait_until(lambda until=expiring: time.monotonic() > until, timeout=5)
                expected = truth.next(topic, n)
                plan = _floor_now(backend.floors, topic)
                moved += plan is not None and plan[0] > START
                if rng.random() < 0.3:
                    got = _claim_ids_and_ack(backend, topic, n)
                    delivered.extend(got)
                else:
                    short = rng.random() < 0.15  # leases that run out and come back
                    msgs = q.receive(topic, max=n, max_attempts=1000,
                                     visibility_timeout=SHORT_LEASE_S if short else 30)
                    got = [m.id for m in msgs]
                    for m in msgs:
                        if short and rng.random() < 0.5:
                            expiring = time.monotonic() + SHORT_LEASE_S + 0.05
                            continue
                        if rng.random() < 0.1:
                            m.nack(delay=0)  # due again at once, behind what is due
                        else:
                            m.ack()
                            delivered.append(m.id)
                assert got == expected, (step, got, expected, plan, truth.rows(got + expected))
            if outbox_open:
                outbox_open -= 1
                if not outbox_open:
                    outbox.commit()
            if rival_open:
                rival_open -= 1
                if not rival_open:
                    rival.rollback()
        outbox.commit()
        rival.rollback()
        for job in loads:
            sent.update(truth.loaded(job, [0]))
            bulk.publish_staged(job, [0])
        _drain(q, topic, delivered)
        assert backend.floors.held
        assert moved > 50, "the claims did not run from floors"
    finally:
        outbox.close()
        rival.close()
        truth.conn.close()
        q.close()
    assert sorted(delivered) == sorted(sent)


@pytest.mark.parametrize("by_hand", [False, True], ids=["publish_staged", "sql_by_hand"])
def test_a_published_load_behind_a_floor_is_claimed_first(pg_url: str, by_hand: bool) -> None:
    """by_hand: the part flipped by an UPDATE of its own (a client of an older version, or an
    operator): the count of publishes moves all the same."""
    with tableq.connect(pg_url, migrate=True) as q:
        floors = backend_of(q).floors  # type: ignore[attr-defined]
        Bulk(q).stage_many("early", 0, "t", [{"early": i} for i in range(100)])
        q.send("t", "first")
        floors._checked = -1.0  # look at the horizon at the next claim
        assert [m.payload for m in q.receive("t")] == ["first"]
        assert floors.on("t") and not floors.held
        time.sleep(WRITE_MARGIN_S + 2 * LOOK_EVERY_S)  # the write bound passes the load
        while q.receive("t"):
            pass
        q.send_many("t", ["later"] * 5)
        assert [m.payload for m in q.receive("t", max=2)] == ["later"] * 2
        plan = floors.plan("t")
        copied = Truth(pg_url)
        try:
            load_at = copied.conn.execute(
                f'SELECT min(available_at) FROM "{copied.schema}".message WHERE load_part IS '
                "NOT NULL").fetchone()[0]
        finally:
            copied.conn.close()
        assert plan.floor is not None and plan.floor[1][0] > load_at  # past the open rows
        if by_hand:
            with psycopg.connect(_conninfo_pg(PG_URL)) as conn:
                conn.execute(f'UPDATE "{copied.schema}".load_part SET state = %s', ("published",))
        else:
            Bulk(q).publish_staged("early", [0])
        assert [m.payload for m in q.receive("t", max=3)] == [{"early": i} for i in range(3)]


def test_claims_past_open_loads_take_what_a_plain_claim_would(pg_url: str) -> None:
    """No snapshot held: a topic with open loads is claimed from floors past their rows, and
    a publish (its rows due where they were copied, before the floors) is found at once."""
    rng = random.Random(11)
    topic = "t"
    q = tableq.connect(pg_url, migrate=True)
    backend = backend_of(q)
    floors = backend.floors
    bulk = Bulk(q)
    truth = Truth(pg_url)
    outbox = psycopg.connect(_conninfo_pg(PG_URL))
    delivered: list[int] = []
    sent: set[int] = set()
    loads: dict[str, list[int]] = {}  # open loads: their parts

    def open_load(step: int) -> None:
        job = f"load-{step}"
        loads[job] = list(range(rng.choice([1, 3])))
        for part in loads[job]:
            bulk.stage_many(job, part, topic, [{"load": step, "part": part, "i": i}
                                               for i in range(rng.choice([1, 40, 1500]))])

    def claim(step: int, n: int) -> int:
        nonlocal moved
        expected = truth.next(topic, n)
        plan = _floor_now(floors, topic)
        moved += plan is not None and plan[0] > START
        if rng.random() < 0.3:
            got = _claim_ids_and_ack(backend, topic, n)
            delivered.extend(got)
        else:
            msgs = q.receive(topic, max=n, max_attempts=1000)
            got = [m.id for m in msgs]
            for m in msgs:
                if rng.random() < 0.1:
                    m.nack(delay=0)
                else:
                    m.ack()
                    delivered.append(m.id)
        assert got == expected, (step, got, expected, plan, truth.rows(got + expected))
        return len(got)

    moved = 0  # claims that started from a floor past the start
    try:
        sent.update(r.id for r in q.send_many(topic, list(range(20))))
        open_load(-1)
        floors._checked = -1.0  # look at the horizon at the next claim
        first = q.receive(topic, max=1)
        q.ack_many(first)
        delivered.extend(m.id for m in first)
        assert floors.on(topic) and not floors.held
        outbox_open = 0
        published = 0
        for step in range(300):
            roll = rng.random()
            if roll < 0.2:
                batch = [{"s": step, "i": i} for i in range(rng.choice([1, 5, 40, 600]))]
                sent.update(r.id for r in q.send_many(
                    topic, batch, priority=rng.choice([0] * 12 + [5, -1])))
            elif roll < 0.25 and not outbox_open:
                sent.add(q.send(topic, {"outbox": step}, connection=outbox).id)
                outbox_open = rng.randint(1, 6)
            elif roll < 0.32:
                open_load(step)
            elif roll < 0.42 and loads:
                job = rng.choice(sorted(loads))
                parts = loads.pop(job)
                if rng.random() < 0.2:
                    bulk.discard_staged(job)
                else:
                    kept = parts[:rng.randint(1, len(parts))]  # the others are dropped
                    sent.update(truth.loaded(job, kept))
                    bulk.publish_staged(job, kept)
                    published += 1
            elif roll < 0.5:
                # Drained, once the write bound has passed the open loads' rows (it trails
                # the claims' time): floors pass over those rows.
                time.sleep(WRITE_MARGIN_S + 2 * LOOK_EVERY_S)
                while claim(step, 100):
                    pass
            else:
                claim(step, rng.choice([1, 3, 10, 50]))
            if outbox_open:
                outbox_open -= 1
                if not outbox_open:
                    outbox.commit()
            if not loads:
                open_load(step)  # keep the topic claimed from floors
        outbox.commit()
        for job in list(loads):
            sent.update(truth.loaded(job, loads[job]))
            bulk.publish_staged(job, loads.pop(job))
        _drain(q, topic, delivered)
        assert moved > 30 and published > 5, (moved, published)
    finally:
        outbox.close()
        truth.conn.close()
        q.close()
    assert sorted(delivered) == sorted(sent)


def test_a_send_in_flight_while_floors_move_on_is_delivered_in_its_place(
        pg_url: str, held: psycopg.Connection[Any]) -> None:
    with tableq.connect(pg_url, migrate=True) as q, \
            psycopg.connect(_conninfo_pg(PG_URL)) as outbox:
        _wait_held(q, "t")
        early = q.send("t", "sent first, committed last", connection=outbox).id
        for _ in range(5):  # the queue churns on, its claims learning floors
            q.send_many("t", list(range(50)))
            while msgs := q.receive("t", max=20):
                q.ack_many(msgs)
        later = [r.id for r in q.send_many("t", list(range(3)))]
        outbox.commit()
        assert [m.id for m in q.receive("t", max=10)] == [early, *later]
        assert backend_of(q).floors.held  # type: ignore[attr-defined]


def test_sessions_this_role_cannot_see_keep_claims_plain(
        pg_url: str, held: psycopg.Connection[Any]) -> None:
    """Without pg_read_all_stats a role sees no other role's transactions: a write in flight
    there could sort before any floor, so the held snapshot is not taken for one."""
    schema = pg_url.rsplit("schema=", 1)[1]
    role = "tq_floor_" + uuid.uuid4().hex[:8]
    tableq.connect(pg_url, migrate=True).close()
    admin = psycopg.connect(_conninfo_pg(PG_URL), autocommit=True)
    try:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                      f'TO "{role}"')
        admin.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "{schema}" TO "{role}"')
        u = parse_url(PG_URL)
        url = f"postgresql://{role}@{u.host}:{u.port or 5432}/{u.database}?schema={schema}"
        with tableq.connect(url) as q:
            backend = backend_of(q)
            assert backend._horizon().hidden  # type: ignore[attr-defined]
            q.send_many("t", list(range(10)))
            for _ in range(3):
                backend.floors._checked = -1.0  # look at the horizon at every claim
                q.ack_many(q.receive("t", max=2))
            assert not backend.floors.held
    finally:
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')
        admin.close()


def test_the_backend_does_not_vacuum_while_a_snapshot_is_held(
        pg_url: str, held: psycopg.Connection[Any]) -> None:
    """A vacuum can remove nothing that churned since the snapshot began, and one over
    millions of dead versions slows every commit beside it."""
    with tableq.connect(pg_url, migrate=True) as q:
        backend = backend_of(q)
        _wait_held(q, "t")
        for _ in range(10):
            q.send_many("t", [{"pad": "x" * 80}] * 500)
            while msgs := q.receive("t", max=100):
                q.ack_many(msgs)
        assert backend.vacuumer._wait_s() >= 1.0 and backend.vacuumer.runs == 0  # type: ignore[attr-defined]
        held.rollback()
        wait_until(lambda: q.receive("t") == [] and not backend.floors.held)
        q.send_many("t", [{"pad": "x" * 80}] * 500)  # churn goes on; the vacuum runs
        while msgs := q.receive("t", max=100):
            q.ack_many(msgs)
        wait_until(lambda: backend.vacuumer.runs >= 1)  # type: ignore[attr-defined]
