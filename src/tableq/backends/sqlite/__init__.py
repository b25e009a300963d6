"""The SQLite backend: every SQLite statement tableq runs lives in queries.sql beside this file.
Standard library sqlite3, WAL, BEGIN IMMEDIATE for every writing transaction (so concurrent
processes queue on the lock instead of failing with SQLITE_BUSY_SNAPSHOT)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from tableq.backends._pool import Pool
from tableq.backends._queries import apply_pending, load_migrations, load_queries
from tableq.backends.base import (
    Backend,
    ClaimResult,
    ClaimSpec,
    Filter,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    as_rows,
    chunks,
    dead_row_values,
    merge_stats,
    retrying,
    shape_row,
)
from tableq.backends.base import (
    compile_filter as base_compile_filter,
)
from tableq.backends.sqlite.errors import map_errors
from tableq.errors import DuplicateMessage, InvalidArgument, LoadIncomplete
from tableq.url import DatabaseURL

T = TypeVar("T")
# busy_timeout already waits for the lock inside SQLite; a few retries cover the cases where
# SQLite reports SQLITE_BUSY without waiting (e.g. a WAL snapshot that moved on).
SQLITE_RETRIES = 3
SYNCHRONOUS = {"FULL": "FULL", "NORMAL": "NORMAL", "EXTRA": "EXTRA"}


def _ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _loads(value: Any) -> Any:
    return json.loads(value) if value is not None else None


def _epoch(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def _field_clause(i: int, field: str, value: Any, params: dict[str, Any]) -> str:
    """One JSON field compared by type and value; the path is bound (the field name passed a
    narrow grammar)."""
    path, p = f"f_path{i}", f"f_val{i}"
    params[path] = f'$."{field}"'
    if value is None or isinstance(value, bool):
        params[p] = "null" if value is None else ("true" if value else "false")
        return f"json_type(payload, :{path}) = :{p}"
    params[p] = value
    if isinstance(value, str):
        return f"(json_type(payload, :{path}) = 'text' AND payload ->> :{path} = :{p})"
    return (f"(json_type(payload, :{path}) IN ('integer', 'real') "
            f"AND payload ->> :{path} = :{p})")


def compile_filter(where: Filter | None) -> tuple[str, dict[str, Any]]:
    return base_compile_filter(where, param=lambda n: f":{n}", key_column="key",
                               field_clause=_field_clause)


class SQLiteBackend(Backend):
    dialect = "sqlite"

    def __init__(self, url: DatabaseURL, *, synchronous: str = "FULL",
                 busy_timeout_s: float = 10.0) -> None:
        sync = SYNCHRONOUS.get(str(synchronous).upper())
        if sync is None:
            raise InvalidArgument("synchronous must be FULL, NORMAL or EXTRA")
        self.url, self.path, self.where = url, url.database or "", url.redacted
        self.synchronous = sync
        self.busy_timeout_s = busy_timeout_s
        self.Q = load_queries(__package__, "{p}", url.namespace)
        self._migrations = load_migrations(__package__, "{p}", url.namespace)
        self.pool = Pool(self._connect, lambda c: c.close())

    # --- connections and transactions -----------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        def open_() -> sqlite3.Connection:
            with map_errors(self.where):
                conn = sqlite3.connect(
                    self.path, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False,
                )
                conn.row_factory = sqlite3.Row
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                return conn
        return retrying(open_, attempts=SQLITE_RETRIES)

    def _read(self, fn: Callable[[sqlite3.Connection], T], *, snapshot: bool = False) -> T:
        """Runs fn outside any write lock; snapshot=True wraps it in one read transaction so
        several statements see the same state."""
        def attempt() -> T:
            with self.pool.connection() as conn, map_errors(self.where):
                if not snapshot:
                    return fn(conn)
                conn.execute(self.Q.tx_begin_read)
                try:
                    return fn(conn)
                finally:
                    conn.execute(self.Q.tx_commit)
        return retrying(attempt, attempts=SQLITE_RETRIES)

    def _write(self, fn: Callable[[sqlite3.Connection], T], conn: Any = None) -> T:
        if conn is not None:  # the caller's transaction: no BEGIN, no COMMIT, no retry
            with map_errors(self.where):
                return fn(conn)

        def attempt() -> T:
            with self.pool.connection() as c, map_errors(self.where):
                c.execute(self.Q.tx_begin_write)
                try:
                    result = fn(c)
                    c.execute(self.Q.tx_commit)
                    return result
                except BaseException:
                    if c.in_transaction:
                        c.execute(self.Q.tx_rollback)
                    raise
        return retrying(attempt, attempts=SQLITE_RETRIES)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        def begin(conn: sqlite3.Connection) -> None:
            with map_errors(self.where):
                conn.execute(self.Q.tx_begin_write)

        with self.pool.connection() as conn:
            retrying(lambda: begin(conn), attempts=SQLITE_RETRIES)
            try:
                yield conn
            except BaseException:
                with map_errors(self.where):
                    if conn.in_transaction:
                        conn.execute(self.Q.tx_rollback)
                raise
            with map_errors(self.where):
                conn.execute(self.Q.tx_commit)

    def check_connection(self, conn: Any) -> None:
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidArgument(
                f"connection= must be a sqlite3.Connection to {self.path}, "
                f"not {type(conn).__name__}"
            )

    def close(self) -> None:
        self.pool.close()

    def now(self) -> datetime:
        return _ts(self._read(lambda c: c.execute(self.Q.clock_now).fetchone()[0]))

    def _row(self, raw: Any) -> Row:
        return shape_row(raw, _ts, _loads)

    # --- migrations -----------------------------------------------------------------------

    def schema_version(self) -> int:
        def run(c: sqlite3.Connection) -> int:
            c.execute(self.Q.migration_create)
            versions = [r[0] for r in c.execute(self.Q.migration_versions)]
            return max(versions, default=0)
        return self._write(run)

    def migrate(self) -> list[int]:
        def run(c: sqlite3.Connection) -> list[int]:
            # DDL is transactional in SQLite, and BEGIN IMMEDIATE makes migrators take turns.
            c.execute(self.Q.migration_create)
            done = {r[0] for r in c.execute(self.Q.migration_versions)}
            return apply_pending(self._migrations, done, c.execute, self.Q.migration_record)
        return self._write(run)

    # --- sending --------------------------------------------------------------------------

    @staticmethod
    def _params(m: NewMessage) -> dict[str, Any]:
        return {
            "topic": m.topic, "key": m.key, "kind": m.kind, "payload": m.json_text,
            "payload_bytes": m.data, "headers": m.headers_json, "priority": m.priority,
            "delay_s": m.delay_s, "at": _epoch(m.at),
        }

    def insert(self, rows: Sequence[NewMessage], on_duplicate: str,
               conn: Any = None) -> list[tuple[int, str]]:
        def run(c: sqlite3.Connection) -> list[tuple[int, str]]:
            out: list[tuple[int, str]] = []
            plain: list[dict[str, Any]] = []

            def flush() -> None:
                # Without keys nothing can conflict, and this connection holds the write
                # lock, so AUTOINCREMENT hands out consecutive ids.
                if plain:
                    c.executemany(self.Q.message_insert, plain)
                    last = c.execute(self.Q.last_insert_id).fetchone()[0]
                    out.extend((last - len(plain) + 1 + i, "sent") for i in range(len(plain)))
                    plain.clear()

            for m in rows:
                params = self._params(m)
                if m.key is None:
                    plain.append(params)
                    continue
                flush()
                found = c.execute(self.Q.message_find_key, params).fetchone()
                if found is None:
                    c.execute(self.Q.message_insert, params)
                    out.append((c.execute(self.Q.last_insert_id).fetchone()[0], "sent"))
                elif on_duplicate == "ignore":
                    out.append((found[0], "duplicate"))
                elif on_duplicate == "replace":
                    c.execute(self.Q.message_replace, {**params, "id": found[0]})
                    out.append((found[0], "replaced"))
                else:
                    raise DuplicateMessage(m.topic, m.key, found[0])
            flush()
            return out
        return self._write(run, conn)

    # --- receiving ------------------------------------------------------------------------

    def _due(self, c: sqlite3.Connection, spec: ClaimSpec) -> list[sqlite3.Row]:
        clause, fparams = compile_filter(spec.where)
        sql = self.Q.message_due.replace("/*filter*/", clause)
        return c.execute(sql, {"topic": spec.topic, "max": spec.max, **fparams}).fetchall()

    def claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        def run(c: sqlite3.Connection) -> ClaimResult:
            due = self._due(c, spec)
            spent = [r[0] for r in due if r[1] >= spec.max_attempts]
            live = [r[0] for r in due if r[1] < spec.max_attempts]
            if spent:
                ids = json.dumps(spent)
                c.execute(self.Q.message_bury_ids, {"ids": ids})
                c.execute(self.Q.message_delete_ids, {"ids": ids})
            rows: list[Row] = []
            if live:
                order = {mid: i for i, mid in enumerate(live)}
                raw = c.execute(self.Q.message_lease, {
                    "ids": json.dumps(live), "vt": spec.visibility_timeout_s,
                    "lease": spec.lease,
                }).fetchall()
                if spec.ids_only:
                    return ClaimResult([{"id": i} for i in live], len(spent))
                rows = sorted((self._row(r) for r in raw), key=lambda r: order[r["id"]])
            return ClaimResult(rows, len(spent))
        return self._write(run, conn)

    def claim_delete(self, spec: ClaimSpec) -> ClaimResult:
        def run(c: sqlite3.Connection) -> ClaimResult:
            due = [r[0] for r in self._due(c, spec)]
            if not due:
                return ClaimResult([], 0)
            order = {mid: i for i, mid in enumerate(due)}
            raw = c.execute(self.Q.message_take, {"ids": json.dumps(due)}).fetchall()
            rows = sorted((self._row(r) for r in raw), key=lambda r: order[r["id"]])
            for r in rows:  # it counts as received once
                r["attempts"] += 1
            return ClaimResult(rows, 0)
        return self._write(run)

    def ack(self, refs: Sequence[tuple[int, str]], retain: bool, conn: Any = None) -> set[int]:
        def run(c: sqlite3.Connection) -> set[int]:
            done: set[int] = set()
            for part in chunks(refs, 500):
                payload = json.dumps([[i, lease] for i, lease in part])
                if retain:
                    c.execute(self.Q.message_archive_refs, {"refs": payload})
                done.update(r[0] for r in c.execute(self.Q.message_ack_refs, {"refs": payload}))
            return done
        return self._write(run, conn)

    def release(self, msg_id: int, lease: str, delay_s: float, error: str | None,
                penalty: bool, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "delay_s": delay_s, "error": error,
                  "refund": 0 if penalty else 1}
        return self._write(
            lambda c: c.execute(self.Q.message_release, params).fetchone() is not None, conn)

    def extend(self, msg_id: int, lease: str, extend_s: float,
               progress_json: str | None) -> datetime | None:
        params = {"id": msg_id, "lease": lease, "extend_s": extend_s, "progress": progress_json}
        found = self._write(lambda c: c.execute(self.Q.message_extend, params).fetchone())
        return _ts(found[0]) if found else None

    def bury_taken(self, row: Row, error: str) -> None:
        params = {**dead_row_values(row, _epoch), "error": error}
        self._write(lambda c: c.execute(self.Q.dead_insert, params))

    def done_match(self, refs: Sequence[tuple[int, str]]) -> set[int]:
        p = {"refs": json.dumps([[i, lease] for i, lease in refs])}
        return self._read(lambda c: {r[0] for r in c.execute(self.Q.done_match, p)})

    def extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float) -> dict[int, datetime]:
        def run(c: sqlite3.Connection) -> dict[int, datetime]:
            out: dict[int, datetime] = {}
            for part in chunks(refs, 500):
                p = {"refs": json.dumps([[i, lease] for i, lease in part]), "extend_s": extend_s}
                out.update((r[0], _ts(r[1])) for r in c.execute(self.Q.message_extend_many, p))
            return out
        return self._write(run)

    def bury(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            params = {"id": msg_id, "lease": lease, "error": error}
            c.execute(self.Q.message_bury, params)
            return c.execute(self.Q.message_delete_leased, params).fetchone() is not None
        return self._write(run, conn)

    # --- looking ---------------------------------------------------------------------------

    def peek(self, topic: str, limit: int) -> list[Row]:
        raw = self._read(
            lambda c: c.execute(self.Q.message_peek, {"topic": topic, "limit": limit}).fetchall())
        return [self._row(r) for r in raw]

    def get(self, msg_id: int) -> Row | None:
        raw = self._read(lambda c: c.execute(self.Q.message_get, {"id": msg_id}).fetchone())
        return self._row(raw) if raw is not None else None

    def topics(self) -> list[str]:
        return self._read(lambda c: [r[0] for r in c.execute(self.Q.message_topics)])

    def stats(self, topic: str | None) -> list[Row]:
        def run(c: sqlite3.Connection) -> list[Row]:
            p = {"topic": topic}
            live = {r["topic"]: dict(r) for r in c.execute(self.Q.message_stats, p)}
            dead = {r[0]: r[1] for r in c.execute(self.Q.dead_stats, p)}
            done = {r[0]: r[1] for r in c.execute(self.Q.done_stats, p)}
            return merge_stats(live, dead, done)
        # One read transaction so the three counts agree with each other.
        return self._read(run, snapshot=True)

    def purge(self, topic: str) -> int:
        return self._write(lambda c: c.execute(self.Q.message_purge, {"topic": topic}).rowcount)

    # --- dead letters -----------------------------------------------------------------------

    def dead_list(self, topic: str, limit: int) -> list[Row]:
        raw = self._read(
            lambda c: c.execute(self.Q.dead_list, {"topic": topic, "limit": limit}).fetchall())
        return [self._row(r) for r in raw]

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, "ids": json.dumps(list(ids)) if ids is not None else None}

        def run(c: sqlite3.Connection) -> int:
            c.execute(self.Q.dead_requeue, params)
            return c.execute(self.Q.dead_delete_requeued, params).rowcount
        return self._write(run)

    def dead_purge(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, "ids": json.dumps(list(ids)) if ids is not None else None}
        return self._write(lambda c: c.execute(self.Q.dead_purge, params).rowcount)

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_rows(self, group: GroupLease) -> list[Row]:
        raw = self._read(lambda c: c.execute(self.Q.lease_rows, group.params()).fetchall())
        return [self._row(r) for r in raw]

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        def run(c: sqlite3.Connection) -> int:
            p = group.params()
            if retain:
                c.execute(self.Q.lease_archive, p)
            return c.execute(self.Q.lease_ack, p).rowcount
        return self._write(run)

    def lease_extend(self, group: GroupLease, extend_s: float) -> int:
        p = {**group.params(), "extend_s": extend_s}
        return self._write(lambda c: c.execute(self.Q.lease_extend, p).rowcount)

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def stage(self, job: str, part: int,
              batch: Sequence[NewMessage] | PayloadBatch) -> int:
        rows = as_rows(batch)

        def run(c: sqlite3.Connection) -> int:
            c.execute(self.Q.load_job_open, {"job": job})
            c.execute(self.Q.load_job_reopen, {"job": job})
            if c.execute(self.Q.load_job_state, {"job": job}).fetchone()[0] == "committed":
                return 0  # a replayed or late task of a finished load: it was published once
            c.executemany(self.Q.stage_insert,
                          [{**self._params(m), "job": job, "part": part} for m in rows])
            return len(rows)
        return self._write(run)

    def publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        def run(c: sqlite3.Connection) -> int | None:
            state = c.execute(self.Q.load_job_state, {"job": job}).fetchone()
            if state is not None and state[0] == "committed":
                c.execute(self.Q.stage_delete_job, {"job": job})
                return None
            q = self.Q.stage_publish_replace if on_duplicate == "replace" else self.Q.stage_publish
            p = {"job": job, "parts": json.dumps(list(parts))}
            if expected is not None:
                found = c.execute(self.Q.stage_count, p).fetchone()[0]
                if found != expected:
                    raise LoadIncomplete(job, expected, found)
            n = c.execute(q, p).rowcount
            c.execute(self.Q.stage_delete_job, {"job": job})
            c.execute(self.Q.load_job_finish, {"job": job, "state": "committed", "rows": n})
            return n
        return self._write(run)

    def discard(self, job: str) -> int:
        def run(c: sqlite3.Connection) -> int:
            n = c.execute(self.Q.stage_delete_job, {"job": job}).rowcount
            state = c.execute(self.Q.load_job_state, {"job": job}).fetchone()
            if state is None or state[0] != "committed":
                c.execute(self.Q.load_job_finish, {"job": job, "state": "aborted", "rows": 0})
            return n
        return self._write(run)

    def stage_cleanup(self, older_than_s: float) -> int:
        jobs = self._read(lambda c: [r[0] for r in c.execute(
            self.Q.stage_stale_jobs, {"older_than_s": older_than_s})])
        return sum(self.discard(job) for job in jobs)

    def job_state(self, job: str) -> str | None:
        found = self._read(lambda c: c.execute(self.Q.load_job_state, {"job": job}).fetchone())
        return found[0] if found else None

    # --- history ------------------------------------------------------------------------------

    def history_bounds(self, source: str, topic: str | None) -> tuple[int, int] | None:
        q = getattr(self.Q, f"history_bounds_{source}")
        lo, hi = self._read(lambda c: tuple(c.execute(q, {"topic": topic}).fetchone()))
        return None if lo is None else (lo, hi)

    def history_rows(self, source: str, topic: str | None, lo: int, hi: int,
                     before: datetime | None) -> list[Row]:
        q = getattr(self.Q, f"history_rows_{source}")
        p = {"topic": topic, "lo": lo, "hi": hi, "before": _epoch(before)}
        return [self._row(r) for r in self._read(lambda c: c.execute(q, p).fetchall())]

    def history_delete(self, source: str, ids: Sequence[int]) -> int:
        q = self.Q.history_delete_dead if source == "dead" else self.Q.history_delete_done
        return self._write(lambda c: c.execute(q, {"ids": json.dumps(list(ids))}).rowcount)

