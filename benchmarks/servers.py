"""The database servers of one benchmark run: a throwaway PostgreSQL cluster and a throwaway
mariadbd (tests/faults/servers.py, on free loopback ports, durability on and said so), or
servers the caller names; and a fresh database or SQLite file per case, dropped after it.
The shared servers on 5432/3306 are never touched unless passed explicitly."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import Target

ROOT = Path(__file__).resolve().parents[1]

# Durability on, and room for the scale cases; the rest is PostgreSQL's and MariaDB's default.
PG_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
               "shared_buffers": "512MB", "max_connections": "200", "max_wal_size": "4GB"}
MARIADB_SETTINGS = {"innodb-flush-log-at-trx-commit": "1", "innodb-buffer-pool-size": "1G",
                    "innodb-log-file-size": "512M", "max-connections": "300"}


def _fault_servers() -> Any:
    """tests/faults/servers.py, loaded by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "tableq_bench_servers", ROOT / "tests" / "faults" / "servers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Servers:
    """Starts what `dbs` needs; `fresh(db)` gives a Target for one case."""

    def __init__(self, dbs: set[str], pg: tuple[str, int] | None = None,
                 mysql: tuple[str, int] | None = None) -> None:
        self.dbs = dbs
        self.pg_addr = pg
        self.my_addr = mysql
        self._pg: Any = None
        self._my: Any = None
        self.tmp = Path(tempfile.mkdtemp(prefix="tableq-bench-"))

    def start(self) -> None:
        fs = _fault_servers()
        if "postgres" in self.dbs and self.pg_addr is None:
            self._pg = fs.ThrowawayPostgres(PG_SETTINGS)
            self._pg.start()
            self.pg_addr = ("127.0.0.1", self._pg.port)
        if "mysql" in self.dbs and self.my_addr is None:
            self._my = fs.ThrowawayMariaDB(MARIADB_SETTINGS)
            self._my.start()
            self.my_addr = ("127.0.0.1", self._my.port)

    def stop(self) -> None:
        for server in (self._pg, self._my):
            if server is not None:
                server.destroy()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- admin connections ----------------------------------------------------------------

    def pg_admin(self, database: str = "postgres") -> Any:
        import psycopg

        assert self.pg_addr
        return psycopg.connect(host=self.pg_addr[0], port=self.pg_addr[1], user="postgres",
                               dbname=database, autocommit=True)

    def my_admin(self) -> Any:
        import pymysql

        assert self.my_addr
        return pymysql.connect(host=self.my_addr[0], port=self.my_addr[1], user="root",
                               autocommit=True)

    # --- one fresh place per case -----------------------------------------------------------

    @contextlib.contextmanager
    def fresh(self, db: str, synchronous: str = "FULL") -> Iterator[Target]:
        name = "bench_" + uuid.uuid4().hex[:10]
        if db == "sqlite":
            d = self.tmp / name
            d.mkdir()
            try:
                yield Target("sqlite", database=str(d / "queue.db"), synchronous=synchronous)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            return
        if db == "postgres":
            assert self.pg_addr
            with self.pg_admin() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            try:
                yield Target("postgres", self.pg_addr[0], self.pg_addr[1], name, "postgres")
            finally:
                with self.pg_admin() as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        assert self.my_addr
        conn = self.my_admin()
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        try:
            yield Target("mysql", self.my_addr[0], self.my_addr[1], name, "root")
        finally:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            conn.close()

    # --- what the run was measured on --------------------------------------------------------

    def describe(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.pg_addr:
            with self.pg_admin() as c:
                version = c.execute("SHOW server_version").fetchone()[0]
                s = {k: c.execute(f"SHOW {k}").fetchone()[0] for k in
                     ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
                      "wal_level")}
            where = "throwaway cluster" if self._pg else f"server at {self.pg_addr}"
            out["postgres"] = f"PostgreSQL {version} ({where}): " + ", ".join(
                f"{k}={v}" for k, v in s.items())
        if self.my_addr:
            conn = self.my_admin()
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, "
                            "@@innodb_buffer_pool_size, @@log_bin, @@innodb_doublewrite")
                v, flush, pool, binlog, dw = cur.fetchone()
            conn.close()
            where = "throwaway server" if self._my else f"server at {self.my_addr}"
            out["mysql"] = (f"MariaDB {v} ({where}): innodb_flush_log_at_trx_commit={flush}, "
                            f"innodb_buffer_pool_size={int(pool) // 2**20}MB, log_bin={binlog}, "
                            f"innodb_doublewrite={dw}")
        if "sqlite" in self.dbs:
            import sqlite3

            out["sqlite"] = (f"SQLite {sqlite3.sqlite_version}, WAL, on {_fs(self.tmp)}; "
                             "synchronous FULL and NORMAL are separate rows")
        return out


def _fs(path: Path) -> str:
    try:
        import psutil

        best = max((p for p in psutil.disk_partitions(all=True)
                    if str(path).startswith(p.mountpoint)), key=lambda p: len(p.mountpoint))
        return f"{best.fstype} ({best.mountpoint})"
    except Exception:  # noqa: BLE001 - description only
        return os.fspath(path)
