"""Recording a fault run's history where a kill -9 cannot erase it.

- Producers append one JSON line per send outcome to a file opened with O_APPEND (one
  write per line, so a line survives a kill whole): `History.send(value, phase)`.
- Handlers write one *effect row* per processed message into a table of the database under
  test (`EffectTable`): inside the handler's transaction for exactly_once (it commits with
  the ack or not at all), in its own transaction for at_least_once. Each row carries the
  database's own time and the lease's expiry, so the checker can tell redelivery after a
  lease ended from a message handed out while still leased.
- Handler starts (deliveries) are counted as lines in a file, like sends.

Test code may hold SQL (the library may not): the effect table is the tests' own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from checker import Effect, SendOp

import tableq.url


class History:
    """One process's JSON-lines history file."""

    def __init__(self, path: str | os.PathLike[str], proc: str = "") -> None:
        self.path = Path(path)
        self.proc = proc or str(os.getpid())

    def write(self, **record: Any) -> None:
        record.setdefault("t", time.time())
        record.setdefault("proc", self.proc)
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def send(self, value: str, phase: str, **extra: Any) -> None:
        self.write(op="send", value=value, phase=phase, **extra)

    def deliver(self, value: str, **extra: Any) -> None:
        self.write(op="deliver", value=value, **extra)


def read_records(paths: Iterable[str | os.PathLike[str]]) -> Iterator[dict[str, Any]]:
    for path in paths:
        p = Path(path)
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            if line.endswith("}"):  # a torn last line cannot happen with O_APPEND; be safe
                yield json.loads(line)


def read_sends(paths: Iterable[str | os.PathLike[str]]) -> list[SendOp]:
    return [SendOp(r["value"], r["phase"], r["t"]) for r in read_records(paths)
            if r.get("op") == "send"]


def count_deliveries(paths: Iterable[str | os.PathLike[str]]) -> int:
    return sum(1 for r in read_records(paths) if r.get("op") == "deliver")


_NOW = {
    "postgres": "extract(epoch from clock_timestamp())",
    "mysql": "UNIX_TIMESTAMP(NOW(6))",
    "sqlite": "(julianday('now') - 2440587.5) * 86400.0",
}
_PARAM = {"postgres": "%s", "mysql": "%s", "sqlite": "?"}


class EffectTable:
    """The tests' table of committed effects, in the database under test."""

    NAME = "fault_effect"

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = tableq.url.parse_url(url).dialect
        self.table = self._qualified()

    def _qualified(self) -> str:
        u = tableq.url.parse_url(self.url)
        if self.dialect == "postgres":
            return f'"{u.namespace}".{self.NAME}'
        return f"{u.namespace}{self.NAME}"

    def create(self) -> None:
        text = "TEXT" if self.dialect != "mysql" else "VARCHAR(200)"
        with self.connection() as conn:
            cur = conn.cursor()
            if self.dialect == "postgres":
                u = tableq.url.parse_url(self.url)
                cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{u.namespace}"')
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (value {text} NOT NULL, "
                        f"lease {text}, worker {text}, at_s DOUBLE PRECISION NOT NULL, "
                        "until_s DOUBLE PRECISION, since_s DOUBLE PRECISION)")
            # record_once looks its (value, lease) up before writing: without an index that
            # is a scan of every effect so far, which slowed an hour's soak to a crawl (and
            # on MariaDB took a lock on every row it read).
            index = self.table.rpartition(".")[2] + "_value"  # in the table's schema
            cur.execute(f"CREATE INDEX IF NOT EXISTS {index} ON {self.table} (value, lease)")
            conn.commit()

    def insert_sql(self) -> str:
        p = _PARAM[self.dialect]
        return (f"INSERT INTO {self.table} (value, lease, worker, at_s, until_s, since_s) "
                f"VALUES ({p}, {p}, {p}, {_NOW[self.dialect]}, {p}, {p})")

    def record(self, conn: Any, value: str, *, lease: str | None, until: float | None,
               worker: str = "", since: float | None = None) -> None:
        """Writes one effect on `conn` (a driver connection; the caller commits, or it is
        the exactly-once transaction's connection). `since` is when the lease began."""
        cur = conn.cursor()
        cur.execute(self.insert_sql(), (value, lease, worker or str(os.getpid()), until, since))

    def record_once(self, conn: Any, value: str, *, lease: str | None, until: float | None,
                    worker: str = "") -> None:
        """record(), but a no-op if this (value, lease) is already there: for a handler that
        retries its write after a failure whose outcome it could not see."""
        p = _PARAM[self.dialect]
        source = " FROM DUAL" if self.dialect == "mysql" else ""
        cur = conn.cursor()
        cur.execute(f"INSERT INTO {self.table} (value, lease, worker, at_s, until_s) "
                    f"SELECT {p}, {p}, {p}, {_NOW[self.dialect]}, {p}{source} WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {self.table} WHERE value = {p} AND lease = {p})",
                    (value, lease, worker or str(os.getpid()), until, value, lease))

    def record_now(self, value: str, *, lease: str | None, until: float | None,
                   worker: str = "") -> None:
        """Writes one effect in its own committed transaction (at_least_once handlers)."""
        with self.connection() as conn:
            self.record(conn, value, lease=lease, until=until, worker=worker)
            conn.commit()

    def released(self, conn: Any, value: str, lease: str | None, at: float) -> None:
        """Ends an effect's lease interval at `at` (database seconds, read just before the
        handler nacked the message): a redelivery after a nack is not one while leased."""
        p = _PARAM[self.dialect]
        cur = conn.cursor()
        cur.execute(f"UPDATE {self.table} SET until_s = {p} WHERE value = {p} AND lease = {p}",
                    (at, value, lease))

    def read(self) -> list[Effect]:
        with self.connection() as conn:
            cur = conn.cursor()
            cur.execute(f"SELECT value, lease, at_s, until_s, since_s FROM {self.table}")
            return [Effect(str(v), lease, float(at), None if until is None else float(until),
                           None if since is None else float(since))
                    for v, lease, at, until, since in cur.fetchall()]

    def connect(self) -> Any:
        """A new driver connection to the database under test (not autocommit)."""
        u = tableq.url.parse_url(self.url)
        if self.dialect == "sqlite":
            import sqlite3

            return sqlite3.connect(u.database, timeout=60)
        if self.dialect == "postgres":
            import psycopg

            return psycopg.connect(host=u.host, port=u.port or 5432, user=u.user,
                                   password=u.password, dbname=u.database, connect_timeout=5)
        import pymysql

        return pymysql.connect(host=u.host, port=u.port or 3306, user=u.user or "root",
                               password=u.password or "", database=u.database,
                               connect_timeout=5)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        conn = self.connect()
        try:
            yield conn
        finally:
            conn.close()


def live_rows(q: Any, topic: str) -> list[dict[str, Any]]:
    """Every live message of a topic as a row dict (peek stops at 10,000), by id range."""
    # Imported here: this module is also loaded by apps that run under an older tableq
    # (the upgrade test), which has no tableq.bulk.
    from tableq.bulk import Bulk

    bounds = Bulk(q).history_bounds("live", topic)
    return [] if bounds is None else Bulk(q).history("live", topic, *bounds)


def epoch(dt: Any) -> float | None:
    """A message's aware datetime (e.g. its lease expiry) as Unix seconds."""
    return None if dt is None else float(dt.timestamp())
