"""`tableq doctor` against throwaway servers we may misconfigure (never the shared ones): a
PostgreSQL started with fsync=off and a second session holding a REPEATABLE READ snapshot
open is flagged for both (exit 1), and passes once fsync is on and the snapshot is gone (exit
0); a MariaDB with innodb_flush_log_at_trx_commit=2 gets a warning (exit 0, 1 with --strict),
an old InnoDB transaction and a statement-format binary log are risks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import ThrowawayMariaDB, ThrowawayPostgres

import tableq
from tableq.testing import wait_until

pytestmark = pytest.mark.slow
SRC_DIR = Path(__file__).resolve().parents[2] / "src"


def doctor(url: str, *args: str) -> tuple[int, dict[str, dict], str]:
    """`tableq doctor --url URL --json ARGS`: the exit code, findings by check, the table."""
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tableq.cli", "doctor", "--url", url,
                               *args, *extra], capture_output=True, text=True, env=env,
                              timeout=120, check=False)

    as_json, table = run("--json"), run()
    assert as_json.returncode == table.returncode, (as_json.stderr, table.stderr)
    print(table.stdout)  # shown with -s: what an operator would see
    found = {f["check"]: f for f in map(json.loads, as_json.stdout.splitlines())}
    return as_json.returncode, found, table.stdout


def not_ok(found: dict[str, dict]) -> dict[str, str]:
    return {check: f["level"] for check, f in found.items() if f["level"] != "ok"}


def test_postgres_with_fsync_off_and_a_long_open_transaction() -> None:
    server = ThrowawayPostgres(settings={"fsync": "off"})
    server.start()
    try:
        url = server.url("tq_doctor")
        tableq.connect(url, migrate=True).close()
        holder = server.admin()
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        pid = holder.info.backend_pid
        wait_until(lambda: server.sql("SELECT clock_timestamp() - xact_start > interval "
                                      "'1.5 s' FROM pg_stat_activity WHERE pid = %s",
                                      (pid,))[0][0], timeout=30)

        code, found, table = doctor(url, "--max-transaction-age", "1s")
        assert code == 1
        assert not_ok(found) == {"durability.fsync": "risk", "transactions.oldest": "risk"}
        assert "fsync = on" in found["durability.fsync"]["advice"]
        assert found["transactions.oldest"]["facts"]["pid"] == pid
        assert f"pg_terminate_backend({pid})" in found["transactions.oldest"]["advice"]
        assert "RISK" in table and "something is risky" in table
        # With the default limit (5 minutes) the young snapshot is fine; fsync is not.
        code, found, _ = doctor(url)
        assert code == 1 and not_ok(found) == {"durability.fsync": "risk"}

        holder.execute("ROLLBACK")
        holder.close()
        server.stop()
        server.settings["fsync"] = "on"
        server.start()
        code, found, table = doctor(url, "--max-transaction-age", "1s", "--strict")
        assert code == 0 and not_ok(found) == {}, found
        assert "all checks passed" in table

        # A per-database override is what tableq's sessions get: it is caught too.
        server.sql("ALTER DATABASE postgres SET synchronous_commit = off")
        code, found, _ = doctor(url)
        assert code == 1 and not_ok(found) == {"durability.synchronous_commit": "risk"}
    finally:
        server.destroy()


def test_mariadb_flush_at_commit_2_an_old_transaction_and_a_statement_binlog() -> None:
    server = ThrowawayMariaDB(settings={"innodb-flush-log-at-trx-commit": "2"})
    server.start()
    try:
        url = server.url("tq_doctor")
        tableq.connect(url, migrate=True).close()
        code, found, table = doctor(url)
        assert code == 0  # a warning alone
        assert not_ok(found) == {"durability.innodb_flush_log_at_trx_commit": "warn"}
        assert ("innodb_flush_log_at_trx_commit = 1" in
                found["durability.innodb_flush_log_at_trx_commit"]["advice"])
        assert "warnings only" in table
        assert doctor(url, "--strict")[0] == 1

        holder = server.admin()
        cur = holder.cursor()
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SELECT COUNT(*) FROM tq_doctor.tableq_message")
        thread = holder.thread_id()
        # InnoDB refreshes INNODB_TRX only after 0.1 s without a read of it: poll slower.
        wait_until(lambda: (rows := server.sql(
            "SELECT TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6)) > 2000000 FROM "
            "information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s", (thread,)))
            and rows[0][0], timeout=30, interval=0.25)
        code, found, _ = doctor(url, "--max-transaction-age", "1s")
        assert code == 1 and not_ok(found) == {
            "durability.innodb_flush_log_at_trx_commit": "warn", "transactions.oldest": "risk"}
        assert found["transactions.oldest"]["facts"]["pid"] == thread
        assert f"KILL {thread}" in found["transactions.oldest"]["advice"]
        holder.rollback()
        holder.close()

        server.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 1")
        code, found, table = doctor(url, "--strict", "--max-transaction-age", "1s")
        assert code == 0 and not_ok(found) == {}, found
        assert "all checks passed" in table

        server.stop()
        server.settings.update({"log-bin": f"{server.root}/binlog", "server-id": "1",
                                "binlog-format": "STATEMENT", "sync-binlog": "0",
                                "innodb-flush-log-at-trx-commit": "1"})
        server.start()
        code, found, _ = doctor(url)
        assert code == 1 and not_ok(found) == {"durability.sync_binlog": "warn",
                                               "durability.binlog_format": "risk"}
        assert "binlog_format = 'ROW'" in found["durability.binlog_format"]["advice"]
    finally:
        server.destroy()
