"""The MySQL / MariaDB dialect (PyMySQL): every statement it runs lives in queries.sql beside
this file. READ COMMITTED sessions in UTC, FOR UPDATE SKIP LOCKED claims, deadlocks and
lock-wait timeouts retried as whole transactions. No RETURNING is assumed, so it also runs on
MySQL 8."""

from __future__ import annotations

import functools
import json
import math
import operator
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import pymysql
from pymysql.constants import CLIENT, FIELD_TYPE, SERVER_STATUS
from pymysql.converters import conversions, convert_datetime, escape_string
from pymysql.cursors import DictCursor

from tableq.backends._keepalive import DEFAULT_S as KEEPALIVE_S
from tableq.backends._keepalive import KeepAlive
from tableq.backends._pool import Deliberate, Pool, interrupted
from tableq.backends._queries import Migration, load_migrations, load_queries
from tableq.backends.base import (
    Charged,
    ClaimSpec,
    GroupLease,
    NewMessage,
    PayloadBatch,
    Row,
    TransientError,
    UniqueViolation,
    chunks,
    gather,
    row_chars,
    size_facts,
    spans,
)
from tableq.backends.mysql.errors import map_errors
from tableq.backends.sql import Cursor, Params, SqlBackend, duplicate_from
from tableq.errors import DatabaseTimeout, PayloadTooLarge, UnsupportedDatabase
from tableq.url import DatabaseURL

T = TypeVar("T")
BATCH_ROWS = 1000  # rows (or (id, lease) pairs) per batch statement
# A multi-row send's text in characters (base.row_chars): each is at most 6 bytes on the
# wire (a control character escaped as \u001f; UTF-8 takes at most 4), so a statement stays
# within MariaDB's default 16 MiB max_allowed_packet.
STATEMENT_CHARS = 2 * 1024 * 1024
PACKET_OVERHEAD = 64 * 1024  # the statement around one payload, and the packet's header
MIGRATION_LOCK_WAIT_S = 60
# Every "now" in queries.sql, and what a test clock reads instead (chosen once, at load).
CLOCK = ("UTC_TIMESTAMP(6)", "(SELECT clock FROM {p}test_clock)")


def _datetime(value: str | bytes) -> datetime | str:
    """A DATETIME as the server writes it, by Python's C parser: about 25x faster than
    PyMySQL's own, which a claim of 250 rows (five times each) spent some 2.5 ms on. PyMySQL's
    parser still takes what it does not read (zero dates)."""
    text = value.decode("ascii") if isinstance(value, (bytes, bytearray)) else value
    return _parse_datetime(text)


@functools.lru_cache(maxsize=4096)
def _parse_datetime(text: str) -> datetime | str:
    """Cached (datetimes are immutable): a claim's rows mostly share their times, sent in
    batches and leased by one statement."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        parsed: datetime | str = convert_datetime(text)
        return parsed


class _Ids(tuple[int, ...]):
    """Ids for an `IN %(ids)s` parameter, encoded in one pass (PyMySQL escapes a plain tuple
    item by item through its generic dispatch, and warns on every call that doing so is
    deprecated: about 3 ms for a claim's 1,000 ids)."""


class _Tuples(tuple[tuple[Any, ...], ...]):
    """(id, lease) pairs or (id, lease, attempts) triples for an `IN %(refs)s` parameter:
    each distinct lease is escaped once (a batch's refs mostly share one)."""


def _int_text(value: Any) -> str:
    return str(operator.index(value))  # an int, or TypeError: never SQL text


def _encode_ids(ids: _Ids, mapping: Any = None) -> str:
    return "(" + ",".join(map(_int_text, ids)) + ")"


def _encode_tuples(rows: _Tuples, mapping: Any = None) -> str:
    quoted: dict[str, str] = {}

    def literal(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, str):
            text = quoted.get(value)
            if text is None:
                text = quoted[value] = "'" + escape_string(value) + "'"
            return text
        return _int_text(value)
    return "(" + ",".join("(" + ",".join(map(literal, row)) + ")" for row in rows) + ")"


# PyMySQL's conversions (decoders by field type, encoders by Python type), DATETIME faster,
# id lists and ref lists in one pass.
CONVERSIONS = {**conversions, FIELD_TYPE.DATETIME: _datetime, FIELD_TYPE.TIMESTAMP: _datetime,
               _Ids: _encode_ids, _Tuples: _encode_tuples}


def _naive(at: datetime | None) -> datetime | None:
    """An aware datetime as the naive UTC value a DATETIME(6) column holds."""
    return at.astimezone(UTC).replace(tzinfo=None) if at is not None else None


def _us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _rows_json(rows: Sequence[NewMessage]) -> str:
    """Rows as message_insert's one JSON parameter (its column order; bytes as hex)."""
    def row(m: NewMessage) -> list[Any]:
        at = _naive(m.at)
        return [m.topic, m.key, m.kind, m.json_text, None if m.data is None else m.data.hex(),
                m.headers_json, m.priority, None if at is None else at.isoformat(" "),
                _us(m.delay_s)]
    return json.dumps([row(m) for m in rows], ensure_ascii=False)


# message_due_packed's columns, in its JSON_ARRAY's order.
_PACKED = ("id", "key", "kind", "payload", "payload_bytes", "headers", "priority", "attempts",
           "created_at", "first_available_at", "last_error", "progress")
_decode_packed = json.JSONDecoder(strict=False).decode


def _unpacked(packed: str | None, n: int, topic: str, db_now: datetime) -> list[Row] | None:
    """message_due_packed's text as message_due's rows, or None when it was cut short."""
    if packed is None:
        return None
    try:
        items = _decode_packed(packed)
    except ValueError:
        return None
    if len(items) != n:
        return None
    rows = []
    for item in items:
        row = dict(zip(_PACKED, item, strict=True))
        row["topic"], row["db_now"] = topic, db_now
        row["created_at"] = _parse_datetime(row["created_at"])
        row["first_available_at"] = _parse_datetime(row["first_available_at"])
        if row["payload_bytes"] is not None:
            row["payload_bytes"] = bytes.fromhex(row["payload_bytes"])
        rows.append(row)
    return rows


class _NotAllHeld(Deliberate):
    """A batch ack found a lease no longer held: its one-statement form rolls back."""


class MySQLBackend(SqlBackend):
    dialect = "mysql"
    connection_type: ClassVar[type] = pymysql.connections.Connection
    connection_name: ClassVar[str] = "PyMySQL Connection"

    def __init__(self, url: DatabaseURL, *, pool_size: int = 32,
                 connect_timeout_s: float = 10,
                 transaction_idle_timeout_s: float = 300.0,
                 tcp_keepalive_s: float = KEEPALIVE_S, test_clock: bool = False) -> None:
        self.url, self.where = url, url.redacted
        self.prefix = url.namespace
        self.test_clock = bool(test_clock)
        self.Q = load_queries(__package__, "{p}", self.prefix,
                                       clock=CLOCK if self.test_clock else None)
        self.connect_kwargs: dict[str, Any] = {
            "host": url.host, "port": url.port or 3306, "user": url.user or "root",
            "password": url.password or "", "database": url.database, "charset": "utf8mb4",
            "autocommit": True, "cursorclass": DictCursor, "conv": CONVERSIONS,
            "connect_timeout": url.connect_timeout(connect_timeout_s),
        }
        # Whole seconds on MariaDB, 0 for no limit as on PostgreSQL.
        self.transaction_idle_s = (0 if not transaction_idle_timeout_s
                                   else max(1, math.ceil(transaction_idle_timeout_s)))
        self.keepalive = KeepAlive.within(tcp_keepalive_s)
        self.migration_lock_wait_s = MIGRATION_LOCK_WAIT_S
        self.mariadb: bool | None = None
        self.packet_limit: int | None = None  # the server's max_allowed_packet
        self.consecutive_ids = True
        self.id_step = 1
        self.pool = Pool(self._connect, lambda c: c.close(), max_idle=pool_size,
                         socket_of=lambda c: c._sock.fileno())

    # --- connections and transactions -----------------------------------------------------

    def map_errors(self) -> AbstractContextManager[None]:
        return map_errors(self.where)

    def _connect(self) -> pymysql.connections.Connection:
        with self.map_errors():
            conn = pymysql.connect(**self.connect_kwargs)
            if self.keepalive is not None and conn._sock is not None:
                self.keepalive.apply(conn._sock)
            with conn.cursor() as cur:
                cur.execute(self.Q.session_time_zone)
                cur.execute(self.Q.session_isolation)
                cur.execute(self.Q.session_pack_limit)
                if self.mariadb is None:
                    cur.execute(self.Q.server_version)
                    self._check_version(cur.fetchone(), conn)
                if self.mariadb:
                    cur.execute(self.Q.idle_transaction_limit,
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
        self.packet_limit = int(row["packet_limit"])
        self.mariadb = mariadb

    def _attempt(self, fn: Callable[[Cursor], T], *, tx: bool, write: bool) -> T:
        with self.pool.connection(own=True) as c, self.map_errors():
            if not tx:
                with c.cursor(DictCursor) as cur:
                    return fn(cur)
            c.begin()
            try:
                with c.cursor(DictCursor) as cur:
                    result = fn(cur)
                c.commit()
                return result
            except BaseException as exc:
                if not interrupted(type(exc), own=True):  # else closing it rolls back
                    c.rollback()
                raise

    def _cursor(self, conn: Any) -> AbstractContextManager[Cursor]:
        # The caller's own connection was made without tableq's `conv`: without the encoders
        # of its id and ref lists PyMySQL would quote them as one string (a syntax error).
        if _Ids not in conn.encoders:
            conn.encoders = {**conn.encoders, _Ids: _encode_ids, _Tuples: _encode_tuples}
        cur: AbstractContextManager[Cursor] = conn.cursor(DictCursor)
        return cur

    def _begin(self, conn: Any) -> None:
        conn.begin()

    def _commit(self, conn: Any) -> None:
        conn.commit()

    def _rollback(self, conn: Any) -> None:
        conn.rollback()

    def _in_transaction(self, conn: Any) -> bool:
        # With autocommit off a transaction is always open, though the status may not say
        # so yet (PyMySQL does not read it from a result set's end), and a BEGIN would
        # commit the caller's work so far. With autocommit on, one is open only after an
        # explicit BEGIN, whose OK packet PyMySQL reads the status from.
        return (not conn.get_autocommit()
                or bool(conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS))

    def _autocommits(self, conn: Any) -> bool:
        return bool(conn.get_autocommit())

    def _restore(self, conn: Any) -> None:
        conn.cursorclass = DictCursor
        conn.autocommit(True)  # no round trip when it is on: a single statement commits

    def _all(self, cur: Cursor, query: str, params: Params | None = None) -> list[Row]:
        cur.execute(query, params)
        return list(cur.fetchall())

    def _one(self, cur: Cursor, query: str, params: Params | None = None) -> Row | None:
        cur.execute(query, params)
        row: Row | None = cur.fetchone()
        return row

    def _exec(self, cur: Cursor, query: str, params: Params | None = None) -> int:
        return int(cur.execute(query, params))

    # --- values -------------------------------------------------------------------------------

    def _to_time(self, value: Any) -> datetime:
        return _as_utc(value)

    def _db_time(self, value: datetime | None) -> Any:
        return _naive(value)

    def _span(self, name: str, seconds: float | None) -> Params:
        return {f"{name}_us": None if seconds is None else _us(seconds)}

    def _ids(self, ids: Sequence[int]) -> Any:
        # Ids and part numbers are never negative, so -1 stands in for an empty list
        # (IN () is not SQL).
        return _Ids(ids or (-1,))

    def _some_ids(self, ids: Sequence[int] | None) -> Params:
        return {"all": ids is None, "ids": self._ids(ids or ())}

    def _refs(self, refs: Sequence[tuple[int, str]]) -> Params:
        return {"refs": _Tuples(refs)}

    def _charges(self, charges: Sequence[tuple[int, str, int]]) -> Params:
        return {"charges": _Tuples(charges), "ids": self._ids([i for i, _, _ in charges]),
                **self._refs([(i, lease) for i, lease, _ in charges])}

    # --- migrations -----------------------------------------------------------------------

    def _locked(self, fn: Callable[[Cursor], T]) -> T:
        def run(cur: Cursor) -> T:
            got = self._one(cur, self.Q.migration_lock, {"prefix": self.prefix,
                                                         "wait_s": self.migration_lock_wait_s})
            if not got or not got["got"]:
                raise DatabaseTimeout(
                    self.where, f"another session held tableq's migration lock for "
                    f"{self.migration_lock_wait_s} s", "wait for the other `tableq migrate` to "
                    "finish, or find the session holding the lock (SELECT IS_USED_LOCK("
                    f"'tableq.migrate.{self.url.database}.{self.prefix}')) and end it; "
                    "then migrate again")
            try:
                cur.execute(self.Q.migration_create)
                return fn(cur)
            finally:
                cur.execute(self.Q.migration_unlock, {"prefix": self.prefix})
        return self.run(run)

    def _migration_files(self) -> list[Migration]:
        self.run(lambda cur: None)  # connects once, so the server flavour is known
        collation = "utf8mb4_nopad_bin" if self.mariadb else "utf8mb4_0900_bin"
        return load_migrations(__package__, "{p}", self.prefix, names={"{bin}": collation})

    def migrations_known(self) -> set[int]:
        # The versions only: no need to ask the server which collation it speaks.
        return {m.version for m in load_migrations(__package__, "{p}", self.prefix)}

    # --- sending --------------------------------------------------------------------------

    def message_insert(self, rows: Sequence[NewMessage] | PayloadBatch, on_duplicate: str,
                       conn: Any = None) -> list[tuple[int, str]]:
        self._fit_packet(rows)
        return super().message_insert(rows, on_duplicate, conn)

    def _fit_packet(self, rows: Sequence[NewMessage] | PayloadBatch) -> None:
        """A payload beyond the server's max_allowed_packet: the server would drop the
        connection (read as "cannot reach the database", and retried), so it is refused
        before it is sent. A statement is cut to fit the packet (STATEMENT_CHARS), but one
        payload cannot be."""
        limit = self.packet_limit
        if limit is None:
            return
        room = limit - PACKET_OVERHEAD
        pairs = (rows.payloads if isinstance(rows, PayloadBatch)
                 else [(m.json_text, m.data) for m in rows])
        for text, data in pairs:
            if text is None:
                size = len(data or b"")
            elif len(text) * 4 <= room:  # a character is at most 4 bytes: surely fits
                continue
            else:
                size = len(text.encode("utf-8", "surrogatepass"))
            if size > room:
                raise PayloadTooLarge(size, room, "the server's max_allowed_packet (SET "
                                      "GLOBAL max_allowed_packet = ...)")

    def _insert_plain(self, cur: Cursor, rows: Sequence[NewMessage]) -> list[int]:
        ids: list[int] = []
        # Mode 2 ("interleaved") may hand one statement's rows non-consecutive ids: then
        # each row is its own statement.
        size = BATCH_ROWS if self.consecutive_ids else 1
        # The server drops the connection of a statement beyond its max_allowed_packet.
        for start, end in spans(map(row_chars, rows), size, STATEMENT_CHARS):
            part = rows[start:end]
            if len(part) == 1:
                cur.execute(self.Q.message_insert_one, self._message_params(part[0]))
            else:
                cur.execute(self.Q.message_insert, {"rows": _rows_json(part)})
            first = cur.lastrowid  # LAST_INSERT_ID(): the first id of this statement
            ids.extend(range(first, first + len(part) * self.id_step, self.id_step))
        return ids

    def _insert_keyed(self, cur: Cursor, m: NewMessage, on_duplicate: str) -> tuple[int, str]:
        params = self._message_params(m)
        if on_duplicate == "error":
            try:
                with self.map_errors():
                    cur.execute(self.Q.message_insert_one, params)
            except UniqueViolation:
                raise duplicate_from(self._one(cur, self.Q.message_find_key, params), m) from None
            return cur.lastrowid, "sent"
        query = (self.Q.message_insert_replace if on_duplicate == "replace"
                 else self.Q.message_insert_ignore)
        kept = "replaced" if on_duplicate == "replace" else "duplicate"
        if cur.connection.client_flag & CLIENT.FOUND_ROWS:
            # A caller's connection that counts found rows, not changed ones (SQLAlchemy's
            # PyMySQL default): a duplicate counts 1 like an insert, so look first (a
            # duplicate committed between the two statements is reported as sent).
            existing = self._one(cur, self.Q.message_find_key, params)
            self._exec(cur, query, params)
            return cur.lastrowid, "sent" if existing is None else kept
        if self._exec(cur, query, params) == 1:
            return cur.lastrowid, "sent"
        return cur.lastrowid, kept

    # --- receiving ------------------------------------------------------------------------

    def _due(self, cur: Cursor, spec: ClaimSpec) -> list[Row]:
        if spec.where is not None:
            return super()._due(cur, spec)
        got = self._one(cur, self.Q.message_due_packed, {"topic": spec.topic, "max": spec.max})
        if got is None or not got["n"]:
            return []
        rows = _unpacked(got["packed"], got["n"], spec.topic, got["db_now"])
        # Cut short (payloads too big for one packet): the rows are locked by this
        # transaction now, so the plain read returns them (or rows due since, as good).
        return rows if rows is not None else super()._due(cur, spec)

    def _lease(self, cur: Cursor, spec: ClaimSpec, live: list[Row],
               flags: list[bool]) -> list[Row]:
        # One token per receive call: fencing needs a new token per delivery, not per row.
        now = live[0]["db_now"]
        until = now + timedelta(seconds=spec.visibility_timeout_s)
        lease = spec.lease or uuid.uuid4().hex
        charged = [r["id"] for r, f in zip(live, flags, strict=True) if f]
        self._exec(cur, self.Q.message_lease, {
            "ids": self._ids([r["id"] for r in live]), "charged": self._ids(charged),
            "lease": lease, "now": now, "until": until})
        if spec.ids_only:
            return []
        rows = []
        for r, f in zip(live, flags, strict=True):
            # The lease's token and times, set here, are shaped with the rest of the row
            # (not the read values shaped, then replaced).
            r.update(lease=lease, attempts=r["attempts"] + f, received_at=now,
                     available_at=until)
            rows.append(self._row(r, owned=True))
        return rows

    def _take(self, cur: Cursor, due: list[Row]) -> list[Row]:
        ids = {"ids": self._ids([r["id"] for r in due])}
        rest = {r["id"]: r for r in self._all(cur, self.Q.message_taken, ids)}
        self._exec(cur, self.Q.message_delete_ids, ids)
        return [self._row({**r, **rest[r["id"]]}, owned=True) for r in due]

    def message_ack(self, refs: Sequence[tuple[int, str]], retain: bool,
                    conn: Any = None) -> set[int]:
        if len(refs) == 1 and not retain:  # the common case: one statement, no transaction
            msg_id, lease = refs[0]
            n = self._change(self.Q.message_ack_one, {"id": msg_id, "lease": lease}, conn)
            return {msg_id} if n else set()

        if not retain and conn is None and len(refs) <= BATCH_ROWS:
            try:
                return self.run(lambda cur: self._ack_all_held(cur, refs), tx=True)
            except _NotAllHeld:  # rolled back: find out which are still held
                pass

        def run(cur: Cursor) -> set[int]:
            held: set[int] = set()
            for part in chunks(refs, BATCH_ROWS):
                ids = [r["id"] for r in self._all(cur, self.Q.message_held, self._refs(part))]
                if ids:
                    if retain:
                        self._exec(cur, self.Q.done_insert, {"ids": self._ids(ids)})
                    self._exec(cur, self.Q.message_delete_ids, {"ids": self._ids(ids)})
                    held.update(ids)
            return held
        return self.run(run, conn, tx=True)

    def _ack_all_held(self, cur: Cursor, refs: Sequence[tuple[int, str]]) -> set[int]:
        """The usual batch ack, every lease still held: one DELETE, no read of which are.
        Raises _NotAllHeld (its transaction then rolls back) when some are not."""
        ids = [i for i, _ in refs]
        leases = {lease for _, lease in refs}
        if len(leases) == 1:  # one receive call's messages: one token
            deleted = self._exec(cur, self.Q.message_ack_lease,
                                 {"ids": self._ids(ids), "lease": leases.pop()})
        else:
            deleted = self._exec(cur, self.Q.message_ack_held,
                                 {"ids": self._ids(ids), **self._refs(refs)})
        if deleted != len(refs):
            raise _NotAllHeld
        return set(ids)

    def message_charge(self, charges: Sequence[tuple[int, str, int]], extend_s: float,
                       started: Charged | None = None) -> dict[int, tuple[int, datetime]]:
        def run(cur: Cursor) -> dict[int, tuple[int, datetime]]:
            out: dict[int, tuple[int, datetime]] = {}
            for part in chunks(charges, BATCH_ROWS):
                p = {**self._charges(part), **self._span("extend", extend_s)}
                # Read back even when nothing changed: a retried charge finds its rows charged.
                self._exec(cur, self.Q.message_charge, p)
                out.update((r["id"], (r["attempts"], self._to_time(r["available_at"])))
                           for r in self._all(cur, self.Q.message_charged, p))
            if started is not None:
                started(out)
            return out
        return self.run(run, tx=True)

    def message_extend(self, msg_id: int, lease: str, extend_s: float,
               progress_json: str | None, conn: Any = None) -> datetime | None:
        params = {"id": msg_id, "lease": lease, "progress": progress_json,
                  **self._span("extend", extend_s)}

        def run(cur: Cursor) -> datetime | None:
            self._exec(cur, self.Q.message_extend, params)
            found = self._one(cur, self.Q.message_lease_until, params)
            return self._to_time(found["available_at"]) if found else None
        return self.run(run, conn, tx=True)

    def message_extend_many(self, refs: Sequence[tuple[int, str]], extend_s: float
                    ) -> dict[int, datetime]:
        def run(cur: Cursor) -> dict[int, datetime]:
            out: dict[int, datetime] = {}
            for part in chunks(refs, BATCH_ROWS):
                ids = [r["id"] for r in self._all(cur, self.Q.message_held, self._refs(part))]
                if ids:
                    self._exec(cur, self.Q.message_extend_many,
                               {"ids": self._ids(ids), **self._span("extend", extend_s)})
                    out.update((r["id"], self._to_time(r["available_at"])) for r in self._all(
                        cur, self.Q.message_due_at, {"ids": self._ids(ids)}))
            return out
        return self.run(run, tx=True)

    def message_dead_letter(self, msg_id: int, lease: str, error: str, conn: Any = None) -> bool:
        params = {"id": msg_id, "lease": lease, "error": error}

        def run(cur: Cursor) -> bool:
            # Without the lock, a receive could take the message between the copy and the
            # delete, leaving it both dead and in flight.
            if self._one(cur, self.Q.message_lock_leased, params) is None:
                return False
            self._exec(cur, self.Q.message_dead_letter, params)
            self._exec(cur, self.Q.message_ack_one, params)
            return True
        return self.run(run, conn, tx=True)

    # --- dead letters -----------------------------------------------------------------------

    def dead_requeue(self, topic: str, ids: Sequence[int] | None) -> int:
        def run(cur: Cursor) -> int:
            # Of dead letters sharing a key only the first (by id) can go back: the others
            # would meet it as a live duplicate, so they stay dead, as on the other backends.
            keys: set[str] = set()
            first: list[int] = []
            for r in self._all(cur, self.Q.dead_requeue_ids,
                               {"topic": topic, **self._some_ids(ids)}):
                if r["key"] is not None:
                    if r["key"] in keys:
                        continue
                    keys.add(r["key"])
                first.append(r["id"])
            if not first:
                return 0
            try:
                with self.map_errors():
                    self._exec(cur, self.Q.dead_requeue, {"ids": self._ids(first)})
            except UniqueViolation as exc:  # a send of the same key won the race: try again
                raise TransientError(str(exc), self.where) from exc
            self._exec(cur, self.Q.dead_delete_requeued, {"ids": self._ids(first)})
            return len(first)
        return self.run(run, tx=True)

    # --- group leases (Spark source) ---------------------------------------------------------

    def lease_ack(self, group: GroupLease, retain: bool) -> int:
        def run(cur: Cursor) -> int:
            p = group.params()
            if not retain:
                return self._exec(cur, self.Q.lease_ack, p)
            held = len(self._all(cur, self.Q.lease_lock, p))
            if held:
                self._exec(cur, self.Q.done_insert_lease, p)
                self._exec(cur, self.Q.lease_ack, p)
            return held
        return self.run(run, tx=True)

    # --- staged loads (Spark sink) ------------------------------------------------------------

    def _stage_rows(self, cur: Cursor, job: str, part: int, rows: Sequence[NewMessage]) -> None:
        # PyMySQL sends these as multi-row INSERTs, each within its statement size limit.
        cur.executemany(self.Q.stage_insert, [
            {**self._stage_params(job, part, m), "delay_s": float(m.delay_s)} for m in rows])

    def _publish_rows(self, cur: Cursor, query: str, p: Params, staged: int,
                      on_duplicate: str) -> int:
        n = self._exec(cur, query, p)
        # rowcount counts an updated row twice; inserted rows count 1, dropped duplicates 0
        return staged if on_duplicate == "replace" else n

    # --- health (tableq doctor) ---------------------------------------------------------------

    def health_facts(self) -> dict[str, Any]:
        def one(query: str) -> Row:
            return dict(self._read_one(query) or {})

        def number(value: Any) -> Any:  # DECIMAL from TIMESTAMPDIFF(...) / 1e6
            return float(value) if value is not None else None

        return gather({
            "durability": lambda: one(self.Q.doctor_durability),
            "transactions": lambda: {
                "oldest": [{**r, "age_s": number(r["age_s"])}
                           for r in self._read_all(self.Q.doctor_old_transactions)],
            },
            "cleanup": lambda: {"history_length": one(self.Q.doctor_history_length)
                                .get("history_length")},
            "size": lambda: size_facts(f"`{self.url.database}`.{self.prefix}message",
                                       self._read_one(self.Q.doctor_size)),
            "schema": self._schema_facts,
        })


@functools.lru_cache(maxsize=4096)
def _as_utc(value: datetime) -> datetime:
    """A DATETIME read (UTC by the sessions' time zone) as an aware datetime, cached like
    _parse_datetime."""
    return value.replace(tzinfo=UTC)
