"""The one SQL backend: running statements, retries, transactions, row shaping, and every
operation that is "run a named query and reshape its rows", written once for every dialect.

A dialect (postgres/, mysql/, sqlite/) subclasses SqlBackend and supplies only what differs:
its driver, pool and map_errors, how a cursor runs one statement (_all, _one, _exec), how
values cross (times in and out, durations, id and (id, lease) lists), its named queries, and
the few operations whose algorithm really differs on that database. The statements
themselves live in the dialect's queries.sql; this module holds no SQL."""

from __future__ import annotations

import json
import weakref
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from tableq.backends._pool import Pool, interrupted
from tableq.backends._queries import Migration, Queries, apply_pending
from tableq.backends.base import (
    RETRY_ATTEMPTS,
    Backend,
    Charged,
    ClaimResult,
    ClaimSpec,
    Filter,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    applied_versions,
    as_rows,
    chunks,
    dead_row_values,
    filter_params,
    idempotency_record,
    load_json_text,
    merge_stats,
    retrying,
    shape_row,
    token_record,
)
from tableq.errors import DatabaseError, DuplicateMessage, InvalidArgument, LoadIncomplete
from tableq.message import PRIORITY_MAX, PRIORITY_MIN
from tableq.stats import (
    EXACT_SPAN,
    EXACT_TOPIC,
    MIN_WINDOWS,
    SAMPLE_IDS,
    SAMPLE_WINDOWS,
    id_sample,
    needs_exact,
    scaled,
    topic_estimate,
)
from tableq.tokens import IdempotencyRecord, NewToken, TokenRecord

T = TypeVar("T")
R = TypeVar("R", tuple[int, str], tuple[int, str, int])
Cursor = Any  # the dialect's cursor (or, for sqlite3, its connection)
Params = dict[str, Any]

# Columns some dialects' claim or look-up queries add for their own use; never in a row.
_HELPER_COLUMNS = ("due_priority", "due_at", "dead_lettered", "db_now")
# The time columns lease_read returns.
_LEASE_TIMES = ("created_at", "available_at", "first_available_at", "received_at")


def _plain(row: Row | None) -> dict[str, Any]:
    """A row of text, whatever the caller's connection decodes to (PyMySQL's
    use_unicode=False and sqlite3's text_factory give bytes)."""
    return {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            for k, v in (row or {}).items()}


class SqlBackend(Backend):
    """A Backend over one SQL database. `run(fn)` is the only way statements reach the
    database: fn gets a cursor, and runs inside the caller's transaction (conn=...), or in a
    fresh pooled connection retried on transient conflicts."""

    Q: Queries
    # When stats() estimates instead of counting (tableq.stats); tests make them small.
    stats_exact_span = EXACT_SPAN
    stats_sample_ids = SAMPLE_IDS
    stats_sample_windows = SAMPLE_WINDOWS
    stats_exact_topic = EXACT_TOPIC
    stats_min_windows = MIN_WINDOWS
    pool: Pool
    test_clock: bool = False
    # How many times a short transaction is tried on a transient conflict.
    retry_attempts: ClassVar[int] = RETRY_ATTEMPTS
    # The database runs in this process (SQLite): no reply can be left unread on the wire, so
    # an interrupted transaction() is rolled back, not left to closing the connection.
    in_process: ClassVar[bool] = False
    # (id, lease) pairs per statement for charge / extend_many; None: all in one.
    refs_per_statement: ClassVar[int | None] = None
    # The driver's connection class and its name in messages (check_connection).
    connection_type: ClassVar[type]
    connection_name: ClassVar[str]
    # --- what a dialect supplies --------------------------------------------------------------

    @abstractmethod
    def map_errors(self) -> AbstractContextManager[None]:
        """The dialect's one error boundary: driver exceptions -> tableq errors."""

    @abstractmethod
    def _attempt(self, fn: Callable[[Cursor], T], *, tx: bool, write: bool) -> T:
        """One try of fn on a pooled connection: in a transaction when tx (or, where the
        database needs it, when write), else statement by statement."""

    @abstractmethod
    def _cursor(self, conn: Any) -> AbstractContextManager[Cursor]:
        """A cursor on a connection the caller owns (its transaction)."""

    @abstractmethod
    def _all(self, cur: Cursor, query: str, params: Params | None = None) -> list[Row]: ...
    @abstractmethod
    def _one(self, cur: Cursor, query: str, params: Params | None = None) -> Row | None: ...
    @abstractmethod
    def _exec(self, cur: Cursor, query: str, params: Params | None = None) -> int:
        """Runs a statement; returns the rows it changed."""

    @abstractmethod
    def _to_time(self, value: Any) -> datetime:
        """A time read from the database as an aware UTC datetime."""

    @abstractmethod
    def _db_time(self, value: datetime | None) -> Any:
        """An aware datetime (or None) as this database's time parameter."""

    def _span(self, name: str, seconds: float | None) -> Params:
        """A duration parameter `name` in this dialect's unit (seconds unless overridden)."""
        return {f"{name}_s": None if seconds is None else float(seconds)}

    def _loads(self, value: Any) -> Any:
        """A JSON column's value as Python (drivers that decode JSON override this)."""
        return load_json_text(value)

    @abstractmethod
    def _ids(self, ids: Sequence[int]) -> Any:
        """A list of ids as one parameter."""

    def _some_ids(self, ids: Sequence[int] | None) -> Params:
        """{"ids": ...} for "these ids, or all (None)" filters."""
        return {"ids": None if ids is None else self._ids(ids)}

    @abstractmethod
    def _refs(self, refs: Sequence[tuple[int, str]]) -> Params:
        """(id, lease) pairs as parameters."""

    @abstractmethod
    def _charges(self, charges: Sequence[tuple[int, str, int]]) -> Params:
        """(id, lease, attempts) triples as parameters (message_charge)."""

    @abstractmethod
    def _locked(self, fn: Callable[[Cursor], T]) -> T:
        """Runs fn holding the migration lock, with the migration ledger in place."""

    @abstractmethod
    def _migration_files(self) -> list[Migration]:
        """The migrations this code ships, ready to run on this server."""

    # --- running statements -------------------------------------------------------------------

    def run(self, fn: Callable[[Cursor], T], conn: Any = None, *, tx: bool = False,
            write: bool = True) -> T:
        """fn(cursor) in the caller's transaction (no BEGIN, no COMMIT, no retry), or in its
        own short one, retried on transient conflicts. tx: several statements that must
        commit together; write=False: it only reads, or it is one statement that commits on
        its own (no write lock taken up front where that matters: SQLite's BEGIN IMMEDIATE)."""
        if conn is not None:
            with self.map_errors(), self._cursor(conn) as cur:
                return fn(cur)
        return retrying(lambda: self._attempt(fn, tx=tx, write=write),
                        attempts=self.retry_attempts)

    def _run(self, fn: Callable[[Cursor], T], conn: Any = None, *, tx: bool = False) -> T:
        """run(): the name tests and older callers use."""
        return self.run(fn, conn, tx=tx)

    def _value(self, cur: Cursor, query: str, params: Params | None, column: str) -> Any:
        """One column of the one row a statement returns (it must return one)."""
        found = self._one(cur, query, params)
        if found is None:
            raise AssertionError(f"a query that returns one row returned none ({column})")
        return found[column]

    def _read_all(self, query: str, params: Params | None = None) -> list[Row]:
        return self.run(lambda cur: self._all(cur, query, params), write=False)

    def _read_one(self, query: str, params: Params | None = None) -> Row | None:
        return self.run(lambda cur: self._one(cur, query, params), write=False)

    def _change(self, query: str, params: Params | None = None, conn: Any = None) -> int:
        return self.run(lambda cur: self._exec(cur, query, params), conn)

    def _shaped(self, query: str, params: Params) -> list[Row]:
        return [self._row(r) for r in self._read_all(query, params)]

    def _row(self, raw: Any, owned: bool = False) -> Row:
        row = shape_row(raw, self._to_time, self._loads, owned)
        for name in _HELPER_COLUMNS:
            row.pop(name, None)
        return row  # a claimed row keeps "charged" (ClaimSpec.charge)

    def _receive(self, plain: str, filtered: str, where: Filter | None) -> tuple[str, Params]:
        """A receiving statement: `plain` when unfiltered (no filter predicates at all, so the
        common claim stays as fast as it can be), else its *_where twin, whose filter is fixed
        text over the filter's bound parameters (filter_params)."""
        return (plain, {}) if where is None else (filtered, filter_params(where))

    # --- lifecycle ----------------------------------------------------------------------------

    def _churned(self, n: int) -> None:
        """Hears that n row versions of the message table were just made dead (claims,
        charges, heartbeats, acks): PostgreSQL paces its own vacuum by them."""

    def close(self) -> None:
        self.pool.close()

    def check_connection(self, conn: Any) -> None:
        if not isinstance(conn, self.connection_type):
            raise InvalidArgument(
                f"connection= must be an open {self.connection_name}, not {type(conn).__name__}")
        # Each connection is checked once (its database cannot change, but for MariaDB's
        # select_db() or USE, which the driver does not show: see queries.sql); a plain
        # sqlite3.Connection takes no weak reference and is checked on every call.
        checked = self.__dict__.setdefault("_checked_connections", weakref.WeakSet())
        with suppress(TypeError):
            if conn in checked:
                return
        theirs = _plain(self.run(lambda cur: self._one(cur, self.Q.connection_database), conn))
        if not self._same_database(theirs):
            shown = ", ".join(f"{k} {v!r}" for k, v in theirs.items())
            raise InvalidArgument(
                f"connection= is connected to another database ({shown}) than this queue's "
                f"({self.where}): what is written on it would not reach this queue; pass a "
                "connection to the queue's own database (the outbox and exactly-once acks "
                "need your writes and tableq's in one database). Nothing was changed")
        with suppress(TypeError):
            checked.add(conn)

    def _own_database(self, fresh: bool = False) -> dict[str, Any]:
        """The dialect's connection_database row as this queue's pool sees it (read again when
        fresh, say after a server restart)."""
        own = self.__dict__.get("_own_database_row")
        if own is None or fresh:
            own = self.__dict__["_own_database_row"] = _plain(
                self._read_one(self.Q.connection_database))
        return own

    def _same_database(self, theirs: dict[str, Any]) -> bool:
        """Whether a caller's connection reaches the database this queue's pool reaches."""
        return theirs == self._own_database() or theirs == self._own_database(fresh=True)

    def now(self) -> datetime:
        return self._to_time(self.run(lambda cur: self._value(cur, self.Q.clock_now, None, "now"),
                                      write=False))

    def advance_clock(self, seconds: float) -> None:
        if not self.test_clock:
            super().advance_clock(seconds)
        self._change(self.Q.test_clock_advance, self._span("by", seconds))

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.pool.connection() as conn:
            retrying(lambda: self._guarded(self._begin, conn), attempts=self.retry_attempts)
            try:
                yield conn
            except BaseException as exc:
                # An interrupt may have come mid-statement: over a network a rollback would
                # read (or wait for) that statement's reply as its own, so the pool closes the
                # connection, which rolls back. Otherwise roll back here; a rollback that fails
                # leaves the block's error the one raised, and the connection is closed.
                if self.in_process or not interrupted(type(exc), own=False):
                    with suppress(DatabaseError):
                        self._guarded(self._rollback, conn)
                    self._give_back(conn)
                raise
            self._guarded(self._commit, conn)
            self._give_back(conn)

    def _give_back(self, conn: Any) -> None:
        """_restore() once transaction()'s transaction has ended (before, it could commit the
        caller's work). The outcome is decided by then, so this never raises: a connection it
        cannot restore, or still in a transaction (its rollback failed, or read the reply of a
        statement the block left unread), is closed, and the pool drops it."""
        try:
            self._restore(conn)
            if self._in_transaction(conn):
                conn.close()
        except Exception:  # noqa: BLE001 - any failure here loses the connection, nothing more
            with suppress(Exception):
                conn.close()

    def _restore(self, conn: Any) -> None:
        """Puts back what tableq's own statements rely on and a caller may have changed on
        the connection transaction() handed it, before it goes back to the pool."""

    def _guarded(self, step: Callable[[Any], None], conn: Any) -> None:
        with self.map_errors():
            step(conn)

    def _begin(self, conn: Any) -> None:
        raise NotImplementedError

    def _commit(self, conn: Any) -> None:
        raise NotImplementedError

    def _rollback(self, conn: Any) -> None:
        raise NotImplementedError

    # --- migrations ---------------------------------------------------------------------------

    def _versions(self, cur: Cursor) -> set[int]:
        return {int(r["version"]) for r in self._all(cur, self.Q.migration_versions)}

    def schema_version(self) -> int:
        return max(self._locked(self._versions), default=0)

    def migrate(self) -> list[int]:
        migrations = self._migration_files()

        def run(cur: Cursor) -> list[int]:
            applied = apply_pending(migrations, self._versions(cur),
                                    lambda sql, p=None: self._exec(cur, sql, p),
                                    self.Q.migration_record)
            if self.test_clock:
                self._exec(cur, self.Q.test_clock_create)
                self._exec(cur, self.Q.test_clock_init)
            return applied
        return self._locked(run)

    def migrations_applied(self) -> set[int]:
        return self.run(self._versions, write=False)

    def migrations_known(self) -> set[int]:
        return {m.version for m in self._migration_files()}

    def _schema_facts(self) -> dict[str, Any]:
        return {"applied": applied_versions(lambda: sorted(self.migrations_applied())),
                "known": sorted(self.migrations_known())}

    # --- sending: the keyed / plain flush (dialects with one insert per key) ---------------

    def message_insert(self, rows: Sequence[NewMessage] | PayloadBatch, on_duplicate: str,
               conn: Any = None) -> list[tuple[int, str]]:
        """Unkeyed rows are inserted in runs (nothing can conflict); a keyed row is inserted
        alone, with its duplicate policy. Order is kept."""
        if isinstance(rows, PayloadBatch):
            batch = rows
            return self.run(lambda cur: [(i, "sent") for i in self._insert_batch(cur, batch)],
                            conn, tx=len(batch) > 1)
        if len(rows) == 1 and rows[0].key is None:
            # One unkeyed row is one INSERT, which commits on its own: no transaction around it.
            if conn is None:
                self._before_lone_write()
            return self.run(lambda cur: [(self._insert_plain(cur, rows)[0], "sent")], conn,
                            write=False)

        def run(cur: Cursor) -> list[tuple[int, str]]:
            out: list[tuple[int, str]] = []
            plain: list[NewMessage] = []

            def flush() -> None:
                if plain:
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
        # A caller who catches DuplicateMessage goes on with its transaction: a batch that
        # may fail on a key halfway must leave none of its rows there.
        refusable = (conn is not None and on_duplicate == "error" and len(rows) > 1
                     and any(m.key is not None for m in rows))
        return self.run(self._whole(run, conn) if refusable else run, conn,
                        tx=len(rows) > 1)

    def _before_lone_write(self) -> None:
        """Called before a write that runs as one statement of its own (no write=True)."""

    def _whole(self, fn: Callable[[Cursor], T], conn: Any) -> Callable[[Cursor], T]:
        """fn, a send of several statements, as one unit on a caller's connection (as it
        is on tableq's own, in run()'s transaction): in a savepoint inside the caller's open
        transaction; else in a transaction of its own, committed when the connection
        commits every statement by itself (autocommit), left open for the caller when its
        driver would have begun one at the first INSERT anyway (sqlite3's legacy mode, where
        a SAVEPOINT would begin one that its RELEASE commits)."""
        def whole(cur: Cursor) -> T:
            if self._in_transaction(conn):
                with self._savepoint(cur):
                    return fn(cur)
            self._begin(conn)
            try:
                out = fn(cur)
            except Exception:
                with suppress(Exception):  # the first error is the one to report
                    self._rollback(conn)
                raise
            if self._autocommits(conn):
                self._commit(conn)
            return out
        return whole

    @contextmanager
    def _savepoint(self, cur: Cursor) -> Iterator[None]:
        """The statements of the block undone together if it fails, inside the caller's
        transaction, which stays usable. If the failure already ended that transaction (a
        deadlock on MariaDB, some errors on SQLite), the savepoint is gone with it: the
        original error is the one raised."""
        self._exec(cur, self.Q.savepoint_set)
        try:
            yield
        except Exception:
            with suppress(Exception):
                self._exec(cur, self.Q.savepoint_rollback)
            raise
        self._exec(cur, self.Q.savepoint_release)

    def _in_transaction(self, conn: Any) -> bool:
        """Whether the caller's connection has a transaction open."""
        raise NotImplementedError

    def _autocommits(self, conn: Any) -> bool:
        """Whether the caller's connection commits each statement by itself."""
        raise NotImplementedError

    def _insert_plain(self, cur: Cursor, rows: Sequence[NewMessage]) -> list[int]:
        raise NotImplementedError

    def _insert_batch(self, cur: Cursor, batch: PayloadBatch) -> list[int]:
        """Bare payloads under one template (no key): as plain rows unless a dialect has a
        better way."""
        return self._insert_plain(cur, batch.rows())

    def _insert_keyed(self, cur: Cursor, m: NewMessage, on_duplicate: str) -> tuple[int, str]:
        raise NotImplementedError

    def _message_params(self, m: NewMessage) -> Params:
        return {"topic": m.topic, "key": m.key, "kind": m.kind, "payload": m.json_text,
                "payload_bytes": m.data, "headers": m.headers_json, "priority": m.priority,
                "at": self._db_time(m.at), **self._span("delay", m.delay_s)}

    # --- receiving: select due, dead-letter the spent, lease the rest (dialects without one
    # claiming statement) ----------------------------------------------------------------

    def _due(self, cur: Cursor, spec: ClaimSpec) -> list[Row]:
        sql, params = self._receive(self.Q.message_due, self.Q.message_due_where, spec.where)
        return self._all(cur, sql, {**params, "topic": spec.topic, "max": spec.max})

    def message_claim(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        def run(cur: Cursor) -> ClaimResult:
            due = self._due(cur, spec)
            spent = [r["id"] for r in due if r["attempts"] >= spec.max_attempts]
            live = [r for r in due if r["attempts"] < spec.max_attempts]
            if spent:
                self._exec(cur, self.Q.message_dead_letter_ids, {"ids": self._ids(spent)})
                self._exec(cur, self.Q.message_delete_ids, {"ids": self._ids(spent)})
            if not live:
                return ClaimResult([], len(spent))
            flags = [spec.charges(i, r["attempts"]) for i, r in enumerate(live)]
            rows = self._lease(cur, spec, live, flags)
            if spec.ids_only:
                return ClaimResult([{"id": r["id"]} for r in live], len(spent))
            for row, charged in zip(rows, flags, strict=True):
                row["charged"] = charged
            return ClaimResult(rows, len(spent))
        return self.run(run, conn, tx=True)

    def _lease(self, cur: Cursor, spec: ClaimSpec, live: list[Row],
               flags: list[bool]) -> list[Row]:
        """Leases the live due rows (charging those flagged); returns them shaped, in order."""
        raise NotImplementedError

    def message_take(self, spec: ClaimSpec, conn: Any = None) -> ClaimResult:
        def run(cur: Cursor) -> ClaimResult:
            due = self._due(cur, spec)
            rows = self._take(cur, due) if due else []
            for r in rows:  # it counts as received once
                r["attempts"] += 1
            return ClaimResult(rows, 0)
        return self.run(run, conn, tx=True)

    def _take(self, cur: Cursor, due: list[Row]) -> list[Row]:
        """Removes the due rows; returns them shaped, in order."""
        raise NotImplementedError

    # --- settling -----------------------------------------------------------------------------

    def message_release(self, msg_id: int, lease: str, delay_s: float, error: str | None,
                penalty: bool, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "error": error, "refund": 0 if penalty else 1,
                  **self._span("delay", delay_s)}
        released = self._change(self.Q.message_release, params, conn)
        self._churned(released)
        return released > 0

    def message_extend(self, msg_id: int, lease: str, extend_s: float,
               progress_json: str | None, conn: Any = None) -> datetime | None:
        params = {"id": msg_id, "lease": lease, "progress": progress_json,
                  **self._span("extend", extend_s)}
        found = self.run(lambda cur: self._one(cur, self.Q.message_extend, params), conn)
        return self._to_time(found["available_at"]) if found else None

    def _ref_parts(self, refs: Sequence[R]) -> Iterator[Sequence[R]]:
        if self.refs_per_statement is None:
            yield refs
        else:
            yield from chunks(refs, self.refs_per_statement)

    def message_charge(self, charges: Sequence[tuple[int, str, int]], extend_s: float,
                       started: Charged | None = None) -> dict[int, tuple[int, datetime]]:
        def run(cur: Cursor) -> dict[int, tuple[int, datetime]]:
            out: dict[int, tuple[int, datetime]] = {}
            for part in self._ref_parts(charges):
                p = {**self._charges(part), **self._span("extend", extend_s)}
                out.update((r["id"], (r["attempts"], self._to_time(r["available_at"])))
                           for r in self._all(cur, self.Q.message_charge, p))
            if started is not None:
                started(out)
            return out
        charged = self.run(run, tx=started is not None)
        self._churned(len(charged))
        return charged

    def message_extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float
                    ) -> dict[int, datetime]:
        def run(cur: Cursor) -> dict[int, datetime]:
            out: dict[int, datetime] = {}
            for part in self._ref_parts(refs):
                p = {**self._refs(part), **self._span("extend", extend_s)}
                out.update((r["id"], self._to_time(r["available_at"]))
                           for r in self._all(cur, self.Q.message_extend_many, p))
            return out
        extended = self.run(run)
        self._churned(len(extended))
        return extended

    def message_dead_letter_taken(self, row: Row, error: str, conn: Any = None) -> None:
        self._change(self.Q.dead_insert, {**dead_row_values(row, self._db_time), "error": error},
                     conn)

    def done_match(self, refs: Sequence[tuple[int, str]]) -> set[int]:
        return {r["id"] for r in self._read_all(self.Q.done_match, self._refs(refs))}

    # --- looking ------------------------------------------------------------------------------

    def message_peek(self, topic: str, limit: int) -> list[Row]:
        return self._shaped(self.Q.message_peek, {"topic": topic, "limit": limit})

    def message_get(self, msg_id: int) -> Row | None:
        rows = self._shaped(self.Q.message_get, {"id": msg_id})
        return rows[0] if rows else None

    def topic_list(self) -> list[str]:
        return [r["topic"] for r in self._read_all(self.Q.message_topics)]

    def topic_stats(self, topic: str | None, exact: bool = False) -> list[Row]:
        def run(cur: Cursor) -> list[Row]:
            p = {"topic": topic}
            live = self._live_stats(cur, topic, exact)
            dead = {r["topic"]: r["dead"] for r in self._all(cur, self.Q.dead_stats, p)}
            done = {r["topic"]: r["done"] for r in self._all(cur, self.Q.done_stats, p)}
            return merge_stats(live, dead, done)
        # One read transaction so the three counts agree with each other.
        return self.run(run, tx=True, write=False)

    def _live_stats(self, cur: Cursor, topic: str | None, exact: bool) -> dict[str, Row]:
        """Per-topic live counts: every row while the table is small (or exact=True);
        in a big table a sample of id windows, then exact counts for the topics it finds
        small and the oldest ready message of the others from the claim index."""
        span = None if exact else self._one(cur, self.Q.message_id_span)
        sample = id_sample(span["lo"], span["hi"], exact_span=self.stats_exact_span,
                           ids=self.stats_sample_ids,
                           windows=self.stats_sample_windows) if span else None
        if sample is None:
            return {r["topic"]: r for r in self._all(cur, self.Q.message_stats, {"topic": topic})}
        sampled = {r["topic"]: r for r in self._all(cur, self.Q.message_stats_sample, {
            "topic": topic, "lo": sample.lo, "hi": sample.hi, "stride": sample.stride,
            "width": sample.width})}
        topics = [topic] if topic is not None else self._live_topics(cur)
        live: dict[str, Row] = {}
        for name in topics:
            counts = scaled(sampled[name], sample) if name in sampled else None
            if counts is None or needs_exact(counts, int(sampled[name]["windows"]),
                                             exact_topic=self.stats_exact_topic,
                                             min_windows=self.stats_min_windows):
                live.update((r["topic"], r) for r in
                            self._all(cur, self.Q.message_stats_topic, {"topic": name}))
                continue
            heads = [self._one(cur, self.Q.message_priority_head,
                               {"topic": name, "priority": r, "cap": self.stats_exact_topic})
                     for r in self._priorities(cur, name)]
            live[name] = {"topic": name, **topic_estimate(counts, [h for h in heads if h],
                                                          self.stats_exact_topic)}
        return live

    def _live_topics(self, cur: Cursor) -> list[str]:
        """The live table's topics, a claim-index probe each (a loose index scan, which
        MariaDB does not run well as a recursive query)."""
        topics: list[str] = []
        while row := self._one(cur, self.Q.message_topic_after,
                               {"after": topics[-1] if topics else ""}):
            topics.append(row["topic"])
        return topics

    def _priorities(self, cur: Cursor, topic: str) -> list[int]:
        """A topic's priorities, highest first, a claim-index probe each."""
        found: list[int] = []
        at_most = PRIORITY_MAX
        while at_most >= PRIORITY_MIN and (row := self._one(
                cur, self.Q.message_priority_at_most, {"topic": topic, "at_most": at_most})):
            found.append(int(row["priority"]))
            at_most = found[-1] - 1
        return found

    def topic_purge(self, topic: str) -> int:
        return self._change(self.Q.message_purge, {"topic": topic})

    # --- dead letters -------------------------------------------------------------------------

    def dead_list(self, topic: str, limit: int) -> list[Row]:
        return self._shaped(self.Q.dead_list, {"topic": topic, "limit": limit})

    def dead_purge(self, topic: str, ids: Sequence[int] | None) -> int:
        return self._change(self.Q.dead_purge, {"topic": topic, **self._some_ids(ids)})

    # --- group leases -------------------------------------------------------------------------

    def lease_rows(self, group: GroupLease) -> list[Row]:
        return self._shaped(self.Q.lease_rows, group.params())

    def lease_read(self, group: GroupLease) -> dict[str, list[Any]]:
        rows = self._read_all(self.Q.lease_read, group.params())
        columns = {name: [r[name] for r in rows] for name in (rows[0] if rows else ())}
        to_time = self._to_time
        for name in _LEASE_TIMES:
            if name in columns:
                columns[name] = [None if v is None else to_time(v) for v in columns[name]]
        return columns

    def lease_extend(self, group: GroupLease, extend_s: float,
                     ending_within_s: float | None = None) -> int:
        params = {**group.params(), **self._span("extend", extend_s)}
        if ending_within_s is None:
            extended = self._change(self.Q.lease_extend, params)
        else:
            extended = self._change(self.Q.lease_extend_ending,
                                    {**params, **self._span("within", ending_within_s)})
        self._churned(extended)
        return extended

    def lease_release(self, group: GroupLease) -> int:
        released = self._change(self.Q.lease_release, group.params())
        self._churned(released)
        return released

    # --- staged loads: the job row, then the dialect's rows (dialects with a stage table
    # for every row) -----------------------------------------------------------------------

    def stage_write(self, job: str, part: int, batch: Sequence[NewMessage] | PayloadBatch) -> int:
        rows = as_rows(batch)

        def run(cur: Cursor) -> int:
            p = {"job": job}
            self._exec(cur, self.Q.load_job_open, p)
            self._exec(cur, self.Q.load_job_reopen, p)
            state = self._one(cur, self.Q.load_job_share, p)
            if state is not None and state["state"] == "committed":
                return 0  # a replayed or late task of a finished load: it was published once
            self._stage_rows(cur, job, part, rows)
            return len(rows)
        return self.run(run, tx=True)

    def _stage_rows(self, cur: Cursor, job: str, part: int, rows: Sequence[NewMessage]) -> None:
        raise NotImplementedError

    def _stage_params(self, job: str, part: int, m: NewMessage) -> Params:
        return {**self._message_params(m), "job": job, "part": part}

    def stage_publish(self, job: str, parts: Sequence[int], on_duplicate: str,
                expected: int | None = None) -> int | None:
        query = self.Q.stage_publish_replace if on_duplicate == "replace" else self.Q.stage_publish

        def run(cur: Cursor) -> int | None:
            if self._job_lock(cur, job) == "committed":
                self._exec(cur, self.Q.stage_delete_job, {"job": job})
                return None
            p = {"job": job, "parts": self._ids(parts)}
            staged = int(self._value(cur, self.Q.stage_count, p, "n"))
            if expected is not None and staged != expected:
                raise LoadIncomplete(job, expected, staged)
            n = self._publish_rows(cur, query, p, staged, on_duplicate)
            self._exec(cur, self.Q.stage_delete_job, {"job": job})
            self._exec(cur, self.Q.load_job_finish, {"job": job, "state": "committed", "rows": n})
            return n
        return self.run(run, tx=True)

    def _publish_rows(self, cur: Cursor, query: str, p: Params, staged: int,
                      on_duplicate: str) -> int:
        return self._exec(cur, query, p)

    def _job_lock(self, cur: Cursor, job: str) -> str:
        """Locks the load job's row (creating it open) and returns its state."""
        self._exec(cur, self.Q.load_job_open, {"job": job})
        return str(self._value(cur, self.Q.load_job_lock, {"job": job}, "state"))

    def stage_discard(self, job: str) -> int:
        def run(cur: Cursor) -> int:
            state = self._job_lock(cur, job)
            n = self._discard_rows(cur, job)
            if state != "committed":
                self._exec(cur, self.Q.load_job_finish, {"job": job, "state": "aborted",
                                                         "rows": 0})
            return n
        return self.run(run, tx=True)

    def _discard_rows(self, cur: Cursor, job: str) -> int:
        return self._exec(cur, self.Q.stage_delete_job, {"job": job})

    def stage_cleanup(self, older_than_s: float) -> int:
        jobs = [r["job"] for r in self._read_all(self.Q.stage_stale_jobs,
                                                 self._span("older_than", older_than_s))]
        return sum(self.stage_discard(job) for job in jobs)

    def stage_job_state(self, job: str) -> str | None:
        found = self._read_one(self.Q.load_job_state, {"job": job})
        return str(found["state"]) if found else None

    # --- history ------------------------------------------------------------------------------

    def history_bounds(self, source: str, topic: str | None) -> tuple[int, int] | None:
        found = self._read_one(getattr(self.Q, f"history_bounds_{source}"), {"topic": topic})
        return None if not found or found["lo"] is None else (found["lo"], found["hi"])

    def history_rows(self, source: str, topic: str | None, lo: int, hi: int,
                     before: datetime | None) -> list[Row]:
        return self._shaped(getattr(self.Q, f"history_rows_{source}"),
                            {"topic": topic, "lo": lo, "hi": hi, "before": self._db_time(before)})

    def history_delete(self, source: str, ids: Sequence[int],
                       before: datetime | None = None) -> int:
        if not ids:
            return 0
        q = self.Q.history_delete_dead if source == "dead" else self.Q.history_delete_done
        return self._change(q, {"ids": self._ids(ids), "before": self._db_time(before)})

    # --- access tokens and idempotency records (HTTP server) ------------------------------

    def token_insert(self, token: NewToken) -> None:
        self._change(self.Q.token_insert, {
            "id": token.id, "secret_sha256": token.secret_sha256, "role": token.role,
            "topics": json.dumps(list(token.topics)), "name": token.name,
            "access_key": token.access_key, "sqs_secret": token.sqs_secret,
            **self._span("expires_in", token.expires_in_s)})

    def token_find(self, *, secret_sha256: str | None = None,
                   access_key: str | None = None) -> TokenRecord | None:
        if secret_sha256 is not None:
            raw = self._read_one(self.Q.token_by_secret, {"secret_sha256": secret_sha256})
        else:
            raw = self._read_one(self.Q.token_by_access_key, {"access_key": access_key})
        return token_record(raw, self._to_time, self._loads) if raw is not None else None

    def token_list(self) -> list[TokenRecord]:
        return [token_record(r, self._to_time, self._loads)
                for r in self._read_all(self.Q.token_list)]

    def token_revoke(self, token_id: str) -> bool:
        return self._change(self.Q.token_revoke, {"id": token_id}) == 1

    def idempotency_claim(self, token_id: str, key: str, fingerprint: str,
                          conn: Any) -> IdempotencyRecord | None:
        p = {"token_id": token_id, "idem_key": key, "fingerprint": fingerprint}

        def run(cur: Cursor) -> IdempotencyRecord | None:
            if self._exec(cur, self.Q.idempotency_claim, p) == 1:
                return None
            return idempotency_record(self._one(cur, self.Q.idempotency_get, p))
        return self.run(run, conn)

    def idempotency_finish(self, token_id: str, key: str, status: int, response: str,
                           conn: Any) -> None:
        self._change(self.Q.idempotency_finish, {"token_id": token_id, "idem_key": key,
                                                 "status": status, "response": response}, conn)

    def idempotency_expire(self, older_than_s: float) -> int:
        return self._change(self.Q.idempotency_expire, self._span("older_than", older_than_s))


def duplicate_from(found: Row | None, m: NewMessage) -> DuplicateMessage:
    """The DuplicateMessage for a keyed row that met a live one (found: its id, if read)."""
    return DuplicateMessage(m.topic, m.key, found["id"] if found else None)
