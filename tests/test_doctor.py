"""`tableq doctor` and tableq.doctor (issue 13, point 5) without a throwaway server: the pure
judgement of every check, SQLite's synchronous=NORMAL, pending migrations on every backend,
and a clean SQLite setup that passes with exit code 0. The misconfigured PostgreSQL and
MariaDB servers are in tests/faults/test_doctor_servers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import click
import pytest

import tableq
import tableq.doctor
from tableq.cli.doctor import Duration
from tableq.doctor import (
    Finding,
    Limits,
    diagnose,
    exit_code,
    judge,
    judge_clock,
    judge_mysql_cleanup,
    judge_mysql_durability,
    judge_postgres_cleanup,
    judge_postgres_durability,
    judge_schema,
    judge_size,
    judge_sqlite_durability,
    judge_transactions,
    worst,
)
from tableq.testing import wait_until

SRC_DIR = Path(__file__).resolve().parents[1] / "src"


def doctor(url: str, *args: str) -> tuple[int, list[dict], str]:
    """Runs `tableq doctor --json`; returns the exit code, the findings and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    r = subprocess.run([sys.executable, "-m", "tableq.cli", "--url", url, "doctor", "--json",
                        *args], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def levels(findings: list[Finding] | list[dict]) -> dict[str, str]:
    return {(f["check"] if isinstance(f, dict) else f.check):
            (f["level"] if isinstance(f, dict) else f.level) for f in findings}


# --- the judgement, pure ---------------------------------------------------------------------


def test_postgres_durability_judgement() -> None:
    good = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
    assert worst(judge_postgres_durability(good)) == "ok"
    assert levels(judge_postgres_durability({**good, "synchronous_commit": "local"})) == {
        "durability.fsync": "ok", "durability.synchronous_commit": "ok",
        "durability.full_page_writes": "ok"}
    for name in good:
        (bad,) = [f for f in judge_postgres_durability({**good, name: "off"})
                  if f.level != "ok"]
        assert bad.check == f"durability.{name}" and bad.level == "risk"
        assert name in bad.advice and "pg_reload_conf" in bad.advice  # names setting and command


def test_mysql_durability_judgement() -> None:
    base = {"innodb_flush_log_at_trx_commit": 1, "sync_binlog": 0, "log_bin": 0,
            "binlog_format": "STATEMENT"}
    assert worst(judge_mysql_durability(base)) == "ok"  # no binary log: format does not matter
    assert levels(judge_mysql_durability({**base, "innodb_flush_log_at_trx_commit": 2}))[
        "durability.innodb_flush_log_at_trx_commit"] == "warn"
    assert levels(judge_mysql_durability({**base, "innodb_flush_log_at_trx_commit": 0}))[
        "durability.innodb_flush_log_at_trx_commit"] == "risk"
    on = {**base, "log_bin": 1}
    assert levels(judge_mysql_durability(on)) == {
        "durability.innodb_flush_log_at_trx_commit": "ok", "durability.sync_binlog": "warn",
        "durability.binlog_format": "risk"}
    assert levels(judge_mysql_durability({**on, "binlog_format": "MIXED", "sync_binlog": 1}))[
        "durability.binlog_format"] == "warn"
    assert worst(judge_mysql_durability({**on, "binlog_format": "ROW", "sync_binlog": 1})) == "ok"


def test_sqlite_durability_judgement() -> None:
    ok = {"synchronous": 2, "journal_mode": "wal", "wal_bytes": 0}
    assert worst(judge_sqlite_durability(ok)) == "ok"
    assert levels(judge_sqlite_durability({**ok, "synchronous": 1}))[
        "durability.synchronous"] == "warn"
    assert levels(judge_sqlite_durability({**ok, "synchronous": 0}))[
        "durability.synchronous"] == "risk"
    assert levels(judge_sqlite_durability({**ok, "journal_mode": "delete"}))[
        "durability.journal_mode"] == "warn"
    assert levels(judge_sqlite_durability({**ok, "journal_mode": "off"}))[
        "durability.journal_mode"] == "risk"
    big = judge_sqlite_durability({**ok, "wal_bytes": 200 * 2**20})
    assert levels(big)["durability.wal_size"] == "warn"
    assert "wal_checkpoint" in [f for f in big if f.check == "durability.wal_size"][0].advice


def test_transaction_judgement() -> None:
    limits = Limits(max_transaction_age_s=60)
    young = {"oldest": [{"pid": 7, "age_s": 30.0}], "sees_all_sessions": False,
             "prepared": {"n": 0}, "slots": []}
    (f,) = judge_transactions("postgres", young, limits)
    assert f.level == "ok" and "pg_read_all_stats" in f.summary
    old = {**young, "oldest": [{"pid": 7, "user_name": "etl", "state": "idle in transaction",
                                "age_s": 90.0}]}
    (f,) = judge_transactions("postgres", old, limits)
    assert f.level == "risk" and "pid 7" in f.summary and "pg_terminate_backend(7)" in f.advice
    (f,) = judge_transactions("mysql", old, limits)
    assert f.level == "risk" and "KILL 7" in f.advice
    held = {**young, "prepared": {"n": 1, "oldest_s": 120.0, "gid": "tx1"},
            "slots": [{"slot_name": "standby1", "active": False, "xmin_age": 5000},
                      {"slot_name": "live", "active": True, "xmin_age": 10}]}
    found = judge_transactions("postgres", held, limits)
    assert [(f.check, f.level) for f in found] == [
        ("transactions.oldest", "ok"), ("transactions.prepared", "risk"),
        ("transactions.replication_slots", "risk")]
    assert "ROLLBACK PREPARED 'tx1'" in found[1].advice
    assert "pg_drop_replication_slot('standby1')" in found[2].advice


def test_cleanup_judgement() -> None:
    (f,) = judge_postgres_cleanup({"tables": [
        {"table_name": "message", "dead_rows": 250_000, "live_rows": 1000,
         "vacuumed_s_ago": 3600.0},
        {"table_name": "dead", "dead_rows": 5, "live_rows": 9, "vacuumed_s_ago": None}]}, "tq")
    assert f.level == "warn" and "VACUUM tq.message" in f.advice
    (f,) = judge_postgres_cleanup({"tables": [
        {"table_name": "message", "dead_rows": 250_000, "live_rows": 900_000,
         "vacuumed_s_ago": None}]}, "tq")
    assert f.level == "ok"  # a big live table with proportionate churn is normal
    assert judge_mysql_cleanup({"history_length": 10})[0].level == "ok"
    assert judge_mysql_cleanup({"history_length": 150_000})[0].level == "warn"
    assert judge_mysql_cleanup({"history_length": 5_000_000})[0].level == "risk"


def test_free_space_judgement() -> None:
    big = 300 * 2**20
    pg = {"table": "tq.message", "heap_bytes": big, "index_bytes": 60 * 2**20,
          "live_rows": 20_000, "row_bytes": 300}
    (f,) = judge_size("postgres", pg)
    assert f.level == "warn" and "VACUUM (TRUNCATE true) tq.message;" in f.advice
    assert "VACUUM FULL tq.message;" in f.advice and f.facts["spare_bytes"] == big - 6_000_000
    (f,) = judge_size("postgres", {**pg, "live_rows": 900_000})  # a big table that is full
    assert f.level == "ok" and f.advice is None
    # Rows never counted (-1), or counted but of unknown width: no judgement, not a guess.
    assert judge_size("postgres", {**pg, "live_rows": -1})[0].level == "ok"
    (f,) = judge_size("postgres", {**pg, "row_bytes": None})
    assert f.level == "ok" and "width is not known" in f.summary
    (f,) = judge_size("postgres", {**pg, "row_bytes": None, "live_rows": 0})
    assert f.level == "warn"  # a drained table has no rows to measure: all of it is free
    (f,) = judge_size("postgres", {**pg, "heap_bytes": 40 * 2**20, "live_rows": 0})
    assert f.level == "ok"  # little to give back, however empty
    my = {"table": "`db`.tableq_message", "data_bytes": 16384, "index_bytes": 32768,
          "free_bytes": big, "live_rows": 0, "file_per_table": 1}
    (f,) = judge_size("mysql", my)
    assert f.level == "warn" and "OPTIMIZE TABLE `db`.tableq_message;" in f.advice
    assert "lock_wait_timeout" in f.advice
    assert judge_size("mysql", {**my, "data_bytes": 2 * big})[0].level == "ok"
    (f,) = judge_size("mysql", {**my, "file_per_table": 0})  # DATA_FREE is everyone's
    assert f.level == "ok" and "shared tablespace" in f.summary
    lite = {"table": "/srv/my q.db", "page_count": 100_000, "free_pages": 90_000,
            "page_size": 4096}
    (f,) = judge_size("sqlite", lite)
    assert f.level == "warn" and "sqlite3 -cmd '.timeout 10000' '/srv/my q.db' 'VACUUM'" in f.advice
    assert judge_size("sqlite", {**lite, "free_pages": 10})[0].level == "ok"
    for dialect in ("postgres", "mysql", "sqlite"):  # no message table yet
        assert judge_size(dialect, {})[0].level == "ok"


def test_schema_and_clock_judgement() -> None:
    assert judge_schema({"applied": [1, 2], "known": [1, 2]})[0].level == "ok"
    (f,) = judge_schema({"applied": [1], "known": [1, 2]})
    assert f.level == "risk" and f.facts["pending"] == [2] and "tableq migrate" in f.advice
    assert judge_schema({"applied": [], "known": [1]})[0].level == "risk"
    assert judge_schema({"applied": [1, 2, 3], "known": [1, 2]})[0].level == "warn"
    # A backend ships only the versions it needs: 1 and 3 applied of 1 and 3 is up to date.
    assert judge_schema({"applied": [1, 3], "known": [1, 3]})[0].level == "ok"
    limits = Limits(max_clock_offset_s=1.0)
    assert judge_clock(0.2, 0.01, limits)[0].level == "ok"
    assert judge_clock(-4.0, 0.01, limits)[0].level == "warn"
    assert judge_clock(1.5, 0.6, limits)[0].level == "ok"  # within the reading's uncertainty


def test_unreadable_sections_say_which_grant_is_missing() -> None:
    facts = {"durability": {"innodb_flush_log_at_trx_commit": 1, "sync_binlog": 1,
                            "log_bin": 0, "binlog_format": "ROW"},
             "transactions": {"error": "Access denied; you need the PROCESS privilege"},
             "cleanup": {"history_length": 3}, "schema": {"applied": [1], "known": [1]}}
    found = judge("mysql", facts, (0.0, 0.0), Limits())
    (f,) = [f for f in found if f.check == "transactions"]
    assert f.level == "warn" and "GRANT PROCESS" in f.advice and "PROCESS" in f.summary


def test_exit_codes_and_durations() -> None:
    ok, warn, risk = (Finding("a", "ok", ""), Finding("b", "warn", ""),
                      Finding("c", "risk", ""))
    assert (exit_code([ok]), exit_code([ok, warn]), exit_code([ok, warn, risk])) == (0, 0, 1)
    assert (exit_code([ok], strict=True), exit_code([warn], strict=True)) == (0, 1)
    d = Duration()
    assert [d.convert(v, None, None) for v in ("1s", "90", "500ms", "5m", "1.5h", " 2 s ")] == [
        1.0, 90.0, 0.5, 300.0, 5400.0, 2.0]
    for bad in ("-1s", "5 minutes", "1e3", "", "1s 2s"):
        with pytest.raises(click.BadParameter):
            d.convert(bad, None, None)


# --- on real databases ------------------------------------------------------------------------


def test_clean_sqlite_passes_with_exit_code_0(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/clean.db"
    tableq.connect(url, migrate=True).close()
    code, findings, err = doctor(url)
    assert code == 0, (findings, err)
    assert set(levels(findings).values()) == {"ok"}
    assert {"durability.synchronous", "durability.journal_mode", "durability.wal_size",
            "cleanup.free_space", "schema.migrations", "clock.offset"} == set(levels(findings))
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    table = subprocess.run([sys.executable, "-m", "tableq.cli", "doctor", "--url", url],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert table.returncode == 0 and "all checks passed" in table.stdout


def test_a_missing_sqlite_file_is_refused_not_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/typo.db"
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    out = subprocess.run([sys.executable, "-m", "tableq.cli", "doctor", "--url", url],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode != 0 and "no SQLite database at" in out.stderr
    assert not (tmp_path / "typo.db").exists()


def test_sqlite_synchronous_normal_is_flagged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/normal.db"
    with tableq.connect(url, migrate=True, synchronous="NORMAL") as q:
        found = diagnose(q)
    (f,) = [f for f in found if f.check == "durability.synchronous"]
    assert f.level == "warn" and "synchronous='FULL'" in f.advice
    assert (exit_code(found), exit_code(found, strict=True)) == (0, 1)
    with tableq.connect(url, synchronous="FULL") as q:
        assert worst(diagnose(q)) == "ok"


def test_pending_migrations_are_risky_and_doctor_changes_nothing(db_url: str) -> None:
    q = tableq.connect(db_url)
    try:
        known = sorted(q._backend.migrations_known())
        if q.dialect == "postgres":  # migrate all but the last version
            q._backend._migrations = q._backend._migrations[:-1]
            q.migrate()
        before = _tables(db_url, q)
        code, findings, err = doctor(db_url)
        (f,) = [f for f in findings if f["check"] == "schema.migrations"]
        assert code == 1 and f["level"] == "risk", (findings, err)
        assert "tableq migrate" in f["advice"]
        if q.dialect == "postgres":
            assert f["facts"]["applied"] == known[:-1] and f["facts"]["pending"] == known[-1:]
            assert "migration" in before  # (the last migration may add no table)
        else:
            assert f["facts"]["applied"] == [] and "not there" in f["summary"]
            assert before == set()
        assert _tables(db_url, q) == before  # doctor created nothing
    finally:
        q.close()
    with tableq.connect(db_url, migrate=True) as q:
        (f,) = [f for f in diagnose(q) if f.check == "schema.migrations"]
        assert f.level == "ok"


def test_free_space_after_a_burst_and_its_advice(db_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A drained burst leaves free space that later sends reuse; doctor says so and names the
    statement that gives it back, which does, on every backend."""
    from dbhelpers import driver_connection

    monkeypatch.setattr(tableq.doctor, "SPARE_BYTES_WARN", 2**20)  # 20,000 rows, not millions
    with tableq.connect(db_url, migrate=True) as q, closing(driver_connection(db_url)) as conn:
        if q.dialect == "sqlite":
            conn.isolation_level = None
        else:
            conn.autocommit = True
        cur = conn.cursor()

        def run(statement: str) -> None:
            cur.execute(statement)
            if q.dialect == "mysql":
                cur.fetchall()

        table = q._backend.health_facts()["size"]["table"]

        def free_space() -> Finding:
            if q.dialect != "sqlite":  # what autovacuum and InnoDB's recalculation do in time
                run(f"ANALYZE {'TABLE ' if q.dialect == 'mysql' else ''}{table}")
            (f,) = [f for f in diagnose(q) if f.check == "cleanup.free_space"]
            return f

        for i in range(0, 20_000, 1000):
            q.send_many("burst", [{"n": n, "pad": "x" * 100} for n in range(i, i + 1000)])
        assert free_space().level == "ok"  # a full table is not a drained one
        while got := q.receive("burst", max=1000):
            q.ack_many(got)
        # InnoDB's purge frees the drained pages in the background.
        f = wait_until(lambda: (f := free_space()).level == "warn" and f, timeout=30)
        advised, statement = {
            "postgres": (f"VACUUM (TRUNCATE true) {table};", f"VACUUM (TRUNCATE true) {table}"),
            "mysql": (f"OPTIMIZE TABLE {table};", f"OPTIMIZE TABLE {table}"),
            "sqlite": (f"sqlite3 -cmd '.timeout 10000' {table} 'VACUUM'", "VACUUM"),
        }[q.dialect]
        assert advised in f.advice, f.advice
        run(statement)
        f = free_space()
        assert f.level == "ok" and f.facts["spare_bytes"] < f.facts["total_bytes"] // 4 + 2**20, f
        q.send("burst", {"after": True})  # the queue works on after it
        assert q.receive("burst")[0].payload == {"after": True}


def _tables(url: str, q: tableq.Queue) -> set[str]:
    """tableq's tables as the driver sees them: doctor must not have created any."""
    from dbhelpers import driver_connection

    conn = driver_connection(url)
    try:
        cur = conn.cursor()
        if q.dialect == "sqlite":
            cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        elif q.dialect == "mysql":
            cur.execute("SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = DATABASE()")
        else:
            cur.execute("SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = %s", (q._backend.schema,))
        return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()
