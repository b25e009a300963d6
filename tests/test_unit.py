"""Pure parts, no database: names, URLs, codecs, batch dedupe, the query files' shape."""

from __future__ import annotations

import pathlib
import re
import sqlite3

import pytest

import tableq
from tableq.backends._queries import parse_named, split_statements
from tableq.backends.base import NewMessage
from tableq.backends.postgres import PostgresBackend
from tableq.codecs import (
    EncodedJson,
    JsonText,
    KindRegistry,
    encode_payload,
    encode_payloads,
    encode_texts,
)
from tableq.errors import DuplicateMessage, InvalidURL, PayloadInvalid, PayloadTooLarge
from tableq.names import check_topic, check_where
from tableq.queue import dedupe_batch, seconds
from tableq.url import URL_PARAMS, parse_url

BACKENDS_DIR = pathlib.Path(tableq.__file__).parent / "backends"

# Query-name parity. Every name in a dialect's queries.sql is either in all three files, or
# listed below with the reason it is not: a shared algorithm only some dialects use, or a
# statement with no counterpart (the database does it another way or not at all). The test
# holds each file to exactly "shared + its listed names", so a new query is added to all
# three dialects, or listed here with its reason.
FAMILY_QUERIES = {
    # The select-then-lease claim, per-key insert and ack-then-archive that MySQL and SQLite
    # share (SqlBackend.claim / insert); PostgreSQL does each in one statement.
    ("mysql", "sqlite"): {
        "message_due", "message_due_where", "message_lease", "message_dead_letter_ids",
        "message_delete_ids", "message_find_key", "message_ack_one", "done_insert",
        "done_insert_lease", "dead_delete_requeued", "stage_insert",
    },
    # Servers, not files: a version check, a migration lock, an idle-transaction limit, UTC
    # sessions, open-transaction facts; a duplicate key ignored by the statement itself (SQLite
    # looks the key up first, under its one write lock).
    ("postgres", "mysql"): {
        "server_version", "migration_lock", "idle_transaction_limit", "session_time_zone",
        "doctor_old_transactions", "message_insert_ignore",
        # a single send as one plain row: PostgreSQL's batch takes arrays, MySQL's INSERT ...
        # SELECT would hold the table's AUTO-INC lock (SQLite's message_insert is one row)
        "message_insert_one",
    },
    # DELETE ... RETURNING: fenced acks and at-most-once receives (MySQL has no RETURNING).
    ("postgres", "sqlite"): {"message_ack", "message_take"},
}
DIALECT_ONLY = {
    "postgres": {
        # one-statement claims (plain, ids-only, filtered), take, ack, archive over arrays
        # (unnest) and RETURNING
        "message_claim", "message_claim_ids", "message_claim_where", "message_take_where",
        "message_ack_retain", "message_find_keys", "lease_ack_retain",
        # a single send over scalars: the batch statements take arrays
        "message_insert_one_ignore", "message_insert_one_replace",
        # and the commonest single send, unkeyed and due now: a plain VALUES row
        "message_insert_due",
        # COPY bulk loads under load parts, async commit, NOTIFY wake-ups
        "message_copy", "message_copy_due", "stage_copy", "stage_async_commit",
        # send_many's unkeyed batches by COPY, with their ids taken from the sequence first
        "message_copy_sent", "message_ids_take",
        "load_part_open", "load_part_publish", "load_part_rows", "load_part_drop",
        "load_notify", "listen",
        # a listener says it waits for topics, so that sends notify only then
        "wake_register", "wake_settled", "wake_unregister",
        # COPY cannot call wake(): the statement after it does
        "wake_topics",
        # a schema per namespace
        "schema_create",
        "doctor_dead_rows", "doctor_prepared_transactions", "doctor_replication_slots",
        "doctor_sees_all_sessions",
        # the backend's own vacuum, paced by churn (autovacuum comes at most once a minute;
        # InnoDB purges on its own; SQLite reuses freed pages)
        "message_vacuum", "message_swept",
        # claims from floors while a snapshot is held (floors.py), the horizon they follow,
        # and sessions planned without bitmap scans
        "message_claim_floor", "message_claim_ids_floor", "horizon", "session_plans",
    },
    "mysql": {
        # no RETURNING: read back what a statement changed, under a row lock
        "message_held", "message_charged", "message_due_at", "message_lease_until",
        "message_lock_leased", "lease_lock", "dead_requeue_ids",
        # a batch ack in one DELETE, rolled back unless every lease was still held (by
        # lease when the refs hold one)
        "message_ack_held", "message_ack_lease",
        # a take reads what a claim's due rows leave out (a claim replaces them)
        "message_taken",
        # the unfiltered claim's rows packed into one JSON text (PyMySQL parses rows in
        # Python), and the session's limit on that text
        "message_due_packed", "session_pack_limit",
        # session settings and the named-lock migration guard
        "session_isolation", "migration_unlock", "doctor_history_length",
    },
    "sqlite": {
        # explicit transactions (BEGIN IMMEDIATE) and per-connection PRAGMAs
        "tx_begin_write", "tx_begin_read", "tx_commit", "tx_rollback",
        "session_journal_wal", "session_synchronous_full", "session_synchronous_normal",
        "session_synchronous_extra",
        # the listener's wake-up: a counter of other connections' commits
        "session_data_version",
        # a batch of text payloads as one JSON parameter (message_insert is one row here),
        # and its last id (the driver gives no batch ids)
        "message_insert_many", "message_insert_payloads", "last_insert_id",
    },
}
DIALECTS = ("sqlite", "postgres", "mysql")


def _query_names(dialect: str) -> set[str]:
    return set(parse_named((BACKENDS_DIR / dialect / "queries.sql").read_text()))


def test_query_names_have_full_parity_but_for_the_listed_ones() -> None:
    names = {d: _query_names(d) for d in DIALECTS}
    shared = names["sqlite"] & names["postgres"] & names["mysql"]
    for dialect in DIALECTS:
        listed = set(DIALECT_ONLY[dialect]).union(
            *(q for family, q in FAMILY_QUERIES.items() if dialect in family))
        assert not listed & shared, (dialect, sorted(listed & shared))  # stale listing
        assert names[dialect] - shared == listed, (
            dialect, "unlisted:", sorted(names[dialect] - shared - listed),
            "listed but missing:", sorted(listed - names[dialect]))


def test_no_sql_is_patched_in_python() -> None:
    """Every statement runs exactly as queries.sql has it: no marker for per-call surgery (no
    /* at all: a receive filter or a batch is a distinct named query over bound parameters),
    and no placeholder but the identifiers filled once at load ({schema} / {p}, and {channel},
    PostgreSQL's LISTEN channel; see _queries.py)."""
    for name in ("sql.py", "_queries.py", *(f"{d}/__init__.py" for d in DIALECTS)):
        code = (BACKENDS_DIR / name).read_text()
        for marker in ("/*", '"PRAGMA', 'f"PRAGMA', "l.*", "with_filter", "with_rows"):
            assert marker not in code, (name, marker)
        # statements reach the driver only as named queries, never as literal strings
        assert not re.search(r"""execute(many)?\(\s*f?["']""", code), name
    for dialect in DIALECTS:
        queries = parse_named((BACKENDS_DIR / dialect / "queries.sql").read_text())
        for name, sql in queries.items():
            assert "/*" not in sql and "*/" not in sql, (dialect, name)
            assert not re.search(r"\{(?!schema\}|p\}|channel\})", sql), (dialect, name)


# Modules whose SQL is advice printed for people to run (tableq doctor), never executed.
ADVICE_ONLY = {"doctor.py"}


def test_no_sql_outside_the_backends() -> None:
    src = pathlib.Path(tableq.__file__).parent
    pattern = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
    offenders = [
        str(p.relative_to(src)) for p in src.rglob("*.py")
        if "backends" not in p.parts and str(p.relative_to(src)) not in ADVICE_ONLY
        and pattern.search(p.read_text())
    ]
    assert offenders == []
    for name in ADVICE_ONLY:
        text = (src / name).read_text()
        assert "execute(" not in text and ".Q." not in text, name


def test_parse_named_and_split_statements() -> None:
    q = parse_named("-- name: a :one\n-- why\nSELECT 1;\n\n-- name: b :exec\nDELETE FROM t;\n")
    assert q == {"a": "SELECT 1", "b": "DELETE FROM t"}
    body = "CREATE TABLE t (a int);\nCREATE FUNCTION f() AS $$\nBEGIN\n  x;\nEND $$;\nSELECT 2;"
    assert len(split_statements(body)) == 3


@pytest.mark.parametrize("topic", ["emails", "a", "orders.eu-west/1", "ünï 🎉", "x" * 200])
def test_valid_topics(topic: str) -> None:
    assert check_topic(topic) == topic


@pytest.mark.parametrize("topic", ["", " a", "a ", "a\tb", "a\nb", "\x00", "\ud800", "é" * 101,
                                   None, 5, "\u202e"])
def test_invalid_topics(topic: object) -> None:
    with pytest.raises(tableq.InvalidName):
        check_topic(topic)


def test_where_grammar() -> None:
    assert check_where({"kind": "k", "user": 7}) == {"kind": "k", "key": None,
                                                     "fields": {"user": 7}}
    assert check_where({"payload": {"kind": "x"}})["fields"] == {"kind": "x"}
    for bad in ({"$.a": 1}, {"a.b": 1}, {"a": {"b": 1}}, [("a", 1)]):
        with pytest.raises(ValueError):
            check_where(bad)
    for name in ("key", "kind"):  # None would match every message: refused, not ignored
        with pytest.raises(tableq.InvalidArgument, match=f"where\\['{name}'\\] is None"):
            check_where({name: None, "user": 7})


@pytest.mark.parametrize("url,dialect,db", [
    ("sqlite:///rel/q.db", "sqlite", "rel/q.db"),
    ("sqlite:////abs/q.db", "sqlite", "/abs/q.db"),
    ("postgresql://u:p%40ss@h:5433/db?schema=s1", "postgres", "db"),
    ("postgres://h/db", "postgres", "db"),
    ("mysql://root@127.0.0.1:3306/test", "mysql", "test"),
    ("mariadb://root@h/test?prefix=app_", "mysql", "test"),
])
def test_urls(url: str, dialect: str, db: str) -> None:
    u = parse_url(url)
    assert (u.dialect, u.database) == (dialect, db)


def test_url_password_is_redacted() -> None:
    u = parse_url("postgresql://u:s3cret@h/db")
    assert u.password == "s3cret" and "s3cret" not in u.redacted


@pytest.mark.parametrize("url", ["", "tableq.db", "oracle://h/db", "sqlite://q.db",
                                 "sqlite:///:memory:", "postgresql://h", "mysql://h:xx/db",
                                 "postgresql://h/db?schema=Bad-Name",
                                 "mysql://h/db?prefix=x;drop"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidURL if "schema" not in url and "prefix" not in url
                       else tableq.InvalidName) as err:
        parse_url(url)
    assert str(err.value)


@pytest.mark.parametrize("url,unknown", [
    ("postgresql://h/db?shema=app", "'shema'"),  # misspelled: the tables would go to tableq
    ("mysql://h/db?schema=app", "'schema'"),  # MySQL has a prefix, not a schema
    ("sqlite:///q.db?prefix=a_&sync=NORMAL", "'sync'"),
    ("postgresql://h/db?password=s3cret&schema=s", "'password'"),
])
def test_unknown_url_parameters_are_refused_with_the_known_ones(url: str, unknown: str) -> None:
    with pytest.raises(InvalidURL) as err:
        parse_url(url)
    text = str(err.value)
    assert f"unknown parameter {unknown}" in text and "s3cret" not in text
    dialect = parse_url(url.split("?")[0]).dialect
    assert "takes " + ", ".join(URL_PARAMS[dialect]) in text


def test_url_connect_timeout() -> None:
    assert parse_url("postgresql://h/db?connect_timeout=3").connect_timeout_s == 3
    assert parse_url("mysql://h/db").connect_timeout_s is None
    for bad in ("0", "x", "1.5", ""):
        with pytest.raises(InvalidURL, match="whole number of seconds"):
            parse_url(f"mysql://h/db?connect_timeout={bad}")
    backend = PostgresBackend(parse_url("postgresql://h/db?connect_timeout=3"), vacuum=False)
    assert backend.connect_kwargs["connect_timeout"] == 3


def test_connect_bad_url_says_what_to_do() -> None:
    with pytest.raises(InvalidURL) as err:
        tableq.connect("redis://localhost/0")
    assert "postgresql://" in str(err.value)


def test_unreachable_server_is_database_unavailable() -> None:
    q = tableq.connect("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    with pytest.raises(tableq.DatabaseUnavailable) as err:
        q.send("t", 1)
    assert "127.0.0.1" in str(err.value) and "running" in str(err.value)
    q2 = tableq.connect("mysql://nobody@127.0.0.1:1/none")
    with pytest.raises(tableq.DatabaseUnavailable):
        q2.stats()


def test_unmigrated_database_says_run_migrate(tmp_path: pathlib.Path) -> None:
    with tableq.connect(f"sqlite:///{tmp_path}/fresh.db") as q:
        with pytest.raises(tableq.SchemaNotMigrated) as err:
            q.send("t", 1)
        assert "tableq migrate" in str(err.value)


def test_sqlite_v4_makes_the_key_index_partial_and_keeps_dedup(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A database made by an earlier release (up to v3) keeps its messages and its dedup when
    # v4 turns the (topic, key) index into a partial one (only keyed rows in it).
    url = f"sqlite:///{tmp_path}/old.db"
    with tableq.connect(url) as q:
        backend = q._backend
        shipped = type(backend)._migration_files
        monkeypatch.setattr(type(backend), "_migration_files",
                            lambda self: [m for m in shipped(self) if m.version <= 3])
        assert q.migrate() == [1, 3]
        first = q.send("t", {"n": 1}, key="k")
        q.send("t", {"n": 2})
        monkeypatch.undo()
        assert q.migrate() == [4]
        again = q.send("t", {"n": 3}, key="k", on_duplicate="ignore")
        assert (again.status, again.id) == ("duplicate", first.id)
        with pytest.raises(tableq.DuplicateMessage):
            q.send("t", {"n": 4}, key="k", on_duplicate="error")
        assert q.send("t", {"n": 5}, key="k", on_duplicate="replace").status == "replaced"
        q.send("t", {"n": 6})
        assert sorted(m.payload["n"] for m in q.peek("t", limit=10)) == [2, 5, 6]
    index = sqlite3.connect(tmp_path / "old.db").execute(
        "SELECT sql FROM sqlite_master WHERE name = 'tableq_message_topic_key'").fetchone()[0]
    assert index.endswith("WHERE key IS NOT NULL")


def test_mysql_datetimes_are_read_by_the_c_parser_and_odd_ones_by_pymysql() -> None:
    from datetime import datetime

    from pymysql.constants import FIELD_TYPE

    from tableq.backends.mysql import CONVERSIONS, _datetime

    assert CONVERSIONS[FIELD_TYPE.DATETIME] is _datetime
    assert _datetime("2026-11-24 10:31:52.123456") == datetime(2026, 11, 24, 10, 31, 52, 123456)
    assert _datetime(b"2026-11-24 10:31:52") == datetime(2026, 11, 24, 10, 31, 52)
    assert _datetime("0000-00-00 00:00:00") == "0000-00-00 00:00:00"  # as PyMySQL leaves it


def test_sqlite_synchronous_from_the_url_or_the_option(tmp_path: pathlib.Path) -> None:
    # ?synchronous= is how a command line (tableq worker --url ...) chooses it; the option
    # wins; a bad value says which values and where they go.
    url = f"sqlite:///{tmp_path}/q.db"
    for full_url, options, expected in [(url, {}, "FULL"),
                                        (url + "?synchronous=normal", {}, "NORMAL"),
                                        (url + "?synchronous=NORMAL", {"synchronous": "EXTRA"},
                                         "EXTRA")]:
        with tableq.connect(full_url, migrate=True, **options) as q:
            q.send("t", 1)
            pragma = q._backend.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
            assert (q._backend.synchronous, pragma) == (expected, {"FULL": 2, "NORMAL": 1,
                                                                   "EXTRA": 3}[expected])
    with pytest.raises(tableq.InvalidArgument, match=r"\?synchronous="):
        tableq.connect(url + "?synchronous=OFF")


def test_encode_payload_limits() -> None:
    assert encode_payload({"a": 1}, 100).json_text == '{"a":1}'
    assert encode_payload(b"ab", 100).data == b"ab"
    with pytest.raises(PayloadTooLarge):
        encode_payload("é" * 60, 100)  # counted in UTF-8 bytes
    with pytest.raises(PayloadInvalid):
        encode_payload(float("inf"), 100)


def test_kind_registry_with_pydantic_like_model() -> None:
    class Model:
        def __init__(self, **kw: object) -> None:
            if "to" not in kw:
                raise ValueError("to is required")
            self.kw = kw

        @classmethod
        def model_validate(cls, v: dict) -> Model:
            return cls(**v)

        def model_dump(self, mode: str) -> dict:
            return dict(self.kw)

    reg = KindRegistry()
    reg.register("email", model=Model)
    assert reg.encode("email", {"to": "x"}, 100).json_text == '{"to":"x"}'
    with pytest.raises(PayloadInvalid):
        reg.encode("email", {}, 100)
    assert isinstance(reg.decode("email", {"to": "x"}), Model)
    loose = KindRegistry(strict=False)
    assert loose.encode("anything", 1, 10).json_text == "1"


def _row(key: str | None, payload: str) -> NewMessage:
    return NewMessage("t", key, None, payload, None, None, 0, 0.0, None)


def test_dedupe_batch_acts_like_sequential_sends() -> None:
    rows = [_row("a", "1"), _row(None, "2"), _row("a", "3"), _row(None, "4")]
    unique, slots = dedupe_batch(rows, "ignore")
    assert [r.json_text for r in unique] == ["1", "2", "4"]
    assert slots == [(0, False), (1, False), (0, True), (2, False)]
    unique, _ = dedupe_batch(rows, "replace")
    assert [r.json_text for r in unique] == ["3", "2", "4"]
    with pytest.raises(DuplicateMessage):
        dedupe_batch(rows, "error")


def test_seconds_parsing() -> None:
    from datetime import timedelta

    assert seconds("d", timedelta(minutes=1), 0) == 60.0
    assert seconds("d", None, 5) == 5
    for bad in (-1, float("inf"), "1", True):
        with pytest.raises(ValueError):
            seconds("d", bad, 0)  # type: ignore[arg-type]


def test_kinds_from_real_pydantic_and_msgspec_models() -> None:
    import msgspec
    import pydantic

    class Email(pydantic.BaseModel):
        to: str

    class Sms(msgspec.Struct):
        number: str

    reg = KindRegistry()
    reg.register("email", model=Email)
    reg.register("sms", model=Sms)
    assert reg.encode("email", Email(to="a@b"), 100).json_text == '{"to":"a@b"}'
    assert reg.encode("sms", {"number": "123"}, 100).json_text == '{"number":"123"}'
    for kind, bad in (("email", {"to": 1}), ("sms", {"number": None})):
        with pytest.raises(PayloadInvalid):
            reg.encode(kind, bad, 100)
    assert reg.decode("sms", {"number": "9"}) == Sms(number="9")


def test_internal_conflicts_are_tableq_errors_with_advice() -> None:
    from tableq.backends.base import TransientError

    err = TransientError("deadlock detected", "postgresql://h/db")
    assert isinstance(err, tableq.DatabaseBusy) and isinstance(err, tableq.TableqError)
    assert "retry" in str(err)


def test_every_error_survives_pickling_with_its_message_and_fields() -> None:
    """Errors cross process boundaries (multiprocessing, concurrent.futures, Spark): each one
    comes back whole, not as a TypeError from its __init__ given the finished message."""
    import pickle

    from tableq import errors
    from tableq.backends.base import TransientError, UniqueViolation
    from tableq.spark.options import OptionError  # Spark ships these to and from executors
    from tableq.spark.sink import ColumnError

    made = [
        errors.InvalidURL("sqlite:///x", "bad"), errors.MissingDriver("pg", "pg", "psycopg"),
        errors.UnsupportedDatabase("MariaDB", "10.1", "10.6"), errors.SchemaNotMigrated("db"),
        errors.SchemaNotMigrated("sqlite:///x.db", no_file="x.db"),
        errors.InvalidName("topic", "a b", "no spaces"), errors.InvalidArgument("bad option"),
        errors.PayloadTooLarge(10, 5), errors.PayloadInvalid("no", "email"),
        errors.UnknownKind("sms", ["email"]), errors.DuplicateMessage("t", "k", 7),
        errors.LeaseLost("t", 3, "ack", [3, 4]), errors.NotFound("message 9"),
        errors.DatabaseUnavailable("pg://h", "refused"), errors.DatabaseBusy("pg://h", "deadlock"),
        errors.DatabaseTimeout("pg://h", "statement timeout", "raise it"),
        errors.LoadIncomplete("job", 5, 2), errors.StorageFull("pg://h", "disk full"),
        errors.ArchiveBusy("tableq.archive-lock", 120.0),
        errors.ArchiveBusy("tableq.archive-lock", 120.0, lost=True),
        errors.AuthenticationFailed("no token"), errors.PermissionDenied("consumer", "send", "t"),
        errors.ServerUnavailable("http://h", "refused"), errors.RemoteError(500, "x", "boom"),
        errors.TableqError("base"), errors.ConfigurationError("c"), errors.PayloadError("p"),
        errors.DatabaseError("d"), errors.AccessError("a"),
        TransientError("deadlock detected", "postgresql://h/db"), UniqueViolation("dup"),
        OptionError("url", "is required"), ColumnError("priority", "must be an integer"),
    ]

    def subclasses(cls: type) -> set[type]:
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    ours = {c for c in subclasses(errors.TableqError) if c.__module__.startswith("tableq.")}
    assert ours <= {type(e) for e in made}, "add the new error class to this test"
    for err in made:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err), err
        assert back.__dict__ == err.__dict__, err


BULK_PAYLOADS = [
    {"a": 1}, [1, "é"], "text", 7, 1.5, None, True, b"\x00raw", {"k": "x" * 60},
    JsonText('{"a": 1}'), JsonText(" [1, 2] "), EncodedJson('{"n":1}'), {"nul": "\u0000"},
    {"nan": float("nan")}, {1, 2}, JsonText("{'a': 1}"), JsonText('{"a": 1} x'), "\ud800",
    {"big": "é" * 40}, EncodedJson('{"s":"' + "y" * 80 + '"}'),
]


@pytest.mark.parametrize("payload", BULK_PAYLOADS, ids=range(len(BULK_PAYLOADS)))
def test_bulk_encoding_gives_what_one_by_one_encoding_gives(payload: object) -> None:
    """encode_payloads' inline fast paths must agree with encode_payload: the same text or
    bytes, or the same error."""
    def one(p: object) -> object:
        try:
            return tuple(encode_payload(p, 64))
        except tableq.TableqError as exc:
            return type(exc)

    def bulk(p: object) -> object:
        try:
            return tuple(encode_payloads([p], 64)[0])
        except tableq.TableqError as exc:
            return type(exc)

    assert bulk(payload) == one(payload)


ENCODED_TEXTS = [
    ['{"n":1}', '{"s":"a"}'], ['{"s":"é"}', "1"], ['{"s":"\\u0000"}'], ['{"s":"\\\\u0000"}'],
    ['{"s":"' + "y" * 80 + '"}', "2"], ['{"s":"\\ud800"}'], ['"a\\u00', '00"'], [],
]


@pytest.mark.parametrize("texts", ENCODED_TEXTS, ids=range(len(ENCODED_TEXTS)))
def test_encoding_texts_gives_what_encoded_json_gives(texts: list[str]) -> None:
    """encode_texts checks a batch of tableq-made JSON texts at once: the same results, or
    the same error, as EncodedJson through encode_payloads."""
    def result(fn: object) -> object:
        try:
            return [tuple(e) for e in fn()]  # type: ignore[operator]
        except tableq.TableqError as exc:
            return type(exc)

    assert result(lambda: encode_texts(texts, 64)) == result(
        lambda: encode_payloads([EncodedJson(t) for t in texts], 64))


COPY_PAYLOADS = [
    [('{"a":1}', None)], [('{"a":"x\\\\y"}', None), ('{\n "b":\t2}\r', None), ('"é"', None)],
    [('{"a":1}', None), (None, b"\x00\x01")], [("raw\0nul", None), ("1", None)], [],
]


@pytest.mark.parametrize("payloads", COPY_PAYLOADS, ids=range(len(COPY_PAYLOADS)))
def test_copy_text_frames_a_block_as_row_by_row(payloads: list[tuple[str | None, bytes | None]],
                                               ) -> None:
    """copy_text escapes and frames JSON texts as one block: the same COPY text as framing
    each row on its own, escapes (backslash, tab, newline, carriage return) included."""
    from tableq.backends.base import NewMessage
    from tableq.backends.postgres import _copy_field, _copy_payload, copy_text

    t = NewMessage(topic="a\tb", key=None, kind=None, json_text=None, data=None,
                   headers_json='{"h":"x\\\\y"}', priority=3, delay_s=0.0, at=None)
    head = f"{_copy_field(t.topic)}\t{_copy_field(t.kind)}\t"
    tail = f"\t{_copy_field(t.headers_json)}\t{t.priority}\t7\n"
    assert copy_text(7, t, payloads) == "".join(
        head + _copy_payload(text, data) + tail for text, data in payloads)


def test_no_assert_inside_worker_handlers() -> None:
    """The worker catches what a handler raises (it is a failed delivery), so an assert in a
    handler cannot fail a test. Handlers record what they saw; the test body asserts."""
    import ast

    tests = pathlib.Path(__file__).parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            handler = any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                          and d.func.attr == "handler" for d in node.decorator_list)
            if handler and any(isinstance(n, ast.Assert) for n in ast.walk(node)):
                offenders.append(f"{path.relative_to(tests)}:{node.lineno} {node.name}")
    assert offenders == []


@pytest.mark.parametrize("code", [1213, 1205, 1467])
def test_mysql_lock_conflicts_are_retried_whole(code: int) -> None:
    """A deadlock, a lock-wait timeout, and a batch insert that lost the AUTO-INC lock (1467,
    seen under contention in M1) are transient: the backend retries the whole transaction."""
    import pymysql

    from tableq.backends.base import TransientError
    from tableq.backends.mysql.errors import map_errors

    with pytest.raises(TransientError), map_errors("mysql://test"):
        raise pymysql.err.OperationalError(code, "conflict")


def test_postgres_errors_map_through_the_one_boundary_keeping_the_driver_error() -> None:
    """Each kind of psycopg error leaves the boundary as its tableq error, caused by the
    driver's; an empty text is named, not an IndexError; other exceptions pass as they are."""
    import psycopg
    from psycopg import errors as pgerr

    from tableq.backends.base import TransientError
    from tableq.backends.postgres.errors import map_errors

    cases = [(pgerr.DeadlockDetected("d"), TransientError),
             (pgerr.UndefinedTable("t"), tableq.SchemaNotMigrated),
             (pgerr.QueryCanceled(""), tableq.DatabaseTimeout),
             (psycopg.OperationalError(" "), tableq.DatabaseUnavailable),
             (psycopg.InterfaceError("i"), tableq.DatabaseError)]
    for raised, mapped in cases:
        with pytest.raises(mapped) as got, map_errors("postgresql://test"):
            raise raised
        assert got.value.__cause__ is raised
    with pytest.raises(tableq.DatabaseUnavailable, match="the server gave no reason"), \
            map_errors("postgresql://test"):
        raise psycopg.OperationalError("")
    with pytest.raises(KeyError), map_errors("postgresql://test"):
        raise KeyError(0)


def test_stats_sample_plan() -> None:
    from tableq.stats import id_sample, needs_exact, scaled, topic_estimate
    assert id_sample(None, None) is None  # empty table
    assert id_sample(1, 200_000) is None  # small span: count every row
    s = id_sample(1, 10_000_000)
    assert s is not None and (s.stride, s.width, s.scale) == (100_000, 200, 500.0)
    assert len(range(s.lo, s.hi + 1, s.stride)) == 100
    assert scaled({"ready": 10, "scheduled": None, "in_flight": 1}, s) == {
        "ready": 5000, "scheduled": 0, "in_flight": 500}
    assert needs_exact({"ready": 19_999}, 50)
    assert not needs_exact({"ready": 15_000, "in_flight": 5_000}, 10)
    assert needs_exact({"ready": 100_000}, 1)  # one burst in one window: not to be scaled
    heads = [{"oldest_ready_age": 3.5, "scheduled": 4, "in_flight": 0},
             {"oldest_ready_age": None, "scheduled": 2, "in_flight": 20_000}]
    est = topic_estimate({"ready": 5000, "scheduled": 500, "in_flight": 700}, heads)
    # scheduled counted (every priority under the cap); in_flight hit the cap: the sample's
    assert est == {"ready": 5000, "scheduled": 6, "in_flight": 700, "estimated": True,
                   "oldest_ready_age": 3.5}
    assert topic_estimate({"ready": 1, "scheduled": 0, "in_flight": 0}, [])[
        "oldest_ready_age"] is None


def test_with_owner_copies_every_field_and_sets_only_the_owner() -> None:
    from dataclasses import fields
    from datetime import UTC, datetime

    from tableq.message import Message, with_owner

    now = datetime.now(UTC)
    values = dict(id=7, topic="t", key="k", kind="kd", payload={"a": [1]}, headers={"h": "v"},
                  priority=3, attempts=2, created_at=now, available_at=now,
                  first_available_at=now, lease="l", last_error="e", progress={"p": 1},
                  received_at=now)
    msg: Message = Message(**values, _queue=None)  # type: ignore[arg-type]
    owner = object()
    handed = with_owner(msg, owner)  # type: ignore[arg-type]
    assert handed._queue is owner and msg._queue is None and handed is not msg
    assert {f.name for f in fields(Message)} - {"_queue"} == set(values) | {"_transaction"}
    for name in values:
        assert getattr(handed, name) is getattr(msg, name)
    assert handed == msg and handed._transaction is None


def test_a_queue_builds_messages_field_by_field_from_rows(tmp_path: pathlib.Path) -> None:
    """Queue._message passes Message's fields by position: each row column lands in the
    field of its own name."""
    from dataclasses import fields
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    row = dict(id=7, topic="t", key="k", kind="kd", payload={"a": [1]}, headers={"h": "v"},
               priority=3, attempts=2, created_at=now, available_at=now + timedelta(1),
               first_available_at=now + timedelta(2), lease="l", last_error="e",
               progress={"p": 1}, received_at=now + timedelta(3))
    q = tableq.connect(f"sqlite:///{tmp_path / 'q.db'}", migrate=True)
    try:
        tx = object()
        msg = q._message(dict(row), tx)
        assert {f.name for f in fields(msg)} == set(row) | {"_queue", "_transaction"}
        for name, value in row.items():
            assert getattr(msg, name) is value, name
        assert msg._queue is q and msg._transaction is tx
        bare = q._message({k: row[k] for k in ("id", "topic", "payload", "priority",
                                                "attempts", "created_at", "available_at",
                                                "first_available_at")})
        assert (bare.key, bare.kind, bare.headers, bare.lease, bare.progress) == (
            None, None, {}, None, None)
    finally:
        q.close()


def test_batch_sends_are_cut_into_statements_by_rows_and_size() -> None:
    """A send_many's rows go out in runs of at most max_items rows and max_chars characters,
    in order; a row bigger than max_chars goes alone (MariaDB's packet, SQLite's longest
    string)."""
    from tableq.backends.base import ROW_CHARS, row_chars, spans

    def row(text: str | None = None, data: bytes | None = None) -> NewMessage:
        return NewMessage("t", None, None, text, data, None, 0, 0.0, None)

    assert row_chars(row("abc")) == ROW_CHARS + 3
    assert row_chars(row(data=b"ab")) == ROW_CHARS + 4  # as hex
    assert list(spans([1] * 1005, 1000, 10**9)) == [(0, 1000), (1000, 1005)]
    assert list(spans([1, 1, 1], 1, 10**9)) == [(0, 1), (1, 2), (2, 3)]
    assert list(spans([900, 1400, 5000, 1, 1], 1000, 2000)) == [(0, 1), (1, 2), (2, 3), (3, 5)]
    assert list(spans([600, 600, 600, 600], 1000, 2000)) == [(0, 3), (3, 4)]
    assert list(spans([], 1000, 2000)) == []
