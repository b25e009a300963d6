"""Backend conformance: every method of the Backend seam, the same expectations on every
dialect. Values go in as the queue layer makes them (NewMessage, ClaimSpec, GroupLease) and
come back as plain rows; the test clock makes every due time exact."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from tableq.backends.base import (
    Backend,
    ClaimSpec,
    Filter,
    GroupLease,
    NewMessage,
    PayloadBatch,
)
from tableq.errors import DuplicateMessage, InvalidArgument, LoadIncomplete
from tableq.names import ANY_TOPIC
from tableq.tokens import NewToken

T = "orders"


def msg(payload: object = None, *, topic: str = T, key: str | None = None,
        kind: str | None = None, priority: int = 0, delay_s: float = 0.0,
        at: datetime | None = None, data: bytes | None = None,
        headers: dict[str, str] | None = None) -> NewMessage:
    text = None if data is not None else json.dumps({"n": 0} if payload is None else payload)
    return NewMessage(topic, key, kind, text, data, json.dumps(headers) if headers else None,
                      priority, delay_s, at)


def spec(n: int = 10, *, topic: str = T, vt: float = 30.0, max_attempts: int = 5,
         **more: object) -> ClaimSpec:
    return ClaimSpec(topic, n, vt, max_attempts, **more)  # type: ignore[arg-type]


def refs(rows: list[dict[str, object]]) -> list[tuple[int, str]]:
    return [(int(r["id"]), str(r["lease"])) for r in rows]  # type: ignore[call-overload]


# --- lifecycle -----------------------------------------------------------------------------


def test_migrations_and_schema_version(backend: Backend) -> None:
    known = backend.migrations_known()
    assert known and backend.migrations_applied() == known
    assert backend.schema_version() == max(known)
    assert backend.migrate() == []  # idempotent


def test_clock_is_aware_utc_and_the_test_clock_moves_exactly(backend: Backend) -> None:
    before = backend.now()
    assert before.tzinfo is not None and before.utcoffset() == timedelta(0)
    assert backend.now() == before  # a test clock stands still
    backend.advance_clock(90)
    assert backend.now() - before == timedelta(seconds=90)


def test_check_connection_and_transaction(backend: Backend) -> None:
    with pytest.raises(InvalidArgument):
        backend.check_connection(object())
    with backend.transaction() as conn:
        backend.check_connection(conn)
        backend.message_insert([msg({"n": 1})], "error", conn)
    with pytest.raises(RuntimeError), backend.transaction() as conn:
        backend.message_insert([msg({"n": 2})], "error", conn)
        raise RuntimeError("roll back")
    assert [r["payload"] for r in backend.message_peek(T, 10)] == [{"n": 1}]


def test_listener_is_none_or_hears_a_send(backend: Backend) -> None:
    listener = backend.listener()
    if listener is None:
        return  # MySQL/MariaDB: workers poll
    try:
        assert listener.wait(0.01) == []
        backend.message_insert([msg()], "error")
        assert listener.wait(5) in ([T], [ANY_TOPIC])  # NOTIFY names it; data_version cannot
        assert listener.wait(0.01) == []
    finally:
        listener.close()


# --- sending and looking -------------------------------------------------------------------


def test_insert_plain_rows_keep_their_order(backend: Backend) -> None:
    got = backend.message_insert([msg({"n": i}) for i in range(5)], "error")
    ids = [i for i, _ in got]
    assert [s for _, s in got] == ["sent"] * 5 and ids == sorted(ids) and len(set(ids)) == 5
    assert [backend.message_get(i)["payload"] for i in ids] == [{"n": i} for i in range(5)]  # type: ignore[index]
    assert backend.message_get(max(ids) + 1000) is None


@pytest.mark.parametrize("with_bytes", [True, False])
def test_insert_batch_keeps_every_field_and_its_order(backend: Backend, with_bytes: bool) -> None:
    """One batch mixing every kind of row: ids come back in order, and each row holds what
    was sent (text with quotes and unicode, bytes, headers, priority, at and delay). Without
    bytes, SQLite inserts the run in one statement over a JSON parameter."""
    now = backend.now()
    at = (now + timedelta(seconds=5)).replace(microsecond=123456)
    batch = [msg({"s": "a'\"\\ ü🎉\n\\u0000\t", "i": i}, kind="k" if i % 2 else None, priority=i,
                 headers={"h": str(i)} if i % 3 else None) for i in range(1200)]
    batch += [msg(data=b"\x00\xff\"'raw") if with_bytes else msg([]), msg({"later": 1}, at=at),
              msg({"delayed": 1}, delay_s=7.5), msg({"k": 1}, key="kk")]
    got = backend.message_insert(batch, "error")
    ids = [i for i, _ in got]
    assert len(set(ids)) == len(batch) and ids == sorted(ids)
    rows = [backend.message_get(i) for i in ids]
    for m, row in zip(batch, rows, strict=True):
        assert row is not None
        if m.data is not None:
            assert row["payload"] == m.data
        else:
            assert row["payload"] == json.loads(m.json_text)  # type: ignore[arg-type]
        assert (row["kind"], row["priority"], row["key"]) == (m.kind, m.priority, m.key)
        assert row["headers"] == (json.loads(m.headers_json) if m.headers_json else {})
    assert rows[-3]["available_at"] == at  # type: ignore[index]
    assert rows[-2]["available_at"] == now + timedelta(seconds=7.5)  # type: ignore[index]


@pytest.mark.parametrize("template", [
    msg(), msg(kind="k", priority=-3, headers={"h": "ü"}), msg(delay_s=7.5),
    msg(at=datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC))])
def test_insert_payload_batch_keeps_its_template_and_order(backend: Backend,
                                                           template: NewMessage) -> None:
    """send_many's bare payloads travel as a PayloadBatch: one template, the payloads in
    order (SQLite sends only the payload texts, as one JSON array)."""
    odd = ["a'\"\\ ü🎉\n", "\\u0000 \\N \t", "", "{\"nested\": [1, 2.5e-7, null]}"]
    payloads: list[tuple[str | None, bytes | None]] = [
        (json.dumps({"i": i, "s": odd[i % len(odd)]}), None) for i in range(700)]
    now = backend.now()
    got = backend.message_insert(PayloadBatch(template, payloads), "ignore")
    ids = [i for i, _ in got]
    assert [s for _, s in got] == ["sent"] * 700 and ids == sorted(ids) and len(set(ids)) == 700
    for i, (text, _) in zip(ids, payloads, strict=True):
        row = backend.message_get(i)
        assert row is not None and row["payload"] == json.loads(text)  # type: ignore[arg-type]
        assert (row["topic"], row["kind"], row["priority"], row["key"]) == (
            template.topic, template.kind, template.priority, None)
        assert row["headers"] == (json.loads(template.headers_json)
                                  if template.headers_json else {})
        due = template.at or now + timedelta(seconds=template.delay_s)
        assert abs((row["available_at"] - due).total_seconds()) < (0.001 if template.at else 5)
    # one bytes payload: the row-by-row insert, same result
    mixed = backend.message_insert(PayloadBatch(template, [("1", None), (None, b"\x00b")]), "error")
    assert [backend.message_get(i)["payload"] for i, _ in mixed] == [1, b"\x00b"]  # type: ignore[index]


def test_insert_keyed_duplicate_policies(backend: Backend) -> None:
    [(first, status)] = backend.message_insert([msg({"v": 1}, key="k")], "error")
    assert status == "sent"
    assert backend.message_insert([msg({"v": 2}, key="k")], "ignore") == [(first, "duplicate")]
    assert backend.message_get(first)["payload"] == {"v": 1}  # type: ignore[index]
    assert backend.message_insert([msg({"v": 3}, key="k")], "replace") == [(first, "replaced")]
    assert backend.message_get(first)["payload"] == {"v": 3}  # type: ignore[index]
    with pytest.raises(DuplicateMessage) as err:
        backend.message_insert([msg({"v": 4}, key="k")], "error")
    assert err.value.existing_id == first
    mixed = backend.message_insert([msg(), msg(key="k"), msg(key="other"), msg()], "ignore")
    assert [s for _, s in mixed] == ["sent", "duplicate", "sent", "sent"]
    assert mixed[1][0] == first


def test_rows_carry_every_field(backend: Backend) -> None:
    [(i, _)] = backend.message_insert([msg({"a": [1, 2]}, kind="k1", priority=3,
                                   headers={"h": "v"})], "error")
    [(j, _)] = backend.message_insert([msg(data=b"\x00\xffraw")], "error")
    row = backend.message_get(i)
    assert row is not None
    assert (row["topic"], row["kind"], row["priority"], row["headers"], row["payload"]) == (
        T, "k1", 3, {"h": "v"}, {"a": [1, 2]})
    assert row["attempts"] == 0 and row["lease"] is None
    assert row["created_at"] == row["available_at"] == backend.now()
    assert backend.message_get(j)["payload"] == b"\x00\xffraw"  # type: ignore[index]


def test_peek_topics_stats_purge(backend: Backend) -> None:
    backend.message_insert([msg({"n": 1}), msg({"n": 2}, priority=5), msg(topic="other")], "error")
    backend.message_insert([msg({"n": 3}, delay_s=60)], "error")
    assert [r["payload"]["n"] for r in backend.message_peek(T, 10)] == [2, 1, 3]
    assert backend.topic_list() == ["orders", "other"]
    stats = {s["topic"]: s for s in backend.topic_stats(None)}
    assert (stats[T]["ready"], stats[T]["scheduled"], stats[T]["in_flight"]) == (2, 1, 0)
    assert [s["topic"] for s in backend.topic_stats("other")] == ["other"]
    assert backend.topic_purge(T) == 3 and backend.message_peek(T, 10) == []


def test_delay_and_at_are_database_time(backend: Backend) -> None:
    now = backend.now()
    # `at` makes a round trip through Python (microseconds), so it sits clear of the step.
    backend.message_insert([msg({"n": 1}, delay_s=10),
                            msg({"n": 2}, at=now + timedelta(seconds=4.5))], "error")
    assert backend.message_claim(spec()).rows == []
    backend.advance_clock(5)
    assert [r["payload"]["n"] for r in backend.message_claim(spec()).rows] == [2]
    backend.advance_clock(5)
    assert [r["payload"]["n"] for r in backend.message_claim(spec()).rows] == [1]


# --- receiving and settling ----------------------------------------------------------------


def test_claim_leases_in_delivery_order_and_ack_fences(backend: Backend) -> None:
    backend.message_insert([msg({"n": i}, priority=i % 2) for i in range(4)], "error")
    got = backend.message_claim(spec(3))
    assert [r["payload"]["n"] for r in got.rows] == [1, 3, 0] and got.dead_lettered == 0
    now = backend.now()
    for r in got.rows:
        assert r["attempts"] == 1 and r["charged"] is True and r["lease"]
        assert r["received_at"] == now and r["available_at"] == now + timedelta(seconds=30)
    assert backend.message_claim(spec(3)).rows[0]["payload"] == {"n": 2}  # the rest is leased
    first = got.rows[0]
    assert backend.message_ack([(first["id"], "stale")], retain=False) == set()
    # A batch with a stale ref acks only the held ones (MySQL's one-statement ack rolls back)
    second = got.rows[1]
    assert backend.message_ack([(first["id"], "stale"), (second["id"], second["lease"])],
                               retain=False) == {second["id"]}
    assert backend.message_ack(refs(got.rows), retain=False) == {first["id"], got.rows[2]["id"]}
    assert backend.message_ack(refs(got.rows), retain=False) == set()
    assert backend.done_match(refs(got.rows)) == set()


def test_ack_retain_archives_and_done_match_finds_it(backend: Backend) -> None:
    backend.message_insert([msg(), msg()], "error")
    rows = backend.message_claim(spec()).rows
    assert backend.message_ack(refs(rows), retain=True) == {r["id"] for r in rows}
    assert backend.done_match(refs(rows)) == {r["id"] for r in rows}
    assert backend.done_match([(rows[0]["id"], "other")]) == set()
    assert {s["topic"]: s["done"] for s in backend.topic_stats(T)} == {T: 2}


def test_claim_filter_binds_kind_key_and_json_fields(backend: Backend) -> None:
    backend.message_insert([msg({"n": 1, "s": "a"}, kind="x"), msg({"n": 2, "s": "b"}, kind="y"),
                    msg({"n": 3, "s": "a'; --", "b": True}, key="k3"),
                    msg({"n": None})], "error")

    def pick(where: Filter) -> list[object]:
        rows = backend.message_claim(spec(where=where)).rows
        backend.message_ack(refs(rows), retain=False)
        return sorted(str(r["payload"]["n"]) for r in rows)

    assert pick(Filter("y", None, ())) == ["2"]
    assert pick(Filter(None, "k3", ())) == ["3"]
    assert pick(Filter(None, None, (("n", None),))) == ["None"]
    assert pick(Filter(None, None, (("s", "a"),))) == ["1"]


def test_claim_filter_compares_json_fields_by_type_and_value(backend: Backend) -> None:
    """The receive filter's exact semantics on every dialect: a field matches by JSON type
    and value (1 == 1.0; "1" != 1; true != 1; null only when present as null); a missing
    field, a non-object payload and a bytes payload match no field; quotes, unicode,
    case and trailing spaces are compared exactly; several fields must all match."""
    payloads: list[object] = [
        {"v": 1, "t": "int"}, {"v": 1.0, "t": "float"}, {"v": "1", "t": "str1"},
        {"v": True, "t": "true"}, {"v": False, "t": "false"}, {"v": None, "t": "null"},
        {"t": "missing"}, {"v": "a'\"; --ü🎉", "t": "quotes"}, {"v": "A", "t": "upper"},
        {"v": "a", "t": "lower"}, {"v": "a ", "t": "trailing"}, {"v": [1], "t": "list"},
        {"v": {"x": 1}, "t": "obj"}, {"v": 0, "t": "zero"}, {"v": 2.5, "u": 7, "t": "two"},
        [1, 2], "v", 7,
    ]
    backend.message_insert([msg(p) for p in payloads] + [msg(data=b"\x00{\"v\": 1}")], "error")
    everything = [r["id"] for r in backend.message_peek(T, 100)]

    def pick(*fields: tuple[str, object]) -> list[str]:
        rows = backend.message_claim(spec(100, where=Filter(None, None, fields))).rows
        for r in rows:  # put them back: each case sees every message
            backend.message_release(r["id"], r["lease"], 0, None, False)
        return sorted(r["payload"]["t"] for r in rows)

    assert pick(("v", 1)) == ["float", "int"]
    assert pick(("v", 1.0)) == ["float", "int"]
    assert pick(("v", "1")) == ["str1"]
    assert pick(("v", True)) == ["true"]
    assert pick(("v", False)) == ["false"]
    assert pick(("v", 0)) == ["zero"]
    assert pick(("v", None)) == ["null"]
    assert pick(("v", "a'\"; --ü🎉")) == ["quotes"]
    assert pick(("v", "a")) == ["lower"]
    assert pick(("v", "A")) == ["upper"]
    assert pick(("v", "a ")) == ["trailing"]  # no padding: "a" and "a " differ
    assert pick(("v", 2.5), ("u", 7)) == ["two"]
    assert pick(("v", 2.5), ("u", 8)) == []
    assert pick(("w", None)) == []
    assert pick(("t", "missing"), ("v", None)) == []
    everyone = backend.message_claim(spec(100, where=Filter(None, None, ()))).rows
    assert len(everyone) == len(everything)


def test_release_with_and_without_penalty(backend: Backend) -> None:
    backend.message_insert([msg()], "error")
    [row] = backend.message_claim(spec()).rows
    assert backend.message_release(row["id"], "stale", 0, None, True) is False
    assert backend.message_release(row["id"], row["lease"], 10, "boom", False) is True
    assert backend.message_claim(spec()).rows == []
    backend.advance_clock(10)
    [again] = backend.message_claim(spec()).rows
    assert again["attempts"] == 1  # refunded, then charged again
    assert backend.message_release(again["id"], again["lease"], 0, None, True) is True
    assert backend.message_claim(spec()).rows[0]["attempts"] == 2


def test_spent_messages_are_buried_at_claim(backend: Backend) -> None:
    backend.message_insert([msg({"n": 1}), msg({"n": 2})], "error")
    rows = backend.message_claim(spec(1, max_attempts=1)).rows
    backend.message_release(rows[0]["id"], rows[0]["lease"], 0, "failed", True)
    got = backend.message_claim(spec(5, max_attempts=1))
    assert got.dead_lettered == 1 and [r["payload"]["n"] for r in got.rows] == [2]
    [dead] = backend.dead_list(T, 10)
    assert dead["id"] == rows[0]["id"] and dead["error"] == "failed"


def test_deferred_charge_and_extensions(backend: Backend) -> None:
    backend.message_insert([msg({"n": i}) for i in range(3)], "error")
    got = backend.message_claim(spec(3, charge=1)).rows
    assert [(r["attempts"], r["charged"]) for r in got] == [(1, True), (0, False), (0, False)]
    rest = [(i, lease, 0) for i, lease in refs(got[1:])]
    backend.advance_clock(1)
    now = backend.now()
    charged = backend.message_charge(rest + [(got[0]["id"], "stale", 0)], 60)
    assert charged == {i: (1, now + timedelta(seconds=60)) for i, _, _ in rest}
    # A charge sent again (its COMMIT's reply was lost) counts once.
    again = backend.message_charge(rest, 60)
    assert {i: attempts for i, (attempts, _) in again.items()} == {i: 1 for i, _, _ in rest}
    assert [backend.message_get(i)["attempts"] for i, _, _ in rest] == [1, 1]  # type: ignore[index]
    assert backend.message_extend(got[0]["id"], got[0]["lease"], 45, json.dumps({"p": 1})) == (
        now + timedelta(seconds=45))
    assert backend.message_get(got[0]["id"])["progress"] == {"p": 1}  # type: ignore[index]
    assert backend.message_extend(got[0]["id"], "stale", 45, None) is None
    assert backend.message_extend_many(refs(got) + [(got[0]["id"], "stale")], 20) == {
        r["id"]: now + timedelta(seconds=20) for r in got}


class Died(Exception):
    pass


def test_a_charge_that_records_a_start_commits_after_it(backend: Backend, db_url: str) -> None:
    # The worker records a last attempt's start inside its charge (lane.py): started() sees
    # the charge's result before the COMMIT, so a caller that dies before it returns has
    # charged nothing, neither by an exception nor killed (SIGKILL) in a real process.
    backend.message_insert([msg({"n": 0})], "error")
    [row] = backend.message_claim(spec(1, charge=0)).rows
    ref = [(row["id"], row["lease"], 0)]
    seen: list[dict[int, tuple[int, datetime]]] = []

    def die(done: dict[int, tuple[int, datetime]]) -> None:
        seen.append(dict(done))
        raise Died

    with pytest.raises(Died):
        backend.message_charge(ref, 60, started=die)
    assert [{i: a for i, (a, _) in d.items()} for d in seen] == [{row["id"]: 1}]
    assert backend.message_get(row["id"])["attempts"] == 0  # type: ignore[index]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_CHARGE, db_url, json.dumps(ref)],
        capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stdout == "charged, not committed\n"
    assert backend.message_get(row["id"])["attempts"] == 0  # type: ignore[index]
    assert backend.message_charge(ref, 60, started=seen.append)[row["id"]][0] == 1
    assert backend.message_get(row["id"])["attempts"] == 1  # type: ignore[index]


KILLED_MID_CHARGE = """
import json, os, signal, sys
from tableq.connect import open_backend
from tableq.url import parse_url

def killed(done):
    print("charged, not committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

b = open_backend(parse_url(sys.argv[1]), test_clock=True)
b.message_charge([tuple(r) for r in json.loads(sys.argv[2])], 60, started=killed)
"""


def test_ids_only_claims_and_group_leases(backend: Backend) -> None:
    ids = [i for i, _ in backend.message_insert([msg({"n": i}) for i in range(6)], "error")]
    got = backend.message_claim(spec(4, lease="L1", ids_only=True))
    assert got.rows == [{"id": i} for i in ids[:4]]
    group = GroupLease(T, "L1", min(ids), max(ids))
    assert sorted(r["id"] for r in backend.lease_rows(group)) == ids[:4]
    half = GroupLease(T, "L1", min(ids), max(ids), k=0, n=2)
    assert all(r["id"] % 2 == 0 for r in backend.lease_rows(half))
    assert backend.lease_extend(group, 120) == 4
    assert backend.message_get(ids[0])["available_at"] == backend.now() + timedelta(seconds=120)  # type: ignore[index]
    assert backend.lease_ack(GroupLease(T, "other"), retain=True) == 0
    assert backend.lease_ack(group, retain=True) == 4
    assert backend.done_match([(i, "L1") for i in ids]) == set(ids[:4])
    assert [r["id"] for r in backend.message_peek(T, 10)] == ids[4:]


def test_claim_delete_and_bury_taken(backend: Backend) -> None:
    backend.message_insert([msg({"n": 1}), msg({"n": 2}, priority=1)], "error")
    got = backend.message_take(spec(5))
    assert [r["payload"]["n"] for r in got.rows] == [2, 1]
    assert all(r["attempts"] == 1 for r in got.rows) and backend.message_peek(T, 10) == []
    # the rows as they were: due times, never received, no lease
    assert all(r["available_at"] == r["created_at"] == r["first_available_at"]
               and r["received_at"] is None and r["lease"] is None for r in got.rows)
    backend.message_dead_letter_taken(got.rows[0], "handler failed")
    [dead] = backend.dead_list(T, 10)
    assert (dead["id"], dead["payload"], dead["error"]) == (
        got.rows[0]["id"], {"n": 2}, "handler failed")


# --- dead letters --------------------------------------------------------------------------


def test_bury_requeue_and_purge_dead_letters(backend: Backend) -> None:
    backend.message_insert([msg({"n": 1}, key="a"), msg({"n": 2}), msg({"n": 3})], "error")
    rows = backend.message_claim(spec()).rows
    assert backend.message_dead_letter(rows[0]["id"], "stale", "x") is False
    for r in rows:
        assert backend.message_dead_letter(r["id"], r["lease"], f"bad {r['payload']['n']}") is True
    assert [d["error"] for d in backend.dead_list(T, 10)] == ["bad 1", "bad 2", "bad 3"]
    assert backend.topic_stats(T)[0]["dead"] == 3
    backend.message_insert([msg({"n": 9}, key="a")], "error")  # the key is live again; dead stays
    assert backend.dead_requeue(T, [rows[0]["id"], rows[1]["id"]]) == 1
    assert backend.message_get(rows[1]["id"])["attempts"] == 0  # type: ignore[index]
    assert backend.dead_purge(T, [rows[2]["id"]]) == 1
    assert backend.dead_purge(T, []) == 0
    assert backend.dead_purge(T, None) == 1
    assert backend.dead_list(T, 10) == []
    assert backend.dead_requeue(T, None) == 0


# --- staged loads --------------------------------------------------------------------------


def test_stage_publish_discard_and_cleanup(backend: Backend) -> None:
    assert backend.stage_job_state("j1") is None
    assert backend.stage_write("j1", 0, [msg({"n": 1}), msg({"n": 2}, key="k")]) == 2
    batch = PayloadBatch(msg(), [(json.dumps({"n": 3}), None), (None, b"\x01")])
    assert backend.stage_write("j1", 1, batch) == 2
    assert backend.stage_write("j1", 2, [msg({"n": 4})]) == 1
    assert backend.stage_job_state("j1") == "open" and backend.message_peek(T, 10) == []
    with pytest.raises(LoadIncomplete):
        backend.stage_publish("j1", [0, 1], "ignore", expected=5)
    assert backend.stage_publish("j1", [0, 1], "ignore", expected=4) == 4
    assert backend.stage_job_state("j1") == "committed"
    assert sorted(str(r["payload"]) for r in backend.message_peek(T, 10)) == sorted(
        ["{'n': 1}", "{'n': 2}", "{'n': 3}", "b'\\x01'"])
    assert backend.stage_publish("j1", [0, 1], "ignore") is None  # once only
    assert backend.stage_write("j1", 3, [msg()]) == 0  # a late task of a committed load

    backend.stage_write("j2", 0, [msg()])
    assert backend.stage_discard("j2") >= 1 and backend.stage_job_state("j2") == "aborted"
    backend.stage_write("j3", 0, [msg()])
    assert backend.stage_cleanup(3600) == 0
    backend.advance_clock(3601)
    assert backend.stage_cleanup(3600) >= 1 and backend.stage_job_state("j3") == "aborted"


def test_publish_replace_takes_the_staged_row(backend: Backend) -> None:
    [(live, _)] = backend.message_insert([msg({"v": 1}, key="k")], "error")
    backend.stage_write("j", 0, [msg({"v": 2}, key="k"), msg({"v": 3}, key="new")])
    assert backend.stage_publish("j", [0], "replace") == 2
    assert backend.message_get(live)["payload"] == {"v": 2}  # type: ignore[index]


# --- history -------------------------------------------------------------------------------


def test_history_bounds_rows_and_delete(backend: Backend) -> None:
    assert backend.history_bounds("dead", None) is None
    ids = [i for i, _ in backend.message_insert([msg({"n": i}) for i in range(3)], "error")]
    assert backend.history_bounds("live", T) == (min(ids), max(ids))
    assert [r["id"] for r in backend.history_rows("live", T, min(ids), max(ids), None)] == ids
    rows = backend.message_claim(spec()).rows
    backend.message_ack(refs(rows[:2]), retain=True)
    backend.message_dead_letter(rows[2]["id"], rows[2]["lease"], "x")
    assert backend.history_bounds("done", None) == (ids[0], ids[1])
    assert backend.history_bounds("dead", "other") is None
    done = backend.history_rows("done", T, ids[0], ids[1], None)
    assert [r["payload"] for r in done] == [{"n": 0}, {"n": 1}]
    # `before` is exclusive; SQLite's float seconds keep times to about a microsecond, so
    # the bounds sit half a second either side.
    half = timedelta(seconds=0.5)
    assert backend.history_rows("done", T, ids[0], ids[1], backend.now() - half) == []
    backend.advance_clock(1)
    assert len(backend.history_rows("dead", None, 0, 2**62, backend.now() - half)) == 1
    # With `before`, a row that died (or was acked) at or after it stays: one requeued and
    # dead again after the archive read it is not purged unarchived.
    assert backend.history_delete("done", [ids[0]], backend.now() - 2 * half - half) == 0
    assert backend.history_delete("done", [ids[0]], backend.now()) == 1
    assert backend.history_delete("dead", []) == 0
    assert backend.history_delete("dead", [ids[2]]) == 1
    assert backend.history_bounds("done", None) == (ids[1], ids[1])


# --- tokens and idempotency (HTTP server) ----------------------------------------------


def test_tokens(backend: Backend) -> None:
    backend.token_insert(NewToken("t1", "a" * 64, "admin", ("orders.*",), name="ci",
                                  access_key="AK1", sqs_secret="s"))
    backend.token_insert(NewToken("t2", "b" * 64, "send", (T,), expires_in_s=60))
    one = backend.token_find(secret_sha256="a" * 64)
    assert one is not None and (one.id, one.role, one.topics, one.name) == (
        "t1", "admin", ("orders.*",), "ci")
    assert one.expires_at is None and one.revoked_at is None
    # created_at is the server's own clock on PostgreSQL (a column default), so only
    # checked_at and expires_at are compared with the test clock.
    assert one.checked_at == backend.now() and one.created_at.tzinfo is not None
    two = backend.token_find(access_key=None, secret_sha256="b" * 64)
    assert two is not None and two.expires_at == backend.now() + timedelta(seconds=60)
    assert backend.token_find(access_key="AK1").id == "t1"  # type: ignore[union-attr]
    assert backend.token_find(secret_sha256="c" * 64) is None
    assert [t.id for t in backend.token_list()] == ["t1", "t2"]
    assert backend.token_revoke("t1") is True and backend.token_revoke("t1") is False
    assert backend.token_find(secret_sha256="a" * 64).revoked_at is not None  # type: ignore[union-attr]


def test_idempotency_records(backend: Backend) -> None:
    backend.token_insert(NewToken("t1", "a" * 64, "send", (T,)))
    with backend.transaction() as conn:
        assert backend.idempotency_claim("t1", "key-1", "fp", conn) is None
        backend.idempotency_finish("t1", "key-1", 200, '{"ok": true}', conn)
    with backend.transaction() as conn:
        record = backend.idempotency_claim("t1", "key-1", "fp2", conn)
    assert record is not None and (record.fingerprint, record.status, record.response) == (
        "fp", 200, '{"ok": true}')
    assert backend.idempotency_expire(60) == 0
    backend.advance_clock(61)
    assert backend.idempotency_expire(60) == 1


# --- health --------------------------------------------------------------------------------


def test_health_facts(backend: Backend) -> None:
    facts = backend.health_facts()
    known = sorted(backend.migrations_known())
    assert facts["schema"] == {"applied": known, "known": known}
    assert "durability" in facts and "error" not in facts["durability"]


def test_times_are_aware_utc_everywhere(backend: Backend) -> None:
    backend.message_insert([msg()], "error")
    [row] = backend.message_claim(spec()).rows
    for name in ("created_at", "available_at", "first_available_at", "received_at"):
        assert row[name].tzinfo is not None and row[name].utcoffset() == timedelta(0), name
    assert backend.now() > datetime(2000, 1, 1, tzinfo=UTC)
