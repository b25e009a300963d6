"""PostgreSQL plans that hold when the table's statistics are wrong (queries.sql: its two rules
and session_plans; migration 0007). A queue drained when VACUUM came is recorded as empty, and
the planner then costs every scan of it as one row: claims and acks of a few thousand rows
became nested loops that rescanned them once per row (a claim of 10,000 took 18 s), or walked
every dead row version a held snapshot keeps. Here each hot statement runs under EXPLAIN
ANALYZE on a library session, in a transaction rolled back, in that state: every read of
message must be an index lookup by a condition, done once, and no step may run per row over
the whole batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tableq
from tableq.backends.base import ClaimSpec
from tableq.queue import backend_of
from tableq.testing import wait_until
from tests.conftest import PG_URL, _conninfo_pg

BATCH = 2000
TOPIC = "t"


@pytest.fixture(params=["drained", "drained beside a held snapshot"])
def stale(request: pytest.FixtureRequest, pg_url: str) -> Iterator[tableq.Queue]:
    """A queue whose message table VACUUM recorded as empty (reltuples = 0), now holding
    BATCH due messages; with a held snapshot, also every dead version of those before."""
    url = pg_url
    schema = url.rsplit("schema=", 1)[1]
    held = request.param != "drained"
    with psycopg.connect(_conninfo_pg(PG_URL), autocommit=True) as admin, \
            psycopg.connect(_conninfo_pg(PG_URL)) as holder, \
            tableq.connect(url, migrate=True) as q:
        if held:
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pg_class").fetchone()
        q.send_many(TOPIC, [{"n": i} for i in range(3 * BATCH)])
        while msgs := q.receive(TOPIC, max=500):
            q.ack_many(msgs)
        admin.execute(f'VACUUM (ANALYZE) "{schema}".message')
        reltuples = admin.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
            (f'"{schema}".message',)).fetchone()
        assert reltuples == (0.0,), "the state under test: the table recorded as empty"
        q.send_many(TOPIC, [{"n": i} for i in range(BATCH)])
        if held:  # claims read from a floor once the snapshot counts as held
            floors = backend_of(q).floors  # type: ignore[attr-defined]
            wait_until(lambda: q.receive("idle", max=1) == [] and floors.held, timeout=10)
        yield q
        holder.rollback()


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def assert_plan_holds(q: tableq.Queue, sql: str, params: dict[str, Any]) -> None:
    """Runs `sql` under EXPLAIN ANALYZE on one of the library's own sessions (its planner
    settings), rolled back, and checks what it did."""
    backend: Any = backend_of(q)
    with backend.pool.connection() as conn, conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0]
    nodes = list(_nodes(plan[0]["Plan"]))
    for n in nodes:
        where = f"{n['Node Type']} {n.get('Relation Name', '')} {n.get('Index Name', '')}"
        if n.get("Relation Name") == "message" and n["Node Type"] != "ModifyTable":
            assert n["Node Type"] in ("Index Scan", "Index Only Scan"), where
            assert "Index Cond" in n, f"{where} reads its whole index"
            assert n["Actual Loops"] <= 1, f"{where} ran {n['Actual Loops']} times"
        # A step run once per row of the batch, over rows of the batch, is the rescan.
        assert n["Actual Loops"] * n["Actual Rows"] <= 2 * BATCH, \
            f"{where}: {n['Actual Loops']} loops of {n['Actual Rows']} rows"


def _claim_sql(q: tableq.Queue, spec: ClaimSpec, ids_only: bool = False) -> tuple[str, Any]:
    backend: Any = backend_of(q)
    plan = backend.floors.plan(TOPIC)
    floor = plan.floor is not None
    name = ("message_claim_ids" if ids_only else "message_claim") + ("_floor" if floor else "")
    sql, params = backend._claim_params(getattr(backend.Q, name), backend.Q.message_claim_where,
                                        spec)
    params.update(plan.params())
    return sql, params


def test_claims_stay_lookups(stale: tableq.Queue) -> None:
    q = stale
    assert_plan_holds(q, *_claim_sql(q, ClaimSpec(TOPIC, BATCH, 30, 5)))
    assert_plan_holds(q, *_claim_sql(q, ClaimSpec(TOPIC, BATCH, 30, 5, charge=10)))
    assert_plan_holds(q, *_claim_sql(q, ClaimSpec(TOPIC, BATCH, 30, 5, lease="group",
                                                  ids_only=True), ids_only=True))
    backend: Any = backend_of(q)
    take = ClaimSpec(TOPIC, BATCH, 30, 5)
    assert_plan_holds(q, *backend._claim_params(backend.Q.message_take,
                                                backend.Q.message_take_where, take))


def test_acks_charges_and_extensions_stay_lookups(stale: tableq.Queue) -> None:
    q = stale
    msgs = q.receive(TOPIC, max=BATCH, visibility_timeout=60)
    assert len(msgs) == BATCH
    backend: Any = backend_of(q)
    refs = backend._refs([(m.id, m.lease) for m in msgs])
    for name in ("message_ack", "message_ack_retain", "done_match"):
        assert_plan_holds(q, getattr(backend.Q, name), refs)
    assert_plan_holds(q, backend.Q.message_extend_many, {**refs, "extend_s": 30.0})
    charges = backend._charges([(m.id, m.lease, m.attempts) for m in msgs])
    assert_plan_holds(q, backend.Q.message_charge, {**charges, "extend_s": 30.0})
    q.ack_many(msgs)  # the statements above were rolled back: the batch is still leased
    assert q.receive(TOPIC, max=1) == []
