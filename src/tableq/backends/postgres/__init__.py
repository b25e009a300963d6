"""The PostgreSQL backend (psycopg 3): every PostgreSQL statement tableq runs lives in
queries.sql beside this file. Autocommit connections from a fork-aware pool, so a
single-statement operation (send, receive, ack) is one round trip; FOR UPDATE SKIP LOCKED
claims; LISTEN/NOTIFY wake-up hints."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

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
from tableq.backends.postgres.errors import UniqueViolation, map_errors
from tableq.errors import (
    DatabaseError,
    DuplicateMessage,
    InvalidArgument,
    LoadIncomplete,
    UnsupportedDatabase,
)
from tableq.url import DatabaseURL

T = TypeVar("T")
MIN_VERSION = 130000  # gen_random_uuid() is built in from 13 on
_EXTRA = ("due_priority", "due_at", "buried")


def _ts(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _same(value: Any) -> Any:
    return value  # psycopg already decoded jsonb


def _field_clause(i: int, field: str, value: Any, params: dict[str, Any]) -> str:
    """`payload -> key` takes the key as a bound value, never as a path string."""
    params[f"f_field{i}"] = field
    params[f"f_value{i}"] = json.dumps(value)
    return f"payload -> %(f_field{i})s = %(f_value{i})s::jsonb"


def compile_filter(where: Filter | None) -> tuple[str, dict[str, Any]]:
    return base_compile_filter(where, param=lambda n: f"%({n})s", key_column="key",
                               field_clause=_field_clause)


def _arrays(rows: Sequence[NewMessage]) -> dict[str, list[Any]]:
    return {
        "topics": [m.topic for m in rows],
        "keys": [m.key for m in rows],
        "kinds": [m.kind for m in rows],
        "payloads": [m.json_text for m in rows],
        "datas": [m.data for m in rows],
        "headers": [m.headers_json for m in rows],
        "priorities": [m.priority for m in rows],
        "ats": [m.at for m in rows],
        "delays": [float(m.delay_s) for m in rows],
    }


class PostgresListener:
    """Wake-up hints from LISTEN/NOTIFY on a dedicated connection. A hint, not a transport:
    notifications are lost while disconnected, so workers keep polling as well."""

    def __init__(self, backend: PostgresBackend) -> None:
        self._where = backend.where
        with map_errors(self._where):
            self._conn = psycopg.connect(**backend.connect_kwargs, autocommit=True)
            self._conn.execute(backend.Q.listen)

    def wait_counts(self, timeout_s: float) -> dict[str, int]:
        """Blocks up to timeout_s for the first notification, then takes whatever else has
        arrived; returns {topic: number of new due messages}."""
        found: dict[str, int] = {}
        with map_errors(self._where):
            for limit, stop in ((timeout_s, 1), (0.0, None)):
                for note in self._conn.notifies(timeout=limit, stop_after=stop):
                    data = json.loads(note.payload)
                    found[data["topic"]] = found.get(data["topic"], 0) + int(data["n"])
                if not found:
                    break
        return found

    def wait(self, timeout_s: float) -> list[str]:
        return sorted(self.wait_counts(timeout_s))

    def close(self) -> None:
        self._conn.close()


def _copy_field(value: str | None) -> str:
    """A text value in COPY's text format."""
    if value is None:
        return "\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                 .replace("\r", "\\r"))
    return value


def copy_text(load_part: int, t: NewMessage,
              payloads: Sequence[tuple[str | None, bytes | None]]) -> str:
    """message_copy rows for payloads sharing the template t, as one block of COPY text:
    psycopg's write_row per row cost as much client time as encoding the payloads."""
    head = f"{_copy_field(t.topic)}\t{_copy_field(t.kind)}\t"
    tail = f"\t{_copy_field(t.headers_json)}\t{t.priority}\t{load_part}\n"
    field = _copy_field
    return "".join([head + (field(text) + "\t\\N" if data is None
                            else "\\N\t\\\\x" + data.hex()) + tail
                    for text, data in payloads])


class PostgresBackend(Backend):
    dialect = "postgres"

    def __init__(self, url: DatabaseURL, *, pool_size: int = 32, connect_timeout_s: float = 10,
                 application_name: str = "tableq",
                 transaction_idle_timeout_s: float = 300.0) -> None:
        self.url, self.where = url, url.redacted
        self.schema = url.namespace
        quoted = f'"{self.schema}"'
        self.Q = load_queries(__package__, "{schema}", quoted)
        self.Q.listen = self.Q.listen.replace("{channel}", f'"{self.schema}_wake"')
        self._migrations = load_migrations(__package__, "{schema}", quoted)
        self.connect_kwargs: dict[str, Any] = {
            "host": url.host, "port": url.port or 5432, "dbname": url.database,
            "user": url.user, "password": url.password,
            "connect_timeout": max(1, int(connect_timeout_s)),
            "application_name": url.params.get("application_name", application_name),
        }
        for name in ("sslmode", "sslrootcert", "sslcert", "sslkey", "target_session_attrs"):
            if name in url.params:
                self.connect_kwargs[name] = url.params[name]
        self.transaction_idle_ms = str(int(transaction_idle_timeout_s * 1000))
        self._checked = False
        self.pool = Pool(self._connect, lambda c: c.close(), max_idle=pool_size,
                         socket_of=lambda c: c.fileno())

    # --- connections and transactions -----------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        with map_errors(self.where):
            conn = psycopg.connect(**self.connect_kwargs, autocommit=True)
            if not self._checked:
                version = conn.execute(self.Q.server_version).fetchone()[0]  # type: ignore[index]
                if version < MIN_VERSION:
                    conn.close()
                    raise UnsupportedDatabase("PostgreSQL", str(version), "PostgreSQL 13 or newer")
                self._checked = True
            return conn

    def _run(self, fn: Callable[[psycopg.Cursor[Any]], T], conn: Any = None, *,
             tx: bool = False) -> T:
        if conn is not None:  # the caller's transaction: no BEGIN, no COMMIT, no retry
            with map_errors(self.where), conn.cursor(row_factory=dict_row) as cur:
                return fn(cur)

        def attempt() -> T:
            with self.pool.connection() as c, map_errors(self.where):
                if tx:
                    with c.transaction(), c.cursor(row_factory=dict_row) as cur:
                        return fn(cur)
                with c.cursor(row_factory=dict_row) as cur:
                    return fn(cur)
        return retrying(attempt)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self.pool.connection() as conn:
            with map_errors(self.where):
                tx = conn.transaction()
                tx.__enter__()
                conn.execute(self.Q.transaction_idle_limit, {"ms": self.transaction_idle_ms})
            try:
                yield conn
            except BaseException as exc:
                with map_errors(self.where):
                    tx.__exit__(type(exc), exc, exc.__traceback__)
                raise
            with map_errors(self.where):
                if conn.info.transaction_status == TransactionStatus.INERROR:
                    tx.__exit__(None, None, None)  # rolls back: PostgreSQL would not commit
                    raise DatabaseError(
                        "a statement inside queue.transaction() failed, so PostgreSQL rolled "
                        "the whole transaction back and nothing was committed; let the error "
                        "propagate out of the block (or use a savepoint) and retry")
                tx.__exit__(None, None, None)

    def check_connection(self, conn: Any) -> None:
        if not isinstance(conn, psycopg.Connection):
            raise InvalidArgument(
                f"connection= must be an open psycopg 3 Connection, not {type(conn).__name__}"
            )

    def listener(self) -> PostgresListener:
        return PostgresListener(self)

    def close(self) -> None:
        self.pool.close()

    def now(self) -> datetime:
        return _ts(self._run(lambda cur: cur.execute(self.Q.clock_now).fetchone()["now"]))

    def _row(self, raw: Any) -> Row:
        row = shape_row(raw, _ts, _same)
        for name in _EXTRA:
            row.pop(name, None)
        return row

    # --- migrations -----------------------------------------------------------------------

    def _migration_setup(self, cur: psycopg.Cursor[Any]) -> set[int]:
        cur.execute(self.Q.migration_lock, {"schema": self.schema})
        cur.execute(self.Q.schema_create)
        cur.execute(self.Q.migration_create)
        return {r["version"] for r in cur.execute(self.Q.migration_versions)}

    def schema_version(self) -> int:
        return max(self._run(self._migration_setup, tx=True), default=0)

    def migrate(self) -> list[int]:
        def run(cur: psycopg.Cursor[Any]) -> list[int]:
            # DDL is transactional here; the advisory lock makes migrators take turns.
            done = self._migration_setup(cur)
            return apply_pending(self._migrations, done, cur.execute, self.Q.migration_record)
        return self._run(run, tx=True)

    # --- sending --------------------------------------------------------------------------

    def insert(self, rows: Sequence[NewMessage], on_duplicate: str,
               conn: Any = None) -> list[tuple[int, str]]:
        query = {"ignore": self.Q.message_insert_ignore, "replace": self.Q.message_insert_replace,
                 "error": self.Q.message_insert}[on_duplicate]

        def run(cur: psycopg.Cursor[Any]) -> list[tuple[int, str]]:
            results: dict[int, tuple[int, str]] = {}
            pending = list(range(len(rows)))
            for _ in range(5):  # a duplicate that vanished before we could read it: insert again
                batch = [rows[i] for i in pending]
                try:
                    with map_errors(self.where), self._savepoint(cur, conn, on_duplicate):
                        got = cur.execute(query, _arrays(batch)).fetchall()
                except UniqueViolation:
                    raise self._duplicate(cur, batch) from None
                keyed = {r["key"]: r for r in got if r["key"] is not None}
                plain = iter(sorted(r["id"] for r in got if r["key"] is None))
                missing = []
                for i, m in zip(pending, batch, strict=True):
                    if m.key is None:
                        results[i] = (next(plain), "sent")
                    elif m.key in keyed:
                        r = keyed[m.key]
                        results[i] = (r["id"], "sent" if r.get("inserted", True) else "replaced")
                    else:
                        missing.append(i)
                if not missing:
                    break
                found = {r["key"]: r["id"] for r in cur.execute(self.Q.message_find_keys, {
                    "topics": [rows[i].topic for i in missing],
                    "keys": [rows[i].key for i in missing]})}
                pending = []
                for i in missing:
                    if rows[i].key in found:
                        results[i] = (found[rows[i].key], "duplicate")
                    else:
                        pending.append(i)
                if not pending:
                    break
            return [results[i] for i in range(len(rows))]
        # The queue layer removes duplicate keys within one batch, so keys identify rows.
        return self._run(run, conn)

    @contextmanager
    def _savepoint(self, cur: psycopg.Cursor[Any], conn: Any, on_duplicate: str
                   ) -> Iterator[None]:
        """In the caller's transaction a failed statement would abort all of it, so a send
        that may conflict runs in a savepoint and the transaction stays usable."""
        own_statement = conn is None or (
            conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE)
        if own_statement or on_duplicate != "error":
            yield
            return
        cur.execute(self.Q.savepoint_set)  # psycopg opens the caller's transaction if needed
        try:
            yield
        except BaseException:
            cur.execute(self.Q.savepoint_rollback)
            raise
        cur.execute(self.Q.savepoint_release)

    def _duplicate(self, cur: psycopg.Cursor[Any], batch: Sequence[NewMessage]
                   ) -> DuplicateMessage:
        keyed = [m for m in batch if m.key is not None]
        if keyed:
            found = cur.execute(self.Q.message_find_keys, {
                "topics": [m.topic for m in keyed], "keys": [m.key for m in keyed]}).fetchall()
            if found:
                return DuplicateMessage(found[0]["topic"], found[0]["key"], found[0]["id"])
        first = keyed[0] if keyed else batch[0]
        return DuplicateMessage(first.topic, first.key)

    # --- receiving ------------------------------------------------------------------------

    def _claim_params(self, query: str, spec: ClaimSpec) -> tuple[str, dict[str, Any]]:
        clause, params = compile_filter(spec.where)
        params.update(topic=spec.topic, max=spec.max, max_attempts=spec.max_attempts,
                      lease=spec.lease, vt=float(spec.visibility_timeout_s))
        return query.replace("/*filter*/", clause), params

    def claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        sql, params = self._claim_params(self.Q.message_claim, spec)
        if spec.ids_only:
            sql = sql.replace("l.* /*leased*/", "l.id")
        raw = self._run(lambda cur: cur.execute(sql, params).fetchall(), conn)
        buried = int(raw[0]["buried"]) if raw else 0
        shape = (lambda r: {"id": r["id"]}) if spec.ids_only else self._row
        return ClaimResult([shape(r) for r in raw if r["id"] is not None], buried)

    def claim_delete(self, spec: ClaimSpec) -> ClaimResult:
        sql, params = self._claim_params(self.Q.message_take, spec)
        raw = self._run(lambda cur: cur.execute(sql, params).fetchall())
        rows = sorted((self._row(r) for r in raw),
                      key=lambda r: (-r["priority"], r["available_at"], r["id"]))
        for r in rows:  # it counts as received once
            r["attempts"] += 1
        return ClaimResult(rows, 0)

    def ack(self, refs: Sequence[tuple[int, str]], retain: bool, conn: Any = None) -> set[int]:
        query = self.Q.message_ack_retain if retain else self.Q.message_ack
        params = {"ids": [i for i, _ in refs], "leases": [lease for _, lease in refs]}
        return self._run(lambda cur: {r["id"] for r in cur.execute(query, params)}, conn)

    def release(self, msg_id: int, lease: str, delay_s: float, error: str | None,
                penalty: bool, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "delay_s": float(delay_s), "error": error,
                  "refund": 0 if penalty else 1}
        return self._run(
            lambda cur: cur.execute(self.Q.message_release, params).fetchone() is not None, conn)

    def extend(self, msg_id: int, lease: str, extend_s: float,
               progress_json: str | None) -> datetime | None:
        params = {"id": msg_id, "lease": lease, "extend_s": float(extend_s),
                  "progress": progress_json}
        found = self._run(lambda cur: cur.execute(self.Q.message_extend, params).fetchone())
        return _ts(found["available_at"]) if found else None

    def bury_taken(self, row: Row, error: str) -> None:
        params = {**dead_row_values(row, lambda t: t), "error": error}
        self._run(lambda cur: cur.execute(self.Q.dead_insert, params))

    def done_match(self, refs: Sequence[tuple[int, str]]) -> set[int]:
        params = {"ids": [i for i, _ in refs], "leases": [lease for _, lease in refs]}
        return self._run(lambda cur: {r["id"] for r in cur.execute(self.Q.done_match, params)})

    def extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float) -> dict[int, datetime]:
        params = {"ids": [i for i, _ in refs], "leases": [lease for _, lease in refs],
                  "extend_s": float(extend_s)}
        rows = self._run(lambda cur: cur.execute(self.Q.message_extend_many, params).fetchall())
        return {r["id"]: _ts(r["available_at"]) for r in rows}

    def bury(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "error": error}
        return self._run(
            lambda cur: cur.execute(self.Q.message_bury, params).fetchone() is not None, conn)

    # --- looking ---------------------------------------------------------------------------

    def _all(self, query: str, params: dict[str, Any]) -> list[Row]:
        return [self._row(r) for r in self._run(lambda cur: cur.execute(query, params).fetchall())]

    def peek(self, topic: str, limit: int) -> list[Row]:
        return self._all(self.Q.message_peek, {"topic": topic, "limit": limit})

    def get(self, msg_id: int) -> Row | None:
        rows = self._all(self.Q.message_get, {"id": msg_id})
        return rows[0] if rows else None

    def topics(self) -> list[str]:
        return self._run(lambda cur: [r["topic"] for r in cur.execute(self.Q.message_topics)])

    def stats(self, topic: str | None) -> list[Row]:
        def run(cur: psycopg.Cursor[Any]) -> list[Row]:
            p = {"topic": topic}
            live = {r["topic"]: r for r in cur.execute(self.Q.message_stats, p).fetchall()}
            dead = {r["topic"]: r["dead"] for r in cur.execute(self.Q.dead_stats, p).fetchall()}
            done = {r["topic"]: r["done"] for r in cur.execute(self.Q.done_stats, p).fetchall()}
            return merge_stats(live, dead, done)
        return self._run(run, tx=True)

    def purge(self, topic: str) -> int:
        return self._run(lambda cur: cur.execute(self.Q.message_purge, {"topic": topic}).rowcount)

    # --- dead letters -----------------------------------------------------------------------

    def dead_list(self, topic: str, limit: int) -> list[Row]:
        return self._all(self.Q.dead_list, {"topic": topic, "limit": limit})

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, "ids": list(ids) if ids is not None else None}
        return self._run(lambda cur: len(cur.execute(self.Q.dead_requeue, params).fetchall()))

    def dead_purge(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, "ids": list(ids) if ids is not None else None}
        return self._run(lambda cur: cur.execute(self.Q.dead_purge, params).rowcount)

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_rows(self, group: GroupLease) -> list[Row]:
        return self._all(self.Q.lease_rows, group.params())

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        q = self.Q.lease_ack_retain if retain else self.Q.lease_ack
        return self._run(lambda cur: cur.execute(q, group.params()).rowcount)

    def lease_extend(self, group: GroupLease, extend_s: float) -> int:
        p = {**group.params(), "extend_s": float(extend_s)}
        return self._run(lambda cur: cur.execute(self.Q.lease_extend, p).rowcount)

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def stage(self, job: str, part: int, batch: Sequence[NewMessage] | PayloadBatch) -> int:
        """Unkeyed rows are copied straight into the message table under an open load part
        (invisible to every reader until publish flips the part); keyed rows go to the stage
        table, where publish arbitrates their keys against the live ones."""
        direct: dict[str, list[NewMessage] | PayloadBatch] = {}
        keyed: Sequence[NewMessage] = []
        if isinstance(batch, PayloadBatch) and batch.template.key is None:
            direct[batch.template.topic] = batch
        else:
            rows = as_rows(batch)
            keyed = [m for m in rows if m.key is not None]
            for m in rows:
                if m.key is None:
                    direct.setdefault(m.topic, []).append(m)  # type: ignore[union-attr]

        def run(cur: psycopg.Cursor[Any]) -> int:
            p = {"job": job}
            cur.execute(self.Q.stage_async_commit)
            cur.execute(self.Q.load_job_open, p)
            cur.execute(self.Q.load_job_reopen, p)
            if cur.execute(self.Q.load_job_share, p).fetchone()["state"] == "committed":
                return 0  # a replayed or late task of a finished load: it was published once
            if keyed:
                with cur.copy(self.Q.stage_copy) as copy:
                    for m in keyed:
                        copy.write_row((job, part, m.topic, m.key, m.kind, m.json_text, m.data,
                                        m.headers_json, m.priority, float(m.delay_s), m.at))
            for topic, msgs in direct.items():
                self._copy_direct(cur, job, part, topic, msgs)
            return len(batch)
        return self._run(run, tx=True)

    def _copy_direct(self, cur: psycopg.Cursor[Any], job: str, part: int, topic: str,
                     msgs: list[NewMessage] | PayloadBatch) -> None:
        load_part = cur.execute(self.Q.load_part_open, {"job": job, "part": part,
                                                        "topic": topic, "rows": len(msgs)}
                                ).fetchone()["id"]
        if isinstance(msgs, PayloadBatch):
            t = msgs.template
            if t.at is None and not t.delay_s:  # the bulk case: COPY text built per chunk
                with cur.copy(self.Q.message_copy) as copy:
                    for chunk in chunks(msgs.payloads, 5000):
                        copy.write(copy_text(load_part, t, chunk))
                return
            msgs = msgs.rows()
        due_now = [m for m in msgs if m.at is None and not m.delay_s]
        later = [m for m in msgs if m.at is not None or m.delay_s]
        if due_now:
            with cur.copy(self.Q.message_copy) as copy:  # COPY: the fastest way in
                for m in due_now:
                    copy.write_row((topic, m.kind, m.json_text, m.data, m.headers_json,
                                    m.priority, load_part))
        if later:
            # Delays count from the server's clock now, as a send's would.
            now = cur.execute(self.Q.clock_now).fetchone()["now"]
            with cur.copy(self.Q.message_copy_due) as copy:
                for m in later:
                    due = m.at if m.at is not None else now + timedelta(seconds=m.delay_s)
                    copy.write_row((topic, m.kind, m.json_text, m.data, m.headers_json,
                                    m.priority, load_part, due, due))

    def publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        query = self.Q.stage_publish_replace if on_duplicate == "replace" else self.Q.stage_publish

        def run(cur: psycopg.Cursor[Any]) -> int | None:
            state = cur.execute(self.Q.load_job_lock, {"job": job}).fetchone()["state"]
            if state == "committed":
                cur.execute(self.Q.stage_delete_job, {"job": job})
                return None
            p = {"job": job, "parts": list(parts)}
            if expected is not None:
                found = (cur.execute(self.Q.stage_count, p).fetchone()["n"]
                         + cur.execute(self.Q.load_part_rows, p).fetchone()["n"])
                if found != expected:
                    raise LoadIncomplete(job, expected, found)
            flipped = cur.execute(self.Q.load_part_publish, p).fetchall()
            cur.execute(self.Q.load_part_drop, p)
            n = cur.execute(query, p).rowcount + sum(r["rows"] for r in flipped)
            cur.execute(self.Q.stage_delete_job, {"job": job})
            cur.execute(self.Q.load_job_finish, {"job": job, "state": "committed", "rows": n})
            if flipped:  # the COPY woke nobody: tell idle workers now
                cur.execute(self.Q.load_notify, {
                    "channel": f"{self.schema}_wake", "topics": [r["topic"] for r in flipped],
                    "counts": [r["rows"] for r in flipped]})
            return n
        return self._run(run, tx=True)

    def discard(self, job: str) -> int:
        def run(cur: psycopg.Cursor[Any]) -> int:
            state = cur.execute(self.Q.load_job_lock, {"job": job}).fetchone()["state"]
            n = cur.execute(self.Q.load_part_drop, {"job": job}).rowcount
            n += cur.execute(self.Q.stage_delete_job, {"job": job}).rowcount
            if state != "committed":
                cur.execute(self.Q.load_job_finish, {"job": job, "state": "aborted", "rows": 0})
            return n
        return self._run(run, tx=True)

    def stage_cleanup(self, older_than_s: float) -> int:
        jobs = self._run(lambda cur: [r["job"] for r in cur.execute(
            self.Q.stage_stale_jobs, {"older_than_s": float(older_than_s)})])
        return sum(self.discard(job) for job in jobs)

    def job_state(self, job: str) -> str | None:
        found = self._run(lambda cur: cur.execute(self.Q.load_job_state, {"job": job}).fetchone())
        return found["state"] if found else None

    # --- history ------------------------------------------------------------------------------

    def history_bounds(self, source: str, topic: str | None) -> tuple[int, int] | None:
        q = getattr(self.Q, f"history_bounds_{source}")
        found = self._run(lambda cur: cur.execute(q, {"topic": topic}).fetchone())
        return None if found["lo"] is None else (found["lo"], found["hi"])

    def history_rows(self, source: str, topic: str | None, lo: int, hi: int,
                     before: datetime | None) -> list[Row]:
        q = getattr(self.Q, f"history_rows_{source}")
        return self._all(q, {"topic": topic, "lo": lo, "hi": hi, "before": before})

    def history_delete(self, source: str, ids: Sequence[int]) -> int:
        q = self.Q.history_delete_dead if source == "dead" else self.Q.history_delete_done
        return self._run(lambda cur: cur.execute(q, {"ids": list(ids)}).rowcount)
