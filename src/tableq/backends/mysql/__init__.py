"""The MySQL / MariaDB backend (PyMySQL): every statement it runs lives in queries.sql beside
this file. READ COMMITTED sessions in UTC, FOR UPDATE SKIP LOCKED claims, deadlocks and
lock-wait timeouts retried as whole transactions. No RETURNING is assumed, so it also runs on
MySQL 8."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pymysql
from pymysql.cursors import DictCursor

from tableq.backends._pool import Pool
from tableq.backends._queries import Queries, apply_pending, load_migrations, load_queries
from tableq.backends.base import (
    Backend,
    ClaimResult,
    ClaimSpec,
    Filter,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    TransientError,
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
from tableq.backends.mysql.errors import UniqueViolation, map_errors
from tableq.errors import DuplicateMessage, InvalidArgument, LoadIncomplete, UnsupportedDatabase
from tableq.url import DatabaseURL

T = TypeVar("T")
BATCH_ROWS = 1000  # rows per multi-row INSERT


def _ts(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def _loads(value: Any) -> Any:
    return json.loads(value) if value is not None else None


def _naive(at: datetime | None) -> datetime | None:
    """An aware datetime as the naive UTC value a DATETIME(6) column holds."""
    return at.astimezone(UTC).replace(tzinfo=None) if at is not None else None


def _us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _field_clause(i: int, field: str, value: Any, params: dict[str, Any]) -> str:
    """One JSON field compared by type and value. The path is bound too; field names passed
    a narrow grammar, so the path language sees no '$', '.', '*' or quotes from users."""
    path, val = f"f_path{i}", f"f_val{i}"
    params[path] = f'$."{field}"'
    typ = f"JSON_TYPE(JSON_EXTRACT(payload, %({path})s))"
    text = f"JSON_UNQUOTE(JSON_EXTRACT(payload, %({path})s)) = %({val})s"
    if value is None:
        return f"{typ} = 'NULL'"
    if isinstance(value, bool):
        params[val] = "true" if value else "false"
        return f"({typ} = 'BOOLEAN' AND {text})"
    params[val] = value
    if isinstance(value, str):
        return f"({typ} = 'STRING' AND {text})"
    return (f"({typ} IN ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL') AND "
            f"JSON_EXTRACT(payload, %({path})s) = %({val})s)")


def compile_filter(where: Filter | None) -> tuple[str, dict[str, Any]]:
    return base_compile_filter(where, param=lambda n: f"%({n})s", key_column="`key`",
                               field_clause=_field_clause)


def _repeat_rows(query: str, n: int) -> str:
    """The query with its VALUES row template repeated n times."""
    head, _, row = query.partition("/*rows*/")
    return head + ", ".join([row.strip()] * n)


class MySQLBackend(Backend):
    dialect = "mysql"

    def __init__(self, url: DatabaseURL, *, pool_size: int = 32,
                 connect_timeout_s: float = 10,
                 transaction_idle_timeout_s: float = 300.0) -> None:
        self.url, self.where = url, url.redacted
        self.prefix = url.namespace
        self.Q: Queries = load_queries(__package__, "{p}", self.prefix)
        self.connect_kwargs: dict[str, Any] = {
            "host": url.host, "port": url.port or 3306, "user": url.user or "root",
            "password": url.password or "", "database": url.database, "charset": "utf8mb4",
            "autocommit": True, "cursorclass": DictCursor,
            "connect_timeout": max(1, int(connect_timeout_s)),
        }
        self.transaction_idle_s = max(1, int(transaction_idle_timeout_s))
        self.mariadb: bool | None = None
        self.consecutive_ids = True
        self.id_step = 1
        self.pool = Pool(self._connect, lambda c: c.close(), max_idle=pool_size,
                         socket_of=lambda c: c._sock.fileno())

    # --- connections and transactions -----------------------------------------------------

    def _connect(self) -> pymysql.connections.Connection:
        with map_errors(self.where):
            conn = pymysql.connect(**self.connect_kwargs)
            with conn.cursor() as cur:
                cur.execute(self.Q.session_time_zone)
                cur.execute(self.Q.session_isolation)
                if self.mariadb is None:
                    cur.execute(self.Q.server_version)
                    self._check_version(cur.fetchone(), conn)
                if self.mariadb:
                    cur.execute(self.Q.session_idle_transaction_limit,
                                {"seconds": self.transaction_idle_s})
            return conn

    def _check_version(self, row: Row, conn: Any) -> None:
        version = str(row["version"])
        numbers = tuple(int(p) for p in version.split("-")[0].split(".")[:2])
        mariadb = "mariadb" in version.lower()
        if (mariadb and numbers < (10, 6)) or (not mariadb and numbers < (8, 0)):
            conn.close()
            raise UnsupportedDatabase("MariaDB" if mariadb else "MySQL", version,
                                      "MariaDB 10.6+ or MySQL 8.0+")
        # Mode 2 ("interleaved") may hand a multi-row INSERT non-consecutive ids.
        self.consecutive_ids = int(row["autoinc_lock_mode"]) <= 1
        self.id_step = int(row["id_step"])  # auto_increment_increment: > 1 on some clusters
        self.mariadb = mariadb

    def _run(self, fn: Callable[[Any], T], conn: Any = None, *, tx: bool = False) -> T:
        if conn is not None:  # the caller's transaction: no BEGIN, no COMMIT, no retry
            with map_errors(self.where), conn.cursor(DictCursor) as cur:
                return fn(cur)

        def attempt() -> T:
            with self.pool.connection() as c, map_errors(self.where):
                if not tx:
                    with c.cursor() as cur:
                        return fn(cur)
                c.begin()
                try:
                    with c.cursor() as cur:
                        result = fn(cur)
                    c.commit()
                    return result
                except BaseException:
                    c.rollback()
                    raise
        return retrying(attempt)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.pool.connection() as conn:
            with map_errors(self.where):
                conn.begin()
            try:
                yield conn
            except BaseException:
                with map_errors(self.where):
                    conn.rollback()
                raise
            with map_errors(self.where):
                conn.commit()

    def check_connection(self, conn: Any) -> None:
        if not isinstance(conn, pymysql.connections.Connection):
            raise InvalidArgument(
                f"connection= must be an open PyMySQL Connection, not {type(conn).__name__}"
            )

    def close(self) -> None:
        self.pool.close()

    def _one(self, cur: Any, query: str, params: Any = None) -> Row | None:
        cur.execute(query, params)
        return cur.fetchone()  # type: ignore[no-any-return]

    def _all_raw(self, cur: Any, query: str, params: Any = None) -> list[Row]:
        cur.execute(query, params)
        return list(cur.fetchall())

    def now(self) -> datetime:
        return _ts(self._run(lambda cur: self._one(cur, self.Q.clock_now))["now"])  # type: ignore[index]

    def _row(self, raw: Any) -> Row:
        row = shape_row(raw, _ts, _loads)
        row.pop("db_now", None)
        return row

    # --- migrations -----------------------------------------------------------------------

    def _locked(self, fn: Callable[[Any], T]) -> T:
        def run(cur: Any) -> T:
            got = self._one(cur, self.Q.migration_lock, {"prefix": self.prefix})
            if not got or not got["got"]:
                raise TimeoutError("another process held tableq's migration lock for 60 s")
            try:
                cur.execute(self.Q.migration_create)
                return fn(cur)
            finally:
                cur.execute(self.Q.migration_unlock, {"prefix": self.prefix})
        return self._run(run)

    def schema_version(self) -> int:
        return self._locked(lambda cur: max(
            (r["version"] for r in self._all_raw(cur, self.Q.migration_versions)), default=0))

    def migrate(self) -> list[int]:
        self.now()  # connects once, so the server flavour is known
        collation = "utf8mb4_nopad_bin" if self.mariadb else "utf8mb4_0900_bin"
        migrations = [
            replace(m, statements=tuple(s.replace("{bin}", collation) for s in m.statements))
            for m in load_migrations(__package__, "{p}", self.prefix)
        ]

        def run(cur: Any) -> list[int]:
            done = {r["version"] for r in self._all_raw(cur, self.Q.migration_versions)}
            return apply_pending(migrations, done, cur.execute, self.Q.migration_record)
        return self._locked(run)

    # --- sending --------------------------------------------------------------------------

    @staticmethod
    def _params(m: NewMessage) -> dict[str, Any]:
        return {
            "topic": m.topic, "key": m.key, "kind": m.kind, "payload": m.json_text,
            "payload_bytes": m.data, "headers": m.headers_json, "priority": m.priority,
            "at": _naive(m.at), "delay_us": _us(m.delay_s),
        }

    def _insert_plain(self, cur: Any, rows: Sequence[NewMessage]) -> list[int]:
        ids: list[int] = []
        size = BATCH_ROWS if self.consecutive_ids else 1
        for part in chunks(rows, size):
            flat: list[Any] = []
            for m in part:
                at, us = _naive(m.at), _us(m.delay_s)
                flat += [m.topic, m.key, m.kind, m.json_text, m.data, m.headers_json,
                         m.priority, at, us, at, us]
            cur.execute(_repeat_rows(self.Q.message_insert, len(part)), flat)
            first = cur.lastrowid  # LAST_INSERT_ID(): the first id of this statement
            ids.extend(range(first, first + len(part) * self.id_step, self.id_step))
        return ids

    def insert(self, rows: Sequence[NewMessage], on_duplicate: str,
               conn: Any = None) -> list[tuple[int, str]]:
        def run(cur: Any) -> list[tuple[int, str]]:
            out: list[tuple[int, str]] = []
            plain: list[NewMessage] = []

            def flush() -> None:
                out.extend((i, "sent") for i in self._insert_plain(cur, plain))
                plain.clear()

            for m in rows:
                if m.key is None:
                    plain.append(m)
                    continue
                flush()
                out.append(self._insert_keyed(cur, m, on_duplicate))
            flush()
            return out
        return self._run(run, conn, tx=len(rows) > 1)

    def _insert_keyed(self, cur: Any, m: NewMessage, on_duplicate: str) -> tuple[int, str]:
        params = self._params(m)
        if on_duplicate == "error":
            try:
                with map_errors(self.where):
                    cur.execute(self.Q.message_insert_strict, params)
            except UniqueViolation:
                found = self._one(cur, self.Q.message_find_key, params)
                raise DuplicateMessage(m.topic, m.key, found["id"] if found else None) from None
            return cur.lastrowid, "sent"
        query = (self.Q.message_insert_replace if on_duplicate == "replace"
                 else self.Q.message_insert_keyed)
        changed = cur.execute(query, params)
        if changed == 1:
            return cur.lastrowid, "sent"
        return cur.lastrowid, "replaced" if on_duplicate == "replace" else "duplicate"

    # --- receiving ------------------------------------------------------------------------

    def _due(self, cur: Any, spec: ClaimSpec) -> list[Row]:
        clause, params = compile_filter(spec.where)
        params.update(topic=spec.topic, max=spec.max)
        return self._all_raw(cur, self.Q.message_due.replace("/*filter*/", clause), params)

    def claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        def run(cur: Any) -> ClaimResult:
            due = self._due(cur, spec)
            spent = tuple(r["id"] for r in due if r["attempts"] >= spec.max_attempts)
            live = [r for r in due if r["attempts"] < spec.max_attempts]
            if spent:
                cur.execute(self.Q.message_bury_ids, {"ids": spent})
                cur.execute(self.Q.message_delete_ids, {"ids": spent})
            if not live:
                return ClaimResult([], len(spent))
            # One token per receive call: fencing needs a new token per delivery, not per row.
            now = live[0]["db_now"]
            until = now + timedelta(seconds=spec.visibility_timeout_s)
            lease = spec.lease or uuid.uuid4().hex
            cur.execute(self.Q.message_lease, {"ids": tuple(r["id"] for r in live),
                                               "lease": lease, "now": now, "until": until})
            if spec.ids_only:
                return ClaimResult([{"id": r["id"]} for r in live], len(spent))
            rows = []
            for r in live:
                row = self._row(r)
                row.update(lease=lease, attempts=r["attempts"] + 1, received_at=_ts(now),
                           available_at=_ts(until))
                rows.append(row)
            return ClaimResult(rows, len(spent))
        return self._run(run, conn, tx=True)

    def claim_delete(self, spec: ClaimSpec) -> ClaimResult:
        def run(cur: Any) -> ClaimResult:
            due = self._due(cur, spec)
            if due:
                cur.execute(self.Q.message_delete_ids, {"ids": tuple(r["id"] for r in due)})
            rows = [self._row(r) for r in due]
            for r in rows:  # it counts as received once
                r["attempts"] += 1
            return ClaimResult(rows, 0)
        return self._run(run, tx=True)

    def ack(self, refs: Sequence[tuple[int, str]], retain: bool, conn: Any = None) -> set[int]:
        if len(refs) == 1 and not retain:  # the common case: one statement, no transaction
            msg_id, lease = refs[0]
            n = self._run(lambda cur: cur.execute(self.Q.message_ack_one,
                                                  {"id": msg_id, "lease": lease}), conn)
            return {msg_id} if n else set()

        def run(cur: Any) -> set[int]:
            held: set[int] = set()
            for part in chunks(refs, BATCH_ROWS):
                ids = tuple(r["id"] for r in self._all_raw(
                    cur, self.Q.message_held, {"refs": tuple(part)}))
                if ids:
                    if retain:
                        cur.execute(self.Q.message_archive_ids, {"ids": ids})
                    cur.execute(self.Q.message_delete_ids, {"ids": ids})
                    held.update(ids)
            return held
        return self._run(run, conn, tx=True)

    def release(self, msg_id: int, lease: str, delay_s: float, error: str | None,
                penalty: bool, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "delay_us": _us(delay_s), "error": error,
                  "refund": 0 if penalty else 1}
        return bool(self._run(lambda cur: cur.execute(self.Q.message_release, params), conn))

    def extend(self, msg_id: int, lease: str, extend_s: float,
               progress_json: str | None) -> datetime | None:
        params = {"id": msg_id, "lease": lease, "extend_us": _us(extend_s),
                  "progress": progress_json}

        def run(cur: Any) -> datetime | None:
            cur.execute(self.Q.message_extend, params)
            found = self._one(cur, self.Q.message_lease_until, params)
            return _ts(found["available_at"]) if found else None
        return self._run(run, tx=True)

    def extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float) -> dict[int, datetime]:
        def run(cur: Any) -> dict[int, datetime]:
            out: dict[int, datetime] = {}
            for part in chunks(refs, BATCH_ROWS):
                ids = tuple(r["id"] for r in self._all_raw(
                    cur, self.Q.message_held, {"refs": tuple(part)}))
                if ids:
                    cur.execute(self.Q.message_extend_many,
                                {"ids": ids, "extend_us": _us(extend_s)})
                    out.update((r["id"], _ts(r["available_at"])) for r in self._all_raw(
                        cur, self.Q.message_due_at, {"ids": ids}))
            return out
        return self._run(run, tx=True)

    def bury(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "error": error}

        def run(cur: Any) -> bool:
            # Without the lock, a receive could take the message between the copy and the
            # delete, leaving it both dead and in flight.
            if self._one(cur, self.Q.message_lock_leased, params) is None:
                return False
            cur.execute(self.Q.message_bury, params)
            cur.execute(self.Q.message_ack_one, params)
            return True
        return self._run(run, conn, tx=True)

    def bury_taken(self, row: Row, error: str) -> None:
        params = {**dead_row_values(row, _naive), "error": error}
        self._run(lambda cur: cur.execute(self.Q.dead_insert, params))

    def done_match(self, refs: Sequence[tuple[int, str]]) -> set[int]:
        return {r["id"] for r in self._run(lambda cur: self._all_raw(
            cur, self.Q.done_match, {"refs": tuple(refs)}))}

    # --- looking ---------------------------------------------------------------------------

    def _all(self, query: str, params: dict[str, Any]) -> list[Row]:
        return [self._row(r) for r in self._run(lambda cur: self._all_raw(cur, query, params))]

    def peek(self, topic: str, limit: int) -> list[Row]:
        return self._all(self.Q.message_peek, {"topic": topic, "limit": limit})

    def get(self, msg_id: int) -> Row | None:
        rows = self._all(self.Q.message_get, {"id": msg_id})
        return rows[0] if rows else None

    def topics(self) -> list[str]:
        rows = self._run(lambda cur: self._all_raw(cur, self.Q.message_topics))
        return [r["topic"] for r in rows]

    def stats(self, topic: str | None) -> list[Row]:
        def run(cur: Any) -> list[Row]:
            p = {"topic": topic}
            live = {r["topic"]: r for r in self._all_raw(cur, self.Q.message_stats, p)}
            dead = {r["topic"]: r["dead"] for r in self._all_raw(cur, self.Q.dead_stats, p)}
            done = {r["topic"]: r["done"] for r in self._all_raw(cur, self.Q.done_stats, p)}
            return merge_stats(live, dead, done)
        return self._run(run, tx=True)

    def purge(self, topic: str) -> int:
        return self._run(lambda cur: cur.execute(self.Q.message_purge, {"topic": topic}))

    # --- dead letters -----------------------------------------------------------------------

    def dead_list(self, topic: str, limit: int) -> list[Row]:
        return self._all(self.Q.dead_list, {"topic": topic, "limit": limit})

    @staticmethod
    def _id_filter(topic: str, ids: Sequence[int] | None) -> dict[str, Any]:
        return {"topic": topic, "all": ids is None, "ids": tuple(ids) if ids else (0,)}

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        def run(cur: Any) -> int:
            movable = tuple(r["id"] for r in self._all_raw(
                cur, self.Q.dead_requeue_ids, self._id_filter(topic, ids)))
            if not movable:
                return 0
            try:
                with map_errors(self.where):
                    cur.execute(self.Q.dead_requeue, {"ids": movable})
            except UniqueViolation as exc:  # a send of the same key won the race: try again
                raise TransientError(str(exc), self.where) from exc
            cur.execute(self.Q.dead_delete_ids, {"ids": movable})
            return len(movable)
        return self._run(run, tx=True)

    def dead_purge(self, topic: str, ids: Sequence[int] | None) -> int:
        return self._run(lambda cur: cur.execute(self.Q.dead_purge, self._id_filter(topic, ids)))

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_rows(self, group: GroupLease) -> list[Row]:
        return self._all(self.Q.lease_rows, group.params())

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        def run(cur: Any) -> int:
            p = group.params()
            if not retain:
                return cur.execute(self.Q.lease_ack, p)  # type: ignore[no-any-return]
            ids = tuple(r["id"] for r in self._all_raw(cur, self.Q.lease_lock, p))
            if ids:
                cur.execute(self.Q.message_archive_ids, {"ids": ids})
                cur.execute(self.Q.message_delete_ids, {"ids": ids})
            return len(ids)
        return self._run(run, tx=True)

    def lease_extend(self, group: GroupLease, extend_s: float) -> int:
        p = {**group.params(), "extend_us": _us(extend_s)}
        return self._run(lambda cur: cur.execute(self.Q.lease_extend, p))

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def stage(self, job: str, part: int,
              batch: Sequence[NewMessage] | PayloadBatch) -> int:
        rows = as_rows(batch)

        def run(cur: Any) -> int:
            cur.execute(self.Q.load_job_open, {"job": job})
            cur.execute(self.Q.load_job_reopen, {"job": job})
            if self._one(cur, self.Q.load_job_share, {"job": job})["state"] == "committed":  # type: ignore[index]
                return 0  # a replayed or late task of a finished load: it was published once
            for batch in chunks(rows, BATCH_ROWS):
                flat: list[Any] = []
                for m in batch:
                    flat += [job, part, m.topic, m.key, m.kind, m.json_text, m.data,
                             m.headers_json, m.priority, float(m.delay_s), _naive(m.at)]
                cur.execute(_repeat_rows(self.Q.stage_insert, len(batch)), flat)
            return len(rows)
        return self._run(run, tx=True)

    def publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        query = self.Q.stage_publish_replace if on_duplicate == "replace" else self.Q.stage_publish

        def run(cur: Any) -> int | None:
            cur.execute(self.Q.load_job_open, {"job": job})
            state = self._one(cur, self.Q.load_job_lock, {"job": job})["state"]  # type: ignore[index]
            if state == "committed":
                cur.execute(self.Q.stage_delete_job, {"job": job})
                return None
            n = 0
            p = {"job": job, "parts": tuple(parts) or (-1,)}
            staged = int(self._one(cur, self.Q.stage_count, p)["n"])  # type: ignore[index]
            if expected is not None and staged != expected:
                raise LoadIncomplete(job, expected, staged)
            if parts:
                if on_duplicate == "replace":  # rowcount counts an updated row twice
                    n = staged
                    cur.execute(query, p)
                else:  # inserted rows count 1, dropped duplicates 0
                    n = cur.execute(query, p)
            cur.execute(self.Q.stage_delete_job, {"job": job})
            cur.execute(self.Q.load_job_finish, {"job": job, "state": "committed", "rows": n})
            return n
        return self._run(run, tx=True)

    def discard(self, job: str) -> int:
        def run(cur: Any) -> int:
            cur.execute(self.Q.load_job_open, {"job": job})
            state = self._one(cur, self.Q.load_job_lock, {"job": job})["state"]  # type: ignore[index]
            n = cur.execute(self.Q.stage_delete_job, {"job": job})
            if state != "committed":
                cur.execute(self.Q.load_job_finish, {"job": job, "state": "aborted", "rows": 0})
            return n  # type: ignore[no-any-return]
        return self._run(run, tx=True)

    def stage_cleanup(self, older_than_s: float) -> int:
        jobs = [r["job"] for r in self._run(lambda cur: self._all_raw(
            cur, self.Q.stage_stale_jobs, {"older_than_us": _us(older_than_s)}))]
        return sum(self.discard(job) for job in jobs)

    def job_state(self, job: str) -> str | None:
        found = self._run(lambda cur: self._one(cur, self.Q.load_job_state, {"job": job}))
        return found["state"] if found else None

    # --- history ------------------------------------------------------------------------------

    def history_bounds(self, source: str, topic: str | None) -> tuple[int, int] | None:
        q = getattr(self.Q, f"history_bounds_{source}")
        found = self._run(lambda cur: self._one(cur, q, {"topic": topic}))
        return None if not found or found["lo"] is None else (found["lo"], found["hi"])

    def history_rows(self, source: str, topic: str | None, lo: int, hi: int,
                     before: datetime | None) -> list[Row]:
        q = getattr(self.Q, f"history_rows_{source}")
        return self._all(q, {"topic": topic, "lo": lo, "hi": hi, "before": _naive(before)})

    def history_delete(self, source: str, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        q = self.Q.history_delete_dead if source == "dead" else self.Q.history_delete_done
        return self._run(lambda cur: cur.execute(q, {"ids": tuple(ids)}))
