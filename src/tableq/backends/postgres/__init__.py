"""The PostgreSQL dialect (psycopg 3): every PostgreSQL statement tableq runs lives in
queries.sql beside this file. Autocommit connections from a fork-aware pool, so a
single-statement operation (send, receive, ack) is one round trip; FOR UPDATE SKIP LOCKED
claims; LISTEN/NOTIFY wake-up hints."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg.pq import Format, TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import set_json_loads

from tableq.backends._keepalive import DEFAULT_S as KEEPALIVE_S
from tableq.backends._keepalive import KeepAlive
from tableq.backends._pool import Pool
from tableq.backends._queries import Migration, load_migrations, load_queries
from tableq.backends.base import (
    ClaimResult,
    ClaimSpec,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    UniqueViolation,
    as_rows,
    chunks,
    gather,
    load_json_text,
    retrying,
    size_facts,
)
from tableq.backends.postgres.errors import map_errors
from tableq.backends.postgres.floors import PLAIN, Floors, Horizon
from tableq.backends.postgres.vacuum import COUNTED_BELOW, Swept, Vacuumer, log
from tableq.backends.sql import Cursor, Params, SqlBackend
from tableq.errors import DatabaseError, DuplicateMessage, LoadIncomplete, UnsupportedDatabase
from tableq.names import ANY_TOPIC
from tableq.url import LIBPQ_PARAMS, DatabaseURL

T = TypeVar("T")
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of VACUUM (SKIP_LOCKED)'s warning when it skips
MIN_VERSION = 130000  # gen_random_uuid() is built in from 13 on
# Every "now" in queries.sql, and what a test clock reads instead (chosen once, at load).
CLOCK = ("statement_timestamp()", "(SELECT clock FROM {schema}.test_clock)")
# From this many unkeyed rows due now, send_many goes by COPY (ids taken first: one round trip
# more). At 1,000 rows COPY was 1.2x the unnest insert (A/B, three runs); at 100-300 the
# runs disagreed (0.66x-1.35x on a loaded machine), so smaller batches keep the insert.
COPY_MIN_ROWS = 500
COPY_CHUNK = 5000  # rows of COPY text built and written at a time
# What a claim from a floor adds to its rows for the next floor (floors.py; the first row's).
FLOOR_COLUMNS = ("nth", "first_at", "first_id", "hidden", "oldest_snapshot", "oldest_write",
                 "open_topics", "gen", "claimed_at")
# A listener that registered while a send that could not see it was in flight looks again
# after this long, then twice as long each time, up to SETTLE_MAX_S (a long outbox transaction
# is picked up within about that long of its commit).
SETTLE_FIRST_S = 0.005
SETTLE_MAX_S = 0.08


def _scalars(m: NewMessage) -> dict[str, Any]:
    return {"topic": m.topic, "key": m.key, "kind": m.kind, "payload": m.json_text,
            "data": m.data, "headers": m.headers_json, "priority": m.priority, "at": m.at,
            "delay_s": float(m.delay_s)}


def _due_unkeyed(m: NewMessage) -> bool:
    return m.key is None and m.at is None and not m.delay_s


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
    notifications are lost while disconnected, so workers keep polling as well.

    Sends notify only while a listener waits for their topic (0004_quiet_sends.sql): this one
    registers for `topics` (None: all) when made and whenever wait() follows pause(). A wait
    right after a registration answers ANY_TOPIC at once, so the caller looks for work again:
    sends that committed just before the registration could not see it."""

    wakeup = "notify"

    def __init__(self, backend: PostgresBackend, topics: Collection[str] | None = None) -> None:
        self._where, self._q = backend.where, backend.Q
        self._keys = {"schema": backend.schema,
                      "topics": sorted(set(topics)) if topics else [ANY_TOPIC]}
        self._registered = False
        self._settled = True  # no registration of ours has a send to wait for
        self._look_again = False
        self._settle_wait_s = SETTLE_FIRST_S
        with map_errors(self._where):
            self._conn = psycopg.connect(**backend.connect_kwargs, autocommit=True)
            try:
                self._conn.execute(backend.Q.listen)
                self._register(look_again=False)  # the caller's first look comes after this
            except BaseException:
                self._conn.close()
                raise

    def _register(self, *, look_again: bool = True) -> None:
        self._conn.execute(self._q.wake_register, self._keys)
        self._registered, self._settled = True, self._try_settle()
        self._look_again = look_again
        self._settle_wait_s = SETTLE_FIRST_S

    def _try_settle(self) -> bool:
        row = self._conn.execute(self._q.wake_settled, self._keys).fetchone()
        return bool(row and row[0])

    def pause(self) -> None:
        """Stops waiting (the caller is busy): sends stop notifying until the next wait()."""
        if self._registered:
            with map_errors(self._where):
                self._conn.execute(self._q.wake_unregister)
            self._registered = False

    def wait_counts(self, timeout_s: float) -> dict[str, int]:
        """Blocks up to timeout_s for the first notification, then takes whatever else has
        arrived; returns {topic: number of new due messages}. {ANY_TOPIC: 0}: look for work
        again (a registration just began, or a send it must not miss may have committed)."""
        found: dict[str, int] = {}
        with map_errors(self._where):
            if not self._registered:
                self._register()
            if not self._settled:
                # A send that looked before our registration is still in flight: check back
                # soon (backing off), looking for work each time.
                self._take(found, min(timeout_s, self._settle_wait_s), 1)
                self._settle_wait_s = min(SETTLE_MAX_S, self._settle_wait_s * 2)
                self._settled = self._try_settle()
                self._look_again = True
            if self._look_again:
                self._look_again = False
                found.setdefault(ANY_TOPIC, 0)
                self._take(found, 0.0, None)
                return found
            self._take(found, timeout_s, 1)
            if found:
                self._take(found, 0.0, None)
        return found

    def _take(self, found: dict[str, int], timeout_s: float, stop: int | None) -> None:
        for note in self._conn.notifies(timeout=timeout_s, stop_after=stop):
            data = json.loads(note.payload)
            found[data["topic"]] = found.get(data["topic"], 0) + int(data["n"])

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


def _copy_payload(text: str | None, data: bytes | None) -> str:
    """The payload and payload_bytes columns in COPY's text format (one of them is NULL)."""
    return _copy_field(text) + "\t\\N" if data is None else "\\N\t\\\\x" + data.hex()


def copy_sent_text(ids: Sequence[int], rows: Sequence[NewMessage]) -> str:
    """message_copy_sent rows, as one block of COPY text (see copy_text)."""
    field = _copy_field
    return "".join([f"{i}\t{field(m.topic)}\t{field(m.kind)}\t{_copy_payload(m.json_text, m.data)}"
                    f"\t{field(m.headers_json)}\t{m.priority}\n"
                    for i, m in zip(ids, rows, strict=True)])


def copy_text(load_part: int, t: NewMessage,
              payloads: Sequence[tuple[str | None, bytes | None]]) -> str:
    """message_copy rows for payloads sharing the template t, as one block of COPY text:
    psycopg's write_row per row cost as much client time as encoding the payloads."""
    head = f"{_copy_field(t.topic)}\t{_copy_field(t.kind)}\t"
    tail = f"\t{_copy_field(t.headers_json)}\t{t.priority}\t{load_part}\n"
    texts = [text for text, data in payloads if text is not None and data is None]
    if len(texts) == len(payloads) and texts:
        # JSON texts only (a bulk load's common case): escaped and framed as one block. NUL
        # separates them meanwhile: JSON text holds none (a control character is escaped).
        block = "\0".join(texts)
        if block.count("\0") == len(texts) - 1:
            block = _copy_field(block).replace("\0", "\t\\N" + tail + head)
            return head + block + "\t\\N" + tail
    return "".join([head + _copy_payload(text, data) + tail for text, data in payloads])


JSON_OIDS = (114, 3802)  # json, jsonb


def _loads_json_as_tableq(conn: psycopg.Connection[Any]) -> bool:
    """Whether conn reads json and jsonb with tableq's loader (psycopg makes one loader class
    per loads function, so it is an identity check, about 1 us)."""
    return all(conn.adapters.get_loader(oid, fmt) is _TABLEQ_JSON_LOADERS.get((oid, fmt))
               for oid in JSON_OIDS for fmt in (Format.TEXT, Format.BINARY))


def _tableq_json_loaders() -> dict[tuple[int, Format], Any]:
    adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)
    set_json_loads(load_json_text, adapters)
    return {(oid, fmt): adapters.get_loader(oid, fmt)
            for oid in JSON_OIDS for fmt in (Format.TEXT, Format.BINARY)}


_TABLEQ_JSON_LOADERS = _tableq_json_loaders()


class PostgresBackend(SqlBackend):
    dialect = "postgres"
    connection_type: ClassVar[type] = psycopg.Connection
    connection_name: ClassVar[str] = "psycopg 3 Connection"

    def __init__(self, url: DatabaseURL, *, pool_size: int = 32, connect_timeout_s: float = 10,
                 application_name: str = "tableq",
                 transaction_idle_timeout_s: float = 300.0,
                 tcp_keepalive_s: float = KEEPALIVE_S, test_clock: bool = False,
                 vacuum: bool = True) -> None:
        self.url, self.where = url, url.redacted
        self.schema = url.namespace
        quoted = f'"{self.schema}"'
        self.test_clock = bool(test_clock)
        self.channel = f"{self.schema}_wake"
        self.Q = load_queries(__package__, "{schema}", quoted,
                              clock=CLOCK if self.test_clock else None,
                              names={"{channel}": f'"{self.channel}"'})
        self._migrations = load_migrations(__package__, "{schema}", quoted,
                                           names={"{schema_name}": f"'{self.schema}'"})
        self.connect_kwargs: dict[str, Any] = {
            "host": url.host, "port": url.port or 5432, "dbname": url.database,
            "user": url.user, "password": url.password,
            "connect_timeout": url.connect_timeout(connect_timeout_s),
            "application_name": url.params.get("application_name", application_name),
        }
        keepalive = KeepAlive.within(tcp_keepalive_s)
        if keepalive is not None:
            self.connect_kwargs.update(keepalive.libpq())
        for name in LIBPQ_PARAMS:
            if name in url.params:  # libpq's own, passed through
                self.connect_kwargs[name] = url.params[name]
        self.transaction_idle_ms = str(0 if not transaction_idle_timeout_s  # 0: no limit
                                       else max(1, round(transaction_idle_timeout_s * 1000)))
        self._checked = False
        self.pool = Pool(self._connect, lambda c: c.close(), max_idle=pool_size,
                         socket_of=lambda c: c.fileno())
        # A test clock's frozen "now" would let rows due "now" sort before a floor.
        self.floors = Floors(enabled=not self.test_clock)
        self.vacuumer = (Vacuumer(self._vacuum, self.where, held=lambda: self.floors.held)
                         if vacuum else None)

    # --- connections and transactions -----------------------------------------------------

    def close(self) -> None:
        if self.vacuumer is not None:
            self.vacuumer.close()
        super().close()

    def _churned(self, n: int) -> None:
        if self.vacuumer is not None:
            self.vacuumer.churned(n)

    def _vacuum(self) -> Swept | None:
        """VACUUM (SKIP_LOCKED) of the message table, then what it left; skipped when another
        holds the table; None when this role may not vacuum it (PostgreSQL skips both with a
        warning, not an error)."""
        refused: list[str] = []
        locked: list[bool] = []

        def notice(diag: psycopg.errors.Diagnostic) -> None:
            # Autovacuum's VACUUM or ANALYZE, or another process's vacuum, holds the table:
            # SKIP_LOCKED skips it with a warning too (lock_not_available).
            if diag.severity_nonlocalized != "WARNING":
                return
            if diag.sqlstate == LOCK_NOT_AVAILABLE:
                locked.append(True)
            else:
                refused.append(diag.message_primary or "")
        with self.pool.connection(own=True) as c, self.map_errors():
            c.add_notice_handler(notice)
            try:
                c.execute(self.Q.message_vacuum)
            finally:
                c.remove_notice_handler(notice)
            if refused:
                log.warning("tableq: cannot vacuum %s.message (%s); autovacuum alone keeps it "
                            "small, which a busy queue outgrows: let this role own the schema, "
                            "or pass vacuum=False to connect() to stop trying", self.schema,
                            refused[0])
                return None
            if locked:
                return Swept(0.0, 0.0, skipped=True)
            row = c.execute(self.Q.message_swept, {"counted": COUNTED_BELOW}).fetchone()
            return Swept(float(row[0]), float(row[1])) if row else Swept(0.0, 0.0)

    def map_errors(self) -> AbstractContextManager[None]:
        return map_errors(self.where)

    def _connect(self) -> psycopg.Connection[Any]:
        with self.map_errors():
            conn = psycopg.connect(**self.connect_kwargs, autocommit=True)
            set_json_loads(load_json_text, conn)  # the one JSON text loader
            conn.execute(self.Q.session_time_zone)
            conn.execute(self.Q.session_plans)
            conn.execute(self.Q.idle_transaction_limit, {"ms": self.transaction_idle_ms})
            if not self._checked:
                version = conn.execute(self.Q.server_version).fetchone()[0]  # type: ignore[index]
                if version < MIN_VERSION:
                    conn.close()
                    raise UnsupportedDatabase("PostgreSQL", str(version), "PostgreSQL 13 or newer")
                self._checked = True
            return conn

    def _attempt(self, fn: Callable[[Cursor], T], *, tx: bool, write: bool) -> T:
        with self.pool.connection(own=True) as c, self.map_errors():
            if tx:
                with c.transaction(), c.cursor(row_factory=dict_row) as cur:
                    return fn(cur)
            with c.cursor(row_factory=dict_row) as cur:
                return fn(cur)

    def _cursor(self, conn: Any) -> AbstractContextManager[Cursor]:
        cur: AbstractContextManager[Cursor] = conn.cursor(row_factory=dict_row)
        return cur

    def _all(self, cur: Cursor, query: str, params: Params | None = None) -> list[Row]:
        rows: list[Row] = cur.execute(query, params).fetchall()
        return rows

    def _id_set(self, cur: Cursor, query: str, params: Params) -> set[int]:
        """The ids a statement returns (its `id` column, the first), without a dict per row:
        an ack of a thousand returns a thousand."""
        cur.row_factory = tuple_row
        try:
            return {r[0] for r in cur.execute(query, params)}
        finally:
            cur.row_factory = dict_row

    def _one(self, cur: Cursor, query: str, params: Params | None = None) -> Row | None:
        row: Row | None = cur.execute(query, params).fetchone()
        return row

    def _exec(self, cur: Cursor, query: str, params: Params | None = None) -> int:
        return int(cur.execute(query, params).rowcount)

    # --- values -------------------------------------------------------------------------------

    def _to_time(self, value: Any) -> datetime:
        # Library sessions run in UTC (session_time_zone); a caller's connection may not.
        at: datetime = value if value.tzinfo is UTC else value.astimezone(UTC)
        return at

    def _db_time(self, value: datetime | None) -> Any:
        return value  # psycopg sends aware datetimes as timestamptz

    def _loads(self, value: Any) -> Any:
        return value  # psycopg already decoded jsonb

    def _ids(self, ids: Sequence[int]) -> Any:
        return list(ids)

    def _refs(self, refs: Sequence[tuple[int, str]]) -> Params:
        return {"ids": [i for i, _ in refs], "leases": [lease for _, lease in refs]}

    def _charges(self, charges: Sequence[tuple[int, str, int]]) -> Params:
        return {"ids": [c[0] for c in charges], "leases": [c[1] for c in charges],
                "attempts": [c[2] for c in charges]}

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self.pool.connection() as conn:
            with self.map_errors():
                tx = conn.transaction()
                tx.__enter__()  # its idle limit is the session's (idle_transaction_limit)
            try:
                yield conn
            except BaseException as exc:
                self._restore(conn)
                if conn.info.transaction_status == TransactionStatus.ACTIVE:
                    # A statement in flight (interrupted mid-read): cancelled, so the server
                    # does not run it on with the block's locks, then closed, which rolls back.
                    with suppress(Exception):
                        conn.cancel_safe(timeout=float(self.connect_kwargs["connect_timeout"]))
                    conn.close()
                else:
                    with self.map_errors():
                        tx.__exit__(type(exc), exc, exc.__traceback__)  # rolls back
                    if conn.info.transaction_status != TransactionStatus.IDLE:
                        conn.close()  # the rollback failed: never pooled inside a transaction
                if conn.broken:
                    # The caller's own statement met a dead connection: say so as tableq does
                    # everywhere else (DatabaseUnavailable; nothing was committed).
                    with self.map_errors():
                        raise
                raise
            self._restore(conn)
            with self.map_errors():
                if conn.info.transaction_status == TransactionStatus.INERROR:
                    tx.__exit__(None, None, None)  # rolls back: PostgreSQL would not commit
                    raise DatabaseError(
                        "a statement inside queue.transaction() failed, so PostgreSQL rolled "
                        "the whole transaction back and nothing was committed; let the error "
                        "propagate out of the block (or use a savepoint) and retry")
                tx.__exit__(None, None, None)

    def _restore(self, conn: psycopg.Connection[Any]) -> None:
        # Attributes only, no round trip, so before the rollback or commit too. The caller's
        # session SETs are the caller's to undo (docs/worker.md).
        conn.row_factory, conn.cursor_factory = tuple_row, psycopg.Cursor
        if not _loads_json_as_tableq(conn):  # the caller's set_json_loads(...) on it
            set_json_loads(load_json_text, conn)

    def listener(self, topics: Collection[str] | None = None) -> PostgresListener:
        return PostgresListener(self, topics)

    # --- migrations -----------------------------------------------------------------------

    def _locked(self, fn: Callable[[Cursor], T]) -> T:
        def run(cur: Cursor) -> T:
            # DDL is transactional here; the advisory lock makes migrators take turns.
            cur.execute(self.Q.migration_lock, {"schema": self.schema})
            cur.execute(self.Q.schema_create)
            cur.execute(self.Q.migration_create)
            return fn(cur)
        return self.run(run, tx=True)

    def _migration_files(self) -> list[Migration]:
        return self._migrations

    # --- sending --------------------------------------------------------------------------

    def message_insert(self, rows: Sequence[NewMessage] | PayloadBatch, on_duplicate: str,
               conn: Any = None) -> list[tuple[int, str]]:
        rows = as_rows(rows)
        if len(rows) == 1 and _due_unkeyed(rows[0]):
            return [(self._insert_due(rows[0], conn), "sent")]
        if (len(rows) >= COPY_MIN_ROWS and not self.test_clock
                and all(map(_due_unkeyed, rows))):
            return self._copy_sent(rows, conn)
        query = {"ignore": self.Q.message_insert_ignore, "replace": self.Q.message_insert_replace,
                 "error": self.Q.message_insert}[on_duplicate]
        one = {"ignore": self.Q.message_insert_one_ignore,
               "replace": self.Q.message_insert_one_replace,
               "error": self.Q.message_insert_one}[on_duplicate]

        def run(cur: psycopg.Cursor[Any]) -> list[tuple[int, str]]:
            results: dict[int, tuple[int, str]] = {}
            pending = list(range(len(rows)))
            for _ in range(5):  # a duplicate that vanished before we could read it: insert again
                batch = [rows[i] for i in pending]
                try:
                    with self.map_errors(), self._send_savepoint(cur, conn, on_duplicate):
                        params = _scalars(batch[0]) if len(batch) == 1 else _arrays(batch)
                        got = cur.execute(one if len(batch) == 1 else query, params).fetchall()
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
        return self.run(run, conn)

    @contextmanager
    def _send_savepoint(self, cur: psycopg.Cursor[Any], conn: Any, on_duplicate: str
                   ) -> Iterator[None]:
        """In the caller's transaction a failed statement would abort all of it, so a send
        that may conflict runs in a savepoint and the transaction stays usable."""
        own_statement = conn is None or (
            conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE)
        if own_statement or on_duplicate != "error":
            yield
            return
        with self._savepoint(cur):  # psycopg opens the caller's transaction if needed
            yield

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

    def _claim_params(self, plain: str, filtered: str, spec: ClaimSpec) -> tuple[str, Params]:
        sql, params = self._receive(plain, filtered, spec.where)
        params.update(topic=spec.topic, max=spec.max, max_attempts=spec.max_attempts,
                      lease=spec.lease, vt=float(spec.visibility_timeout_s), charge=spec.charge,
                      charge_last=spec.charge_last)
        return sql, params

    def message_claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        # A filtered or partly charged claim has no ids-only twin: it returns whole rows, of
        # which the ids are kept. message_claim_ids leases under the caller's token only.
        lean = spec.ids_only and spec.charge is None and spec.lease is not None
        # From a floor only unfiltered claims in a statement of their own: a caller's
        # transaction may see an older snapshot than its statement (floors.py).
        plan = self.floors.plan(spec.topic) if spec.where is None and conn is None else PLAIN
        if plan.check:
            self.floors.checked(self._horizon())
            plan = self.floors.plan(spec.topic) if self.floors.on(spec.topic) else PLAIN
        if plan.floor is None:
            plain = self.Q.message_claim_ids if lean else self.Q.message_claim
        else:
            plain = self.Q.message_claim_ids_floor if lean else self.Q.message_claim_floor
        sql, params = self._claim_params(plain, self.Q.message_claim_where, spec)
        params.update(plan.params())
        raw = self.run(lambda cur: self._all(cur, sql, params), conn)
        dead_lettered = int(raw[0]["dead_lettered"]) if raw else 0
        leased = [r for r in raw if r["id"] is not None]
        if plan.floor is not None and raw:
            self.floors.learn(spec.topic, plan, raw[0], leased[0]["priority"] if leased else None)
        self._churned(len(leased) + dead_lettered)
        if spec.ids_only:
            return ClaimResult([{"id": r["id"]} for r in leased], dead_lettered)
        if plan.floor is not None:
            for r in leased:
                for name in FLOOR_COLUMNS:
                    del r[name]
        return ClaimResult([self._row(r, owned=True) for r in leased], dead_lettered)

    def _horizon(self) -> Horizon:
        row = self._read_one(self.Q.horizon)
        assert row is not None
        return Horizon(bool(row["hidden"]), row["oldest_snapshot"], row["oldest_write"],
                       row["claimed_at"], frozenset(row["open_topics"]))

    def message_take(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        sql, params = self._claim_params(self.Q.message_take, self.Q.message_take_where, spec)
        raw = self.run(lambda cur: self._all(cur, sql, params), conn)
        self._churned(len(raw))
        rows = sorted((self._row(r) for r in raw),
                      key=lambda r: (-r["priority"], r["available_at"], r["id"]))
        for r in rows:  # it counts as received once
            r["attempts"] += 1
        return ClaimResult(rows, 0)

    def message_ack(self, refs: Sequence[tuple[int, str]], retain: bool,
                    conn: Any = None) -> set[int]:
        query = self.Q.message_ack_retain if retain else self.Q.message_ack
        acked = self.run(lambda cur: self._id_set(cur, query, self._refs(refs)), conn)
        self._churned(len(acked))
        return acked

    def message_dead_letter(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "error": error}
        return self.run(lambda cur: self._one(cur, self.Q.message_dead_letter, params) is not None,
                        conn)

    # --- dead letters -----------------------------------------------------------------------

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, **self._some_ids(ids)}
        return self.run(lambda cur: len(self._all(cur, self.Q.dead_requeue, params)))

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        acked = self._change(self.Q.lease_ack_retain if retain else self.Q.lease_ack,
                             group.params())
        self._churned(acked)
        return acked

    def lease_read(self, group: GroupLease) -> dict[str, list[Any]]:
        # Tuples in binary format, transposed at once: a 50,000-row batch came 50 ms sooner
        # than as dicts in text. Sessions run in UTC, so times are aware UTC datetimes.
        def run(cur: psycopg.Cursor[Any]) -> dict[str, list[Any]]:
            with cur.connection.cursor(row_factory=tuple_row, binary=True) as c:
                rows = c.execute(self.Q.lease_read, group.params()).fetchall()
                names = [d.name for d in c.description or ()]
            if not rows:
                return {}
            return dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))
        return self.run(run, write=False)

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def stage_write(self, job: str, part: int, batch: Sequence[NewMessage] | PayloadBatch) -> int:
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
            if self._value(cur, self.Q.load_job_share, p, "state") == "committed":
                return 0  # a replayed or late task of a finished load: it was published once
            if keyed:
                with cur.copy(self.Q.stage_copy) as copy:
                    for m in keyed:
                        copy.write_row((job, part, m.topic, m.key, m.kind, m.json_text, m.data,
                                        m.headers_json, m.priority, float(m.delay_s), m.at))
            for topic, msgs in direct.items():
                self._copy_direct(cur, job, part, topic, msgs)
            return len(batch)
        return self.run(run, tx=True)

    def _copy_direct(self, cur: psycopg.Cursor[Any], job: str, part: int, topic: str,
                     msgs: list[NewMessage] | PayloadBatch) -> None:
        load_part = self._value(cur, self.Q.load_part_open, {
            "job": job, "part": part, "topic": topic, "rows": len(msgs)}, "id")
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
            # Delays count from the server's clock now, as a send's would; a time in the past
            # is due now (first_available_at keeps it), as a send's is.
            now = self._value(cur, self.Q.clock_now, None, "now")
            with cur.copy(self.Q.message_copy_due) as copy:
                for m in later:
                    due = m.at if m.at is not None else now + timedelta(seconds=m.delay_s)
                    copy.write_row((topic, m.kind, m.json_text, m.data, m.headers_json,
                                    m.priority, load_part, max(due, now), due))

    def _insert_due(self, m: NewMessage, conn: Any) -> int:
        """The commonest send, one unkeyed message due now: one statement that cannot
        conflict, so no savepoint, duplicate handling or batch bookkeeping around it. Without
        a caller's connection it runs on a tuple-row cursor of its own, not through run()'s
        dict-row cursor: about 9 us less client CPU a send (2026-11-29, alternating rounds
        on the shared server)."""
        params = _scalars(m)  # message_insert_due reads the ones it needs
        if conn is not None:
            return int(self.run(lambda cur: self._value(cur, self.Q.message_insert_due,
                                                        params, "id"), conn))

        def once() -> int:
            with (self.pool.connection(own=True) as c, self.map_errors(),
                  c.cursor(row_factory=tuple_row) as cur):
                row = cur.execute(self.Q.message_insert_due, params).fetchone()
            if row is None:
                raise AssertionError("a send's INSERT ... RETURNING returned no row")
            return int(row[0])
        return retrying(once, attempts=self.retry_attempts)

    def _copy_sent(self, rows: Sequence[NewMessage], conn: Any) -> list[tuple[int, str]]:
        """An unkeyed batch due now, by COPY: nothing can conflict, so every row is "sent";
        the ids are taken first, in ascending order, so the batch keeps its order."""
        def run(cur: psycopg.Cursor[Any]) -> list[tuple[int, str]]:
            ids = sorted(self._value(cur, self.Q.message_ids_take, {"n": len(rows)}, "ids"))
            # The first rows are ready before COPY starts: they take its start as their due
            # time, and claim floors allow a statement only WRITE_MARGIN_S before its first row.
            text = copy_sent_text(ids[:COPY_CHUNK], rows[:COPY_CHUNK])
            with cur.copy(self.Q.message_copy_sent) as copy:
                copy.write(text)
                for start in range(COPY_CHUNK, len(rows), COPY_CHUNK):
                    copy.write(copy_sent_text(ids[start:start + COPY_CHUNK],
                                              rows[start:start + COPY_CHUNK]))
            topics = Counter(m.topic for m in rows)
            cur.execute(self.Q.wake_topics, {"topics": list(topics),
                                             "counts": list(topics.values())})
            return [(i, "sent") for i in ids]
        # No transaction of its own: COPY is one statement, and ids it does not use are gaps.
        # Its wake-up then runs after its commit, which needs no send lock: a listener that
        # registered before the wake-up looks is told, one that registers later finds the rows.
        return self.run(run, conn)

    def stage_publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        query = self.Q.stage_publish_replace if on_duplicate == "replace" else self.Q.stage_publish

        def run(cur: psycopg.Cursor[Any]) -> int | None:
            state = self._value(cur, self.Q.load_job_lock, {"job": job}, "state")
            if state == "committed":
                cur.execute(self.Q.stage_delete_job, {"job": job})
                return None
            p = {"job": job, "parts": list(parts)}
            if expected is not None:
                found = (self._value(cur, self.Q.stage_count, p, "n")
                         + self._value(cur, self.Q.load_part_rows, p, "n"))
                if found != expected:
                    raise LoadIncomplete(job, expected, found)
            keyed: int = self._value(cur, query, p, "n")
            cur.execute(self.Q.stage_delete_job, {"job": job})
            # Late in the transaction: publishing locks the topics' counts of publishes
            # (0008_open_load_floors.sql), and other publishes to them wait until this commits.
            flipped = cur.execute(self.Q.load_part_publish, p).fetchall()
            cur.execute(self.Q.load_part_drop, p)
            n: int = keyed + sum(r["rows"] for r in flipped)
            cur.execute(self.Q.load_job_finish, {"job": job, "state": "committed", "rows": n})
            if flipped:  # the COPY woke nobody: tell idle workers now
                cur.execute(self.Q.load_notify, {
                    "channel": self.channel, "topics": [r["topic"] for r in flipped],
                    "counts": [r["rows"] for r in flipped]})
            return n
        return self.run(run, tx=True)

    def _job_lock(self, cur: Cursor, job: str) -> str:
        return str(self._value(cur, self.Q.load_job_lock, {"job": job}, "state"))

    def _discard_rows(self, cur: Cursor, job: str) -> int:
        n = self._exec(cur, self.Q.load_part_drop, {"job": job})
        return n + self._exec(cur, self.Q.stage_delete_job, {"job": job})

    # --- health (tableq doctor) ---------------------------------------------------------------

    def health_facts(self) -> dict[str, Any]:
        def one(query: str, params: Params | None = None) -> Row:
            return dict(self._read_one(query, params) or {})

        def many(query: str, params: Params | None = None) -> list[Row]:
            return [dict(r) for r in self._read_all(query, params)]

        return gather({
            "durability": lambda: one(self.Q.doctor_durability),
            "transactions": lambda: {
                "oldest": many(self.Q.doctor_old_transactions),
                "sees_all_sessions": bool(one(self.Q.doctor_sees_all_sessions)["sees_all"]),
                "prepared": one(self.Q.doctor_prepared_transactions),
                "slots": many(self.Q.doctor_replication_slots),
            },
            "cleanup": lambda: {"tables": many(self.Q.doctor_dead_rows, {"schema": self.schema})},
            "size": lambda: size_facts(f"{self.schema}.message",
                                       self._read_one(self.Q.doctor_size, {"schema": self.schema})),
            "schema": self._schema_facts,
        })
