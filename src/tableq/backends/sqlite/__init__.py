"""The SQLite dialect: every SQLite statement tableq runs lives in queries.sql beside this file.
Standard library sqlite3, WAL, BEGIN IMMEDIATE for every writing transaction (so concurrent
processes queue on the lock instead of failing with SQLITE_BUSY_SNAPSHOT). Lists travel as
JSON arrays (json_each)."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from tableq.backends._pool import Pool
from tableq.backends._queries import Migration, load_migrations, load_queries
from tableq.backends.base import (
    ClaimSpec,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    chunks,
    gather,
    retrying,
    row_chars,
    size_facts,
    spans,
)
from tableq.backends.sql import Cursor, Params, SqlBackend, duplicate_from
from tableq.backends.sqlite.errors import map_errors
from tableq.errors import InvalidArgument
from tableq.names import ANY_TOPIC
from tableq.url import DatabaseURL

T = TypeVar("T")
# busy_timeout already waits for the lock inside SQLite; a few retries cover the cases where
# SQLite reports SQLITE_BUSY without waiting (e.g. a WAL snapshot that moved on).
SQLITE_RETRIES = 3
# PRAGMA takes no parameters: one named query per allowed value.
SYNCHRONOUS = {"FULL": "session_synchronous_full", "NORMAL": "session_synchronous_normal",
               "EXTRA": "session_synchronous_extra"}
# Every "now" in queries.sql, and what a test clock reads instead (chosen once, at load).
CLOCK = ("(julianday('now') - 2440587.5) * 86400.0", "(SELECT clock FROM {p}test_clock)")
REFS_PER_STATEMENT = 500
# A batch send's JSON text in characters (base.row_chars): at most 6 bytes each once escaped,
# well within SQLite's longest string (a billion bytes), which 1,000 payloads of 1 MiB pass.
STATEMENT_CHARS = 64 * 1024 * 1024
WATCH_INTERVAL_S = 0.005  # how often a listener reads data_version (a counter in shared memory)
# At most one hint per this long: any commit to the file changes data_version (other topics'
# traffic, acks, heartbeats), and each hint costs an idle worker a claim, which on SQLite is a
# write transaction. The first change after a quiet spell is still reported at once.
HINT_GAP_S = 0.05
# A file locked past this fails the listener's read (the worker polls and reopens the
# listener later) instead of stalling its fetch loop for the whole busy timeout.
WATCH_BUSY_TIMEOUT_S = 0.1


class SQLiteListener:
    """Wake-up hints for a database that cannot notify. PRAGMA data_version, read on a
    connection of its own, changes whenever another connection commits (in this process or
    another one on this host), so a sleeping worker hears of a send, a nack back to now or a
    released lease within milliseconds, for the price of reading a counter. It cannot tell
    which topic changed: it answers ANY_TOPIC. A hint, not a transport: workers keep polling
    (delayed messages coming due and expired leases commit nothing)."""

    wakeup = "data_version"

    def __init__(self, backend: SQLiteBackend) -> None:
        self._where, self._query = backend.where, backend.Q.session_data_version
        self._hinted_at = 0.0
        with map_errors(self._where):
            self._conn = sqlite3.connect(backend.path, timeout=WATCH_BUSY_TIMEOUT_S,
                                         isolation_level=None, check_same_thread=False)
            try:
                self._version = self._read()
            except BaseException:
                self._conn.close()
                raise

    def _read(self) -> int:
        return int(self._conn.execute(self._query).fetchone()[0])

    def wait_counts(self, timeout_s: float) -> dict[str, int]:
        """Blocks up to timeout_s for a commit by another connection; {ANY_TOPIC: 1} when
        one came (how many messages it made due is not known), else {}."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with map_errors(self._where):
            while True:
                now = time.monotonic()
                if now >= self._hinted_at + HINT_GAP_S:
                    version = self._read()
                    if version != self._version:
                        self._version, self._hinted_at = version, now
                        return {ANY_TOPIC: 1}
                left = deadline - now
                if left <= 0:
                    return {}
                time.sleep(min(WATCH_INTERVAL_S, left))

    def wait(self, timeout_s: float) -> list[str]:
        return sorted(self.wait_counts(timeout_s))

    def pause(self) -> None:
        """Nothing to stop: a commit counter costs the writers nothing."""

    def close(self) -> None:
        self._conn.close()


class _QueueConnection(sqlite3.Connection):
    """A connection tableq opened: a subclass only to take weak references, so that
    check_connection checks its file once (a transaction()'s acks and sends pass it)."""


class SQLiteBackend(SqlBackend):
    dialect = "sqlite"
    single_writer = True
    in_process = True
    retry_attempts: ClassVar[int] = SQLITE_RETRIES
    refs_per_statement: ClassVar[int | None] = REFS_PER_STATEMENT
    connection_type: ClassVar[type] = sqlite3.Connection
    connection_name: ClassVar[str] = "sqlite3.Connection to the queue's file"

    def __init__(self, url: DatabaseURL, *, synchronous: str | None = None,
                 busy_timeout_s: float = 10.0, test_clock: bool = False) -> None:
        # The keyword, else the URL's ?synchronous= (the only way from the command line),
        # else FULL.
        sync = str(synchronous if synchronous is not None
                   else url.params.get("synchronous") or "FULL").upper()
        if sync not in SYNCHRONOUS:
            raise InvalidArgument("synchronous must be FULL, NORMAL or EXTRA (the connect() "
                                  "option or ?synchronous= in a SQLite URL)")
        self.url, self.path, self.where = url, url.database or "", url.redacted
        self.synchronous = sync
        self.busy_timeout_s = busy_timeout_s
        self.test_clock = bool(test_clock)
        self.Q = load_queries(__package__, "{p}", url.namespace,
                              clock=CLOCK if self.test_clock else None)
        self._migrations = load_migrations(__package__, "{p}", url.namespace)
        self.pool = Pool(self._connect, lambda c: c.close())
        self._held = threading.local()  # .depth: this thread's open transaction() blocks

    def _same_database(self, theirs: dict[str, Any]) -> bool:
        """The same file as the pool's connections opened, by its name or, under another name
        (a link, a path relative to another directory), by os.path.samefile; names found
        the same are remembered."""
        file = theirs.get("file") or ""
        same = self.__dict__.setdefault("_same_files", set())
        if file in same:
            return True
        own = self._own_database().get("file") or ""
        try:
            if not (file and own and (file == own or os.path.samefile(file, own))):
                return False
        except OSError:
            return False
        same.add(file)
        return True

    def listener(self, topics: Collection[str] | None = None) -> SQLiteListener:
        return SQLiteListener(self)

    # --- connections and transactions -----------------------------------------------------

    def map_errors(self) -> AbstractContextManager[None]:
        return map_errors(self.where)

    def _connect(self) -> sqlite3.Connection:
        def open_() -> sqlite3.Connection:
            with self.map_errors():
                conn = sqlite3.connect(
                    self.path, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False, factory=_QueueConnection,
                )
                conn.row_factory = sqlite3.Row
                conn.execute(self.Q.session_journal_wal)
                conn.execute(getattr(self.Q, SYNCHRONOUS[self.synchronous]))
                return conn
        return retrying(open_, attempts=SQLITE_RETRIES)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        self._refuse_while_held("open another queue.transaction()")
        self._held.depth = 1
        try:
            with super().transaction() as conn:
                yield conn
        finally:
            self._held.depth = 0

    def _refuse_while_held(self, action: str) -> None:
        """SQLite has one write lock, and this thread's open transaction() holds it: a write
        on another connection would wait for the block to end, which cannot happen while the
        block waits for it (busy_timeout, three times, then a 'database is locked')."""
        if getattr(self._held, "depth", 0):
            raise InvalidArgument(
                f"cannot {action} inside a queue.transaction() block on SQLite: the block "
                "holds the database's one write lock, so this would wait for the block to "
                "end. Use the block's own calls (tx.send, tx.ack, message.nack(), ...) or "
                "do it after the block")

    def _before_lone_write(self) -> None:
        self._refuse_while_held("send on another connection")

    def _attempt(self, fn: Callable[[Cursor], T], *, tx: bool, write: bool) -> T:
        """A write always runs in BEGIN IMMEDIATE; a read in a read transaction when tx
        (several statements that must see one state), else statement by statement."""
        if write:
            self._refuse_while_held("write on another connection")
        with self.pool.connection(own=True) as c, self.map_errors():
            if not (tx or write):
                return fn(c)
            c.execute(self.Q.tx_begin_write if write else self.Q.tx_begin_read)
            try:
                result = fn(c)
            except BaseException:
                if c.in_transaction:
                    c.execute(self.Q.tx_rollback)
                raise
            c.execute(self.Q.tx_commit)
            return result

    @contextmanager
    def _cursor(self, conn: Any) -> Iterator[Cursor]:
        yield conn  # sqlite3 runs statements on the connection itself

    def _begin(self, conn: Any) -> None:
        conn.execute(self.Q.tx_begin_write)

    def _commit(self, conn: Any) -> None:
        conn.execute(self.Q.tx_commit)

    def _rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute(self.Q.tx_rollback)

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def _autocommits(self, conn: Any) -> bool:
        # Python 3.12's autocommit=True, or the legacy mode's isolation_level None.
        return getattr(conn, "autocommit", None) is True or conn.isolation_level is None

    def _restore(self, conn: Any) -> None:
        conn.row_factory, conn.text_factory = sqlite3.Row, str
        if conn.isolation_level is not None:  # the driver's implicit BEGINs: tableq's own
            conn.isolation_level = None       # single statements would never commit

    def _all(self, cur: Cursor, query: str, params: Params | None = None) -> list[Row]:
        done = cur.execute(query, params or {})
        names = [d[0] for d in done.description]
        rows = done.fetchall()
        # By position: a caller's own connection may have any row_factory, or none; a dict
        # one (the sqlite3 docs' recipe) iterates its keys, so its values are taken.
        if rows and isinstance(rows[0], dict):
            return [dict(zip(names, r.values(), strict=True)) for r in rows]
        return [dict(zip(names, r, strict=True)) for r in rows]

    def _one(self, cur: Cursor, query: str, params: Params | None = None) -> Row | None:
        rows = self._all(cur, query, params)
        return rows[0] if rows else None

    def _exec(self, cur: Cursor, query: str, params: Params | None = None) -> int:
        done = cur.execute(query, params or {})
        done.fetchall()  # a RETURNING statement counts its rows only once they are read
        return int(done.rowcount)

    # --- values -------------------------------------------------------------------------------

    def _to_time(self, value: Any) -> datetime:
        return _utc(value)

    def _db_time(self, value: datetime | None) -> Any:
        return value.timestamp() if value is not None else None

    def _ids(self, ids: Sequence[int]) -> Any:
        return json.dumps(list(ids))

    def _refs(self, refs: Sequence[tuple[int, str]]) -> Params:
        return {"refs": json.dumps([[i, lease] for i, lease in refs])}

    def _charges(self, charges: Sequence[tuple[int, str, int]]) -> Params:
        return {"refs": json.dumps([list(c) for c in charges])}

    # --- migrations -----------------------------------------------------------------------

    def _locked(self, fn: Callable[[Cursor], T]) -> T:
        def run(c: Cursor) -> T:
            # DDL is transactional in SQLite, and BEGIN IMMEDIATE makes migrators take turns.
            c.execute(self.Q.migration_create)
            return fn(c)
        return self.run(run)

    def _migration_files(self) -> list[Migration]:
        return self._migrations

    # --- sending --------------------------------------------------------------------------

    def _insert_plain(self, cur: Cursor, rows: Sequence[NewMessage]) -> list[int]:
        # Without keys nothing can conflict, and this connection holds the write lock, so
        # AUTOINCREMENT hands out consecutive ids.
        if len(rows) == 1:  # a single send: the driver knows the id (one statement less)
            done = cur.execute(self.Q.message_insert, self._message_params(rows[0]))
            return [int(done.lastrowid)]
        if any(m.data is not None for m in rows):
            cur.executemany(self.Q.message_insert, [self._message_params(m) for m in rows])
            return self._last_ids(cur, len(rows))
        at = self._db_time
        return self._insert_runs(cur, self.Q.message_insert_many, list(map(row_chars, rows)),
                                 lambda run: {"rows": json.dumps(
            [[m.topic, m.kind, m.json_text, m.headers_json, m.priority, at(m.at), m.delay_s]
             for m in rows[run]], ensure_ascii=False)})

    def _insert_batch(self, cur: Cursor, batch: PayloadBatch) -> list[int]:
        t = batch.template
        if len(batch) == 1 or any(data is not None for _, data in batch.payloads):
            return self._insert_plain(cur, batch.rows())
        texts = [text for text, _ in batch.payloads]
        common = self._message_params(t)
        return self._insert_runs(cur, self.Q.message_insert_payloads,
                                 [len(x or "") for x in texts],
                                 lambda run: {**common, "payloads": json.dumps(
                                     texts[run], ensure_ascii=False)})

    def _insert_runs(self, cur: Cursor, query: str, sizes: list[int],
                     params: Callable[[slice], Params]) -> list[int]:
        """One JSON-array insert per run of rows within STATEMENT_CHARS (SQLite refuses a
        longer string), params(run) its parameters; the ids of every row, in order."""
        ids: list[int] = []
        for start, end in spans(sizes, len(sizes), STATEMENT_CHARS):
            cur.execute(query, params(slice(start, end)))
            ids += self._last_ids(cur, end - start)
        return ids

    def _last_ids(self, cur: Cursor, n: int) -> list[int]:
        """The ids of the n rows just inserted in one go: consecutive under the write lock."""
        last = int(self._value(cur, self.Q.last_insert_id, None, "id"))
        return list(range(last - n + 1, last + 1))

    def _insert_keyed(self, cur: Cursor, m: NewMessage, on_duplicate: str) -> tuple[int, str]:
        params = self._message_params(m)
        found = self._one(cur, self.Q.message_find_key, params)
        if found is None:
            return int(cur.execute(self.Q.message_insert, params).lastrowid), "sent"
        if on_duplicate == "ignore":
            return found["id"], "duplicate"
        if on_duplicate == "replace":
            self._exec(cur, self.Q.message_insert_replace, params)
            return found["id"], "replaced"
        raise duplicate_from(found, m)

    # --- receiving ------------------------------------------------------------------------

    def _lease(self, cur: Cursor, spec: ClaimSpec, live: list[Row],
               flags: list[bool]) -> list[Row]:
        ids = [r["id"] for r in live]
        raw = self._all(cur, self.Q.message_lease, {
            "ids": self._ids(ids), "vt": spec.visibility_timeout_s, "lease": spec.lease,
            "charged": self._ids([i for i, f in zip(ids, flags, strict=True) if f]),
        })
        return _in_order(ids, [self._row(r, owned=True) for r in raw])

    def _take(self, cur: Cursor, due: list[Row]) -> list[Row]:
        ids = [r["id"] for r in due]
        raw = self._all(cur, self.Q.message_take, {"ids": self._ids(ids)})
        return _in_order(ids, [self._row(r, owned=True) for r in raw])

    def message_ack(self, refs: Sequence[tuple[int, str]], retain: bool,
                    conn: Any = None) -> set[int]:
        def run(c: Cursor) -> set[int]:
            done: set[int] = set()
            for part in chunks(refs, REFS_PER_STATEMENT):
                p = self._refs(part)
                if retain:
                    self._exec(c, self.Q.done_insert, p)
                done.update(r["id"] for r in self._all(c, self.Q.message_ack, p))
            return done
        return self.run(run, conn)

    def message_dead_letter(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        def run(c: Cursor) -> bool:
            params = {"id": msg_id, "lease": lease, "error": error}
            self._exec(c, self.Q.message_dead_letter, params)
            return self._one(c, self.Q.message_ack_one, params) is not None
        return self.run(run, conn)

    # --- dead letters -----------------------------------------------------------------------

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        params = {"topic": topic, **self._some_ids(ids)}

        def run(c: Cursor) -> int:
            self._exec(c, self.Q.dead_requeue, params)
            return self._exec(c, self.Q.dead_delete_requeued, params)
        return self.run(run)

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        def run(c: Cursor) -> int:
            p = group.params()
            if retain:
                self._exec(c, self.Q.done_insert_lease, p)
            return self._exec(c, self.Q.lease_ack, p)
        return self.run(run)

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def _stage_rows(self, cur: Cursor, job: str, part: int, rows: Sequence[NewMessage]) -> None:
        cur.executemany(self.Q.stage_insert, [self._stage_params(job, part, m) for m in rows])

    # --- health (tableq doctor) ---------------------------------------------------------------

    def health_facts(self) -> dict[str, Any]:
        def durability() -> dict[str, Any]:
            row = dict(self._read_one(self.Q.doctor_durability) or {})
            try:  # a WAL that keeps growing means checkpoints cannot finish
                row["wal_bytes"] = os.path.getsize(self.path + "-wal")
            except OSError:
                row["wal_bytes"] = 0
            return row

        return gather({"durability": durability,
                       "size": lambda: size_facts(self.path,
                                                  self._read_one(self.Q.doctor_size)),
                       "schema": self._schema_facts})


def _in_order(ids: list[int], rows: list[Row]) -> list[Row]:
    """RETURNING gives rows in no promised order: put them back in delivery order."""
    order = {mid: i for i, mid in enumerate(ids)}
    return sorted(rows, key=lambda r: order[r["id"]])


@functools.lru_cache(maxsize=4096)
def _utc(seconds: float) -> datetime:
    """Stored epoch seconds as an aware datetime (immutable, so shared). A claim's rows share
    their lease's two times and a sent batch's rows their send times: most reads are hits."""
    return datetime.fromtimestamp(seconds, UTC)
