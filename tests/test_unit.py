"""Pure parts, no database: names, URLs, codecs, batch dedupe, the query files' shape."""

from __future__ import annotations

import pathlib
import re

import pytest

import tableq
from tableq.backends._queries import parse_named, split_statements
from tableq.backends.base import NewMessage
from tableq.codecs import EncodedJson, JsonText, KindRegistry, encode_payload, encode_payloads
from tableq.errors import DuplicateMessage, InvalidURL, PayloadInvalid, PayloadTooLarge
from tableq.names import check_topic, check_where
from tableq.queue import dedupe_batch, seconds
from tableq.url import parse_url

BACKENDS_DIR = pathlib.Path(tableq.__file__).parent / "backends"

# The operations every backend names the same way; a backend may add its own helpers.
SHARED_QUERIES = {
    "clock_now", "dead_list", "dead_purge", "dead_requeue", "dead_stats", "done_stats",
    "history_bounds_live", "history_rows_live",
    "history_bounds_dead", "history_bounds_done", "history_delete_dead",
    "history_delete_done", "history_rows_dead", "history_rows_done", "lease_ack",
    "lease_extend", "lease_rows", "load_job_finish", "load_job_open", "load_job_state",
    "message_bury", "message_extend", "message_get", "message_insert", "message_peek",
    "message_purge", "message_release", "message_stats", "message_topics",
    "migration_create", "migration_record", "migration_versions", "stage_delete_job",
    "stage_publish", "stage_publish_replace", "stage_stale_jobs",
}


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_query_files_define_the_shared_names(dialect: str) -> None:
    names = set(parse_named((BACKENDS_DIR / dialect / "queries.sql").read_text()))
    assert SHARED_QUERIES <= names, sorted(SHARED_QUERIES - names)


def test_no_sql_outside_the_backends() -> None:
    src = pathlib.Path(tableq.__file__).parent
    pattern = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
    offenders = [
        str(p.relative_to(src)) for p in src.rglob("*.py")
        if "backends" not in p.parts and pattern.search(p.read_text())
    ]
    assert offenders == []


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
