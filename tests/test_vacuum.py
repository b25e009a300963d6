"""PostgreSQL's message table is vacuumed by the backend itself, paced by churn
(backends/postgres/vacuum.py): it stays near its size through heavy churn, the pacing
survives a failing vacuum, and a role that may not vacuum the table is told once and left
alone, its queue working as before."""

from __future__ import annotations

import logging
import time
import uuid

import psycopg
import pytest

import tableq
from tableq.backends.postgres.vacuum import (
    CHURN_SHARE,
    COUNTED_BELOW,
    DUTY,
    MIN_CHURN,
    QUICK_SKIPS,
    RETRY_S,
    SKIPPED_RETRY_MAX_S,
    SKIPPED_RETRY_S,
    Swept,
    Vacuumer,
    skipped_wait,
    vacuum_wait,
)
from tableq.testing import wait_until
from tableq.url import parse_url
from tests.conftest import PG_URL, _conninfo_pg

BACKLOG = 2_000
BATCH = 500


def test_vacuum_waits_for_churn_and_paces_a_vacuum_that_removed_little() -> None:
    clean, big, stuck = Swept(0, 0), Swept(100_000, 0), Swept(0, 10**6)
    assert vacuum_wait(MIN_CHURN - 1, clean, 100.0, 0.0) is None  # a small table grows a bit
    assert vacuum_wait(MIN_CHURN, clean, 0.0, 0.0) == 0.0
    share = int(CHURN_SHARE * 100_000)
    assert vacuum_wait(share - 1, big, 100.0, 0.0) is None  # not yet its share of the rows
    assert vacuum_wait(share, big, 0.0, 0.0) == 0.0
    # A slow vacuum that removed what churned does not hold the next one back ...
    assert vacuum_wait(10**9, clean, 0.0, 5.0) == 0.0
    # ... one that could not (a long transaction holds the rows) waits DUTY times its length.
    assert vacuum_wait(10**9, stuck, 2.0 * DUTY - 0.5, 2.0) == pytest.approx(0.5)
    assert vacuum_wait(10**9, stuck, 2.0 * DUTY, 2.0) == 0.0


def test_vacuumer_outlives_a_failing_vacuum(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    def vacuum() -> Swept:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise tableq.DatabaseError("the database is away")
        return Swept(10.0, 0.0)

    v = Vacuumer(vacuum, "here")
    try:
        with caplog.at_level(logging.WARNING, logger="tableq.vacuum"):
            v.churned(MIN_CHURN)
            wait_until(lambda: len(calls) == 1)
            assert v.runs == 0
            v.churned(MIN_CHURN)  # the churn is kept, and the retry waits its turn
            time.sleep(0.3)
            assert len(calls) == 1
            assert v._wait_s() == pytest.approx(RETRY_S - 0.3, abs=0.2)
        assert "the database is away" in caplog.text
    finally:
        v.close()


def test_a_skipped_vacuum_keeps_its_churn_and_is_tried_again_soon() -> None:
    """Another holding the table (autovacuum's ANALYZE, each minute) skips the backend's
    vacuum: counted as done, it let twice the churn in before the next, and the table grew.
    Skips in a row wait longer each time (each is a line in the server's log)."""
    assert skipped_wait(1) == skipped_wait(QUICK_SKIPS) == SKIPPED_RETRY_S
    assert skipped_wait(QUICK_SKIPS + 2) == 4 * SKIPPED_RETRY_S
    assert skipped_wait(10**6) == SKIPPED_RETRY_MAX_S  # an autovacuum holding it for days
    calls: list[float] = []

    def vacuum() -> Swept:
        calls.append(time.monotonic())
        return Swept(0.0, 0.0, skipped=len(calls) <= 3)

    v = Vacuumer(vacuum, "here")
    try:
        v.churned(MIN_CHURN)  # one batch of churn, no more: only the kept churn calls again
        wait_until(lambda: v.runs == 1)
        assert len(calls) == 4
        gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
        assert all(gap >= skipped_wait(n) for n, gap in enumerate(gaps, 1)), gaps
        assert v._churn == 0 and v._skips == 0
    finally:
        v.close()


def _table(url: str) -> str:
    """The quoted name of the message table in the test's schema."""
    return f'"{url.rsplit("schema=", 1)[1]}".message'


def _size(url: str, heap_only: bool = False) -> int:
    """Bytes of the message table with its indexes, or of its heap alone."""
    size = "pg_relation_size" if heap_only else "pg_total_relation_size"
    with psycopg.connect(_conninfo_pg(PG_URL), autocommit=True) as c:
        row = c.execute(f"SELECT {size}(%s)", (_table(url),)).fetchone()
    return int(row[0])  # type: ignore[index]


def _churn(q: tableq.Queue, messages: int) -> None:
    for _ in range(messages // BATCH):
        q.send_many("t", [{"i": i, "pad": "x" * 80} for i in range(BATCH)])
        got = 0
        while got < BATCH:
            msgs = q.receive("t", max=100)
            q.ack_many(msgs)
            got += len(msgs)


def test_churn_leaves_the_table_near_its_size(pg_url: str) -> None:
    with tableq.connect(pg_url, migrate=True) as q:
        q.send_many("t", [{"i": i, "pad": "x" * 80} for i in range(BACKLOG)])
        start = _size(pg_url)
        _churn(q, 30 * BACKLOG)
        vacuumer = q._backend.vacuumer  # type: ignore[attr-defined]
        wait_until(lambda: vacuumer.runs >= 1)
        end = _size(pg_url)
        (s,) = q.stats("t", exact=True)
        assert s.live == BACKLOG
    # Left to autovacuum (at most once a minute), the same churn grew it 28x; with it, 3.0x.
    assert end <= 5 * start, (start, end, vacuumer.runs)


def test_vacuum_false_leaves_it_to_autovacuum(pg_url: str) -> None:
    with tableq.connect(pg_url, migrate=True, vacuum=False) as q:
        assert q._backend.vacuumer is None  # type: ignore[attr-defined]
        _churn(q, 2 * MIN_CHURN)


def test_a_role_that_may_not_vacuum_is_told_once(pg_url: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    schema = pg_url.rsplit("schema=", 1)[1]
    role = "tq_role_" + uuid.uuid4().hex[:8]
    tableq.connect(pg_url, migrate=True).close()
    admin = psycopg.connect(_conninfo_pg(PG_URL), autocommit=True)
    try:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" '
                      f'TO "{role}"')
        admin.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        u = parse_url(PG_URL)
        url = f"postgresql://{role}@{u.host}:{u.port or 5432}/{u.database}?schema={schema}"
        with caplog.at_level(logging.WARNING, logger="tableq.vacuum"), \
                tableq.connect(url) as q:
            vacuumer = q._backend.vacuumer  # type: ignore[attr-defined]
            _churn(q, 2 * MIN_CHURN)
            wait_until(lambda: vacuumer._off)
            _churn(q, 2 * MIN_CHURN)  # the queue works on, and nobody tries again
            assert vacuumer.runs == 0
            (s,) = q.stats("t", exact=True)
            assert s.live == 0
        warnings = [r for r in caplog.records if "cannot vacuum" in r.getMessage()]
        assert len(warnings) == 1
        assert "vacuum=False" in warnings[0].getMessage()
    finally:
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')
        admin.close()


def test_a_vacuum_skipped_for_a_lock_keeps_the_vacuumer_on(pg_url: str) -> None:
    """Autovacuum (or another process's vacuum) holding the table makes VACUUM (SKIP_LOCKED)
    skip it with a warning: that is no reason to stop vacuuming, unlike a missing right."""
    with tableq.connect(pg_url, migrate=True) as q, \
            psycopg.connect(_conninfo_pg(PG_URL)) as holder:
        holder.execute(f"LOCK TABLE {_table(pg_url)} IN SHARE UPDATE EXCLUSIVE MODE")
        backend = q._backend  # type: ignore[attr-defined]
        swept = backend._vacuum()
        holder.rollback()
        assert swept == Swept(0.0, 0.0, skipped=True)
        _churn(q, 2 * MIN_CHURN)
        wait_until(lambda: backend.vacuumer.runs >= 1)
        assert not backend.vacuumer._off


def test_vacuums_keep_the_tail_pages_for_reuse(pg_url: str) -> None:
    """A vacuum that truncates holds the table's vacuum lock for up to 5 s waiting for an
    exclusive one, and the backend's own vacuum is skipped meanwhile: no vacuum of the
    message table truncates it unless told to (0009_keep_tail_pages.sql)."""
    table = _table(pg_url)
    with tableq.connect(pg_url, migrate=True, vacuum=False) as q, \
            psycopg.connect(_conninfo_pg(PG_URL), autocommit=True) as c:
        q.send_many("t", [{"i": i, "pad": "x" * 80} for i in range(BACKLOG)])
        while msgs := q.receive("t", max=100):
            q.ack_many(msgs)
        drained = _size(pg_url, heap_only=True)
        c.execute(f"VACUUM {table}")  # as autovacuum would: the table's setting
        kept = _size(pg_url, heap_only=True)
        c.execute(f"VACUUM (TRUNCATE true) {table}")  # by hand, when quiet
        given_back = _size(pg_url, heap_only=True)
    assert drained > 0 and kept == drained, (drained, kept)
    assert given_back == 0, (drained, given_back)


def test_a_vacuum_counts_a_small_table_s_rows(pg_url: str) -> None:
    """The pacing's share of the table comes from a count below COUNTED_BELOW rows, not from
    the server's estimate: VACUUM extrapolates the rows of the pages it skips from the last
    estimate, which drifted up as the table grew under churn, and let more churn in."""
    table = _table(pg_url)
    with tableq.connect(pg_url, migrate=True, vacuum=False) as q, \
            psycopg.connect(_conninfo_pg(PG_URL), autocommit=True) as c:
        q.send_many("t", [{"i": i, "pad": "x" * 80} for i in range(BACKLOG)])
        c.execute(f"VACUUM {table}")  # every page all-visible: the next vacuum skips them
        # A drifted estimate, made by hand (the test's role is a superuser).
        c.execute("UPDATE pg_class SET reltuples = 1e6 WHERE oid = %s::regclass", (table,))
        q.ack_many(q.receive("t", max=100))
        swept = q._backend._vacuum()  # type: ignore[attr-defined]
        estimate = c.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                             (table,)).fetchone()[0]  # type: ignore[index]
    assert BACKLOG < COUNTED_BELOW
    assert estimate > 10 * BACKLOG, estimate  # the vacuum kept extrapolating the wrong one
    assert swept == Swept(BACKLOG - 100, 0.0)
