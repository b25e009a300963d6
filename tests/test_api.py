"""Public-API semantics, the same test on SQLite, PostgreSQL and MariaDB (the `q` fixture)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dbhelpers import driver_connection, root_conftest

import tableq
import tableq.url
from tableq import DuplicateMessage, InvalidArgument, LeaseLost, PayloadTooLarge, UnknownKind
from tableq.bulk import Bulk
from tableq.testing import wait_until


def test_send_receive_ack_roundtrip(q: tableq.Queue) -> None:
    sent = q.send("emails", {"to": "a@example.com", "n": 1}, headers={"trace": "t1"})
    assert sent.status == "sent" and sent.id > 0
    (msg,) = q.receive("emails")
    assert msg.id == sent.id and msg.topic == "emails"
    assert msg.payload == {"to": "a@example.com", "n": 1}
    assert msg.headers == {"trace": "t1"}
    assert msg.attempts == 1 and msg.lease
    assert msg.created_at.tzinfo is not None and msg.lease_expires_at > msg.created_at
    assert q.receive("emails") == []  # hidden while leased
    msg.ack()
    assert q.stats("emails")[0].live == 0
    with pytest.raises(LeaseLost):
        msg.ack()  # already gone: a second ack changes nothing and says so


def test_payload_kinds_roundtrip(q: tableq.Queue) -> None:
    values = [None, True, 3, 2.5, "text ünïcode ✓", [1, [2]], {"a": {"b": None}}, b"\x00\xffraw"]
    for v in values:
        q.send("p", v)
    got = [m.payload for m in q.receive("p", max=20)]
    assert got == values
    assert isinstance(got[-1], bytes)


def test_fifo_within_priority_and_priority_first(q: tableq.Queue) -> None:
    q.send("t", "low-1", priority=0)
    q.send("t", "high", priority=10)
    q.send("t", "low-2", priority=0)
    q.send("t", "neg", priority=-5)
    assert [m.payload for m in q.receive("t", max=10)] == ["high", "low-1", "low-2", "neg"]


def test_delay_and_at_schedule_delivery(q: tableq.Queue) -> None:
    q.send("d", "later", delay=0.6)
    q.send("d", "much later", at=datetime.now(UTC) + timedelta(hours=1))
    q.send("d", "tomorrow", delay=timedelta(days=1))
    s = q.stats("d")[0]
    assert (s.ready, s.scheduled) == (0, 3)
    assert q.receive("d") == []
    msgs = wait_until(lambda: q.receive("d"), timeout=10)
    assert [m.payload for m in msgs] == ["later"]
    assert msgs[0].first_available_at >= msgs[0].created_at + timedelta(seconds=0.5)


def test_a_time_in_the_past_is_due_at_once_behind_what_is_already_due(q: tableq.Queue) -> None:
    """No message is due before it is sent (a backdated one cannot jump the line; claim
    floors rely on it); first_available_at keeps the time asked for."""
    q.send("p", "waiting")
    yesterday = datetime.now(UTC) - timedelta(days=1)
    q.send("p", "backdated", at=yesterday)
    q.send_many("p", ["backdated too"], at=yesterday)
    peeked = q.peek("p")
    assert [m.first_available_at == yesterday for m in peeked] == [False, True, True]
    assert all(m.available_at >= peeked[0].available_at for m in peeked)
    msgs = q.receive("p", max=10)
    assert [m.payload for m in msgs] == ["waiting", "backdated", "backdated too"]


def test_nack_with_delay_and_error(q: tableq.Queue) -> None:
    q.send("n", "job")
    (m,) = q.receive("n")
    m.nack(delay=30, error="smtp down")
    s = q.stats("n")[0]
    assert (s.ready, s.scheduled, s.in_flight) == (0, 1, 0)
    (peeked,) = q.peek("n")
    assert peeked.last_error == "smtp down" and peeked.attempts == 1
    with pytest.raises(LeaseLost):
        m.nack()  # the lease is gone after the first nack


def test_release_does_not_charge_the_attempt(q: tableq.Queue) -> None:
    q.send("r", "job")
    (m,) = q.receive("r")
    q.release(m)
    (again,) = q.receive("r")
    assert again.attempts == 1


def test_lease_expiry_redelivers_and_fences_the_old_holder(q: tableq.Queue) -> None:
    q.send("l", "job")
    (first,) = q.receive("l", visibility_timeout=0.3)
    (second,) = wait_until(lambda: q.receive("l", visibility_timeout=30), timeout=10)
    assert second.id == first.id and second.lease != first.lease and second.attempts == 2
    for action in (first.ack, first.nack, first.heartbeat, lambda: first.dead_letter("x")):
        with pytest.raises(LeaseLost) as err:
            action()
        assert "heartbeat" in str(err.value)
    assert q.stats("l")[0].in_flight == 1  # the stale calls changed nothing
    second.ack()
    assert q.stats("l")[0].live == 0


def test_ack_after_expiry_but_before_redelivery_still_succeeds(q: tableq.Queue) -> None:
    q.send("l2", "job")
    (m,) = q.receive("l2", visibility_timeout=0.1)
    wait_until(lambda: q.stats("l2")[0].ready == 1, timeout=5)
    m.ack()  # nobody took it: the lease token still matches (as SQS allows)
    assert q.stats("l2")[0].live == 0


def test_one_claim_of_many_rows_returns_every_field_as_stored(q: tableq.Queue) -> None:
    """An unfiltered claim (MariaDB reads it packed into one JSON text) returns each row's
    fields exactly as a peek reads them: awkward keys, kinds and texts, bytes, headers, the
    last error and the saved progress, in delivery order."""
    q._kinds.strict = False
    names = ["'; --", '"\\', "%s", "emoji 🎉", "ünï", "a" * 200]
    texts = ["tab\there", "\x01ctl\x1f", "line\nbreak", "nul \\u0000", "é😀", ""]
    for i, (name, text) in enumerate(zip(names, texts, strict=True)):
        q.send("f", {"i": i, "s": text}, key=name, kind=name[:100], headers={"h": text},
               priority=i % 3)
    q.send("f", b"\x00\xff\"raw", key="bytes", delay=0)
    (first,) = q.receive("f")
    first = first.heartbeat(extend=60, progress={"step": first.key})
    first.nack(error="boom\n\"quoted\" ✓")
    peeked = {m.id: m for m in q.peek("f", limit=20)}
    got = q.receive("f", max=20, visibility_timeout=60)
    assert [m.id for m in got] == [m.id for m in sorted(
        peeked.values(), key=lambda m: (-m.priority, m.available_at, m.id))]
    for m in got:
        p = peeked[m.id]
        assert (m.topic, m.key, m.kind, m.payload, m.headers, m.priority, m.created_at,
                m.last_error, m.progress) == (p.topic, p.key, p.kind, p.payload, p.headers,
                                              p.priority, p.created_at, p.last_error,
                                              p.progress)
        assert m.lease and m.attempts == p.attempts + 1
    assert {m.key for m in got} == {*names, "bytes"}
    assert peeked[first.id].last_error == "boom\n\"quoted\" ✓"
    assert peeked[first.id].progress == {"step": first.key}
    assert [m.payload for m in got if m.key == "bytes"] == [b"\x00\xff\"raw"]


def test_a_claim_bigger_than_a_packet_returns_every_row(q: tableq.Queue) -> None:
    """1,000 messages of 20 KB in one claim (20 MB, beyond MariaDB's default packet and so
    beyond a packed claim's text): every row arrives, in order."""
    big = "x" * 20_000
    ids = q.send_many("big", [{"n": i, "s": big} for i in range(1000)])
    got = q.receive("big", max=1000, visibility_timeout=60)
    assert [m.id for m in got] == [s.id for s in ids]
    assert [m.payload["n"] for m in got] == list(range(1000))
    assert all(m.payload["s"] == big for m in got)
    q.ack_many(got)
    assert q.stats("big")[0].live == 0


def test_a_batch_send_cut_into_several_statements_keeps_every_id_and_value(
        q: tableq.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A send_many bigger than one statement may carry (MariaDB's packet, SQLite's longest
    string: limits made small here) goes out in several, in one transaction: the ids are the
    rows', in order, and every value arrives; both batch shapes (bare payloads, and rows with
    headers or priorities)."""
    import tableq.backends.mysql
    import tableq.backends.sqlite

    for module in (tableq.backends.mysql, tableq.backends.sqlite):
        monkeypatch.setattr(module, "STATEMENT_CHARS", 30_000)
    text = "é" * 9_000
    bare = q.send_many("cut", [{"n": i, "s": text} for i in range(12)])
    rows = q.send_many("cut", [{"payload": {"n": 12 + i, "s": text}, "headers": {"h": str(i)},
                                "priority": 0} for i in range(12)])
    sent = [r.id for r in (*bare, *rows)]
    assert len(set(sent)) == 24 and sent == sorted(sent)
    got = q.receive("cut", max=30, visibility_timeout=60)
    assert [m.id for m in got] == sent
    assert [m.payload["n"] for m in got] == list(range(24))
    assert all(m.payload["s"] == text for m in got)
    assert [m.headers for m in got[12:]] == [{"h": str(i)} for i in range(12)]


def test_heartbeat_extends_lease_and_saves_progress(q: tableq.Queue) -> None:
    q.send("h", "job")
    (m,) = q.receive("h", visibility_timeout=1)
    m2 = m.heartbeat(extend=60, progress={"done": 3})
    assert m2.lease_expires_at > m.lease_expires_at + timedelta(seconds=50)
    assert q.peek("h")[0].progress == {"done": 3}
    m2.ack()


def test_heartbeat_many_extends_held_leases_and_leaves_out_lost_ones(q: tableq.Queue) -> None:
    q.send_many("hm", [1, 2, 3])
    msgs = q.receive("hm", max=3, visibility_timeout=0.2)
    wait_until(lambda: q.stats("hm")[0].ready == 3, timeout=5)
    (retaken,) = q.receive("hm", max=1, visibility_timeout=60)
    held = q.heartbeat_many(msgs, extend=60)
    assert sorted(m.id for m in held) == sorted(m.id for m in msgs if m.id != retaken.id)
    assert all(m.lease_expires_at > retaken.received_at for m in held)
    assert q.stats("hm")[0].in_flight == 3
    q.ack_many([*held, retaken])
    assert q.max_attempts_for("hm") == 5 and q.max_attempts_for("hm", 2) == 2


def test_max_attempts_dead_letters_with_last_error(q: tableq.Queue) -> None:
    q.send("poison", {"bad": True})
    for attempt in range(1, 4):
        (m,) = q.receive("poison", max_attempts=3)
        assert m.attempts == attempt
        m.nack(error=f"failure {attempt}")
    assert q.receive("poison", max_attempts=3) == []
    s = q.stats("poison")[0]
    assert (s.live, s.dead) == (0, 1)
    (dead,) = q.dead_letters("poison")
    assert dead.error == "failure 3" and dead.attempts == 3 and dead.payload == {"bad": True}


def test_dead_lettering_does_not_starve_the_receive(q: tableq.Queue) -> None:
    q.configure_topic("mix", max_attempts=1)
    q.send("mix", "poison", priority=5)
    (m,) = q.receive("mix")
    m.nack()
    q.send("mix", "good")
    assert [x.payload for x in q.receive("mix")] == ["good"]  # poison dead-lettered on the way
    assert q.stats("mix")[0].dead == 1


def test_explicit_dead_letter_requeue_and_purge(q: tableq.Queue) -> None:
    ids = [q.send("dl", i).id for i in range(3)]
    for m in q.receive("dl", max=3):
        m.dead_letter(f"bad {m.payload}")
    assert [d.id for d in q.dead_letters("dl")] == ids
    assert q.requeue_dead("dl", ids=[ids[0]]) == 1
    (back,) = q.receive("dl")
    assert back.id == ids[0] and back.attempts == 1 and back.last_error == "bad 0"
    back.ack()
    assert q.purge_dead("dl", ids=[ids[1]]) == 1
    assert q.requeue_dead("dl") == 1
    assert q.purge_dead("dl") == 0 and q.stats("dl")[0].dead == 0


def test_dead_letter_without_a_reason_is_refused_and_changes_nothing(q: tableq.Queue) -> None:
    q.send("dlr", 1)
    (m,) = q.receive("dlr")
    for reason in (None, "", "  \n\t"):  # blank says nothing either
        with pytest.raises(tableq.InvalidArgument, match="needs the reason"):
            q.dead_letter(m, reason)  # type: ignore[arg-type]
    m.dead_letter("bad")
    (dead,) = q.dead_letters("dlr")
    assert dead.id == m.id and dead.error == "bad"


def test_requeue_dead_keeps_a_dead_letter_whose_key_is_live_again(q: tableq.Queue) -> None:
    q.send("dk", 1, key="k")
    (m,) = q.receive("dk")
    m.dead_letter("x")
    q.send("dk", 2, key="k")
    assert q.requeue_dead("dk") == 0
    assert len(q.dead_letters("dk")) == 1


def test_on_duplicate_modes(q: tableq.Queue) -> None:
    a = q.send("k", {"v": 1}, key="user-1")
    b = q.send("k", {"v": 2}, key="user-1")
    assert (a.status, b.status, b.id) == ("sent", "duplicate", a.id)
    assert q.peek("k")[0].payload == {"v": 1}
    c = q.send("k", {"v": 3}, key="user-1", on_duplicate="replace")
    assert (c.status, c.id) == ("replaced", a.id)
    assert q.peek("k")[0].payload == {"v": 3}
    with pytest.raises(DuplicateMessage) as err:
        q.send("k", {"v": 4}, key="user-1", on_duplicate="error")
    assert err.value.existing_id == a.id
    assert q.send("other", 1, key="user-1").status == "sent"  # keys are per topic
    (m,) = q.receive("k")
    m.ack()
    assert q.send("k", {"v": 5}, key="user-1").status == "sent"  # only live messages dedup


def test_replace_fences_the_current_holder(q: tableq.Queue) -> None:
    q.send("rk", 1, key="k")
    (m,) = q.receive("rk")
    q.send("rk", 2, key="k", on_duplicate="replace")
    with pytest.raises(LeaseLost):
        m.ack()
    (m2,) = q.receive("rk")
    assert m2.payload == 2 and m2.attempts == 1


def test_send_many_mixed_items_and_dedupe(q: tableq.Queue) -> None:
    results = q.send_many("sm", [
        {"payload": {"i": 0}, "key": "a", "priority": 3},
        {"payload": {"i": 1}},
        "plain",
        {"payload": {"i": 3}, "key": "a"},
        {"payload": {"i": 4}, "delay": 3600, "headers": {"h": "v"}},
    ])
    assert [r.status for r in results] == ["sent", "sent", "sent", "duplicate", "sent"]
    assert results[3].id == results[0].id
    assert len({r.id for r in results}) == 4
    got = q.receive("sm", max=10)
    assert [m.payload for m in got] == [{"i": 0}, {"i": 1}, "plain"]
    assert q.stats("sm")[0].scheduled == 1
    assert q.send_many("sm", []) == []


def test_send_many_large_batch_keeps_order_and_ids(q: tableq.Queue) -> None:
    results = q.send_many("big", range(2500))
    assert [r.status for r in results] == ["sent"] * 2500
    assert sorted(r.id for r in results) == [r.id for r in results]
    got = q.receive("big", max=2500)
    assert [m.payload for m in got] == list(range(2500))
    assert [m.id for m in got] == [r.id for r in results]
    q.ack_many(got)
    assert q.stats("big")[0].live == 0


@pytest.mark.parametrize("with_bytes", [True, False])
def test_send_many_large_batch_keeps_every_value_as_sent(q: tableq.Queue,
                                                         with_bytes: bool) -> None:
    # A batch big enough for PostgreSQL's COPY path: values that COPY's text format must
    # escape, bytes, kinds, headers and priorities all come back as they were sent. Without
    # bytes, SQLite sends the batch as one JSON parameter, whose escapes must round-trip too.
    odd = ["tab\there", "new\nline", "cr\rx", "back\\slash", "\\N", "\\u0000 literal",
           "quote\"s", "ünï©ødé 🎉", "", "\\x41"]
    items: list[object] = []
    for i in range(150):
        if i % 10 == 3 and with_bytes:
            items.append({"payload": bytes([i % 256, 0, 9, 10, 92]), "headers": {"b": "1"}})
        else:
            items.append({"payload": {"i": i, "s": odd[i % len(odd)]}, "priority": i % 3,
                          "headers": {"h": odd[(i + 1) % len(odd)]}})
    results = q.send_many("esc", items)
    assert [r.status for r in results] == ["sent"] * 150
    assert sorted(r.id for r in results) == [r.id for r in results]
    got = {m.id: m for m in q.receive("esc", max=150)}
    assert len(got) == 150
    for r, item in zip(results, items, strict=True):
        m = got[r.id]
        assert isinstance(item, dict)
        assert (m.payload, m.headers, m.priority) == (
            item["payload"], item["headers"], item.get("priority", 0))


def test_send_many_due_times_per_item(q: tableq.Queue) -> None:
    at = datetime.now(UTC) + timedelta(days=2)
    results = q.send_many("due", [
        {"payload": 0}, {"payload": 1, "delay": 3600}, {"payload": 2, "at": at},
        {"payload": 3, "delay": timedelta(minutes=5)}, {"payload": 4, "kind": None}])
    sent = datetime.now(UTC)
    due = {m.payload: m.available_at for m in q.peek("due", limit=10)}
    assert [r.status for r in results] == ["sent"] * 5 and len(due) == 5
    assert abs((due[1] - sent).total_seconds() - 3600) < 60
    assert abs((due[2] - at).total_seconds()) < 0.01
    assert abs((due[3] - sent).total_seconds() - 300) < 60
    assert [m.payload for m in q.receive("due", max=10)] == [0, 4]


def test_send_many_error_mode_is_all_or_nothing(q: tableq.Queue) -> None:
    q.send("ae", 0, key="taken")
    with pytest.raises(DuplicateMessage):
        q.send_many("ae", [{"payload": 1, "key": "fresh"}, {"payload": 2, "key": "taken"}],
                    on_duplicate="error")
    assert [m.payload for m in q.peek("ae")] == [0]


def test_ack_many_reports_lost_leases_after_acking_the_rest(q: tableq.Queue) -> None:
    q.send_many("am", [1, 2, 3])
    msgs = q.receive("am", max=3, visibility_timeout=0.2)
    wait_until(lambda: q.stats("am")[0].ready == 3, timeout=5)
    (retaken,) = q.receive("am", max=1)
    with pytest.raises(LeaseLost) as err:
        q.ack_many(msgs)
    assert err.value.message_id == retaken.id and err.value.message_ids == [retaken.id]
    assert q.stats("am")[0].live == 1
    retaken.ack()


@pytest.mark.parametrize("receives", [2, 6])
def test_ack_many_across_receives_acks_only_the_leases_it_names(q: tableq.Queue,
                                                                 receives: int) -> None:
    """One ack_many over messages of several receive calls (each its own lease token, on
    MariaDB one per call: one lease and several are acked differently there): a message whose
    lease moved to a later receive is not acked under its old one, and every other one is."""
    q.send_many("al", list(range(receives * 2)))
    held = [m for _ in range(receives) for m in q.receive("al", max=2, visibility_timeout=60)]
    assert len({m.lease for m in held}) >= receives  # per message on some databases
    q.ack_many(held[:2])
    q.nack(held[2])  # back at once: the next receive leases it again under a new token
    (retaken,) = q.receive("al", max=1, visibility_timeout=60)
    assert retaken.id == held[2].id and retaken.lease != held[2].lease
    with pytest.raises(LeaseLost) as err:
        q.ack_many(held[2:][::-1])
    assert err.value.message_ids == [held[2].id]
    assert [m.id for m in q.peek("al", limit=20)] == [held[2].id]
    retaken.ack()
    assert q.stats("al")[0].live == 0


def test_selective_receive(q: tableq.Queue) -> None:
    q.register_kind("signup")
    q.register_kind("other")
    q.send("sel", {"user": 7, "plan": "pro", "vip": True, "note": None}, kind="signup", key="u7")
    q.send("sel", {"user": 8, "plan": "free", "vip": False}, kind="signup")
    q.send("sel", {"user": "7", "plan": "pro"}, kind="other")
    q.send("sel", b"bytes are never matched by fields")
    assert [m.payload["user"] for m in q.receive("sel", where={"user": 8}, max=5)] == [8]
    by_str = q.receive("sel", where={"user": "7"}, max=5)
    assert [m.kind for m in by_str] == ["other"]  # "7" is not 7
    assert [m.key for m in q.receive("sel", where={"kind": "signup", "vip": True})] == ["u7"]
    assert q.receive("sel", where={"payload": {"note": None}}) == []  # u7 is leased now
    assert q.stats("sel")[0].in_flight == 3


def test_selective_receive_rejects_unsafe_fields(q: tableq.Queue) -> None:
    for bad in ("$.a", "a.b", "a\"b", "*", "**", "", "a b", "x'--"):
        with pytest.raises(tableq.InvalidName):
            q.receive("sel", where={bad: 1})
    with pytest.raises(InvalidArgument):
        q.receive("sel", where={"a": [1, 2]})


def test_at_most_once_removes_on_receive(q: tableq.Queue) -> None:
    q.send_many("amo", ["a", "b", "c"])
    got = q.receive("amo", max=2, mode="at_most_once")
    assert [m.payload for m in got] == ["a", "b"] and all(m.lease is None for m in got)
    assert q.stats("amo")[0].live == 1
    with pytest.raises(InvalidArgument):
        got[0].ack()


def test_exactly_once_commit_and_rollback(q: tableq.Queue) -> None:
    q.send("eo", {"n": 1})
    with pytest.raises(RuntimeError), q.transaction() as tx:
        (m,) = tx.receive("eo")
        assert m.transaction is tx
        tx.send("eo-out", {"from": m.id})
        m.ack()
        raise RuntimeError("handler crashed")
    s = q.stats("eo")[0]
    assert (s.ready, s.in_flight) == (1, 0)  # the receive rolled back too
    assert q.peek("eo")[0].attempts == 0
    assert q.stats("eo-out")[0].live == 0
    with q.transaction() as tx:
        (m,) = tx.receive("eo")
        tx.send("eo-out", {"from": m.id})
        m.ack()
    assert q.stats("eo")[0].live == 0 and q.stats("eo-out")[0].ready == 1


def test_exactly_once_with_the_callers_own_sql(q: tableq.Queue, db_url: str) -> None:
    # Create a table of the application's own through a plain driver connection.
    own = driver_connection(db_url)
    cur = own.cursor()
    cur.execute("CREATE TABLE app_effect (msg_id BIGINT PRIMARY KEY)")
    own.commit()
    own.close()
    q.send("eo2", 1)
    marker = "%s" if q.dialect != "sqlite" else "?"
    with pytest.raises(ZeroDivisionError), q.transaction() as tx:
        (m,) = tx.receive("eo2")
        tx.connection.cursor().execute(
            f"INSERT INTO app_effect (msg_id) VALUES ({marker})", (m.id,))
        m.ack()
        raise ZeroDivisionError("handler bug")
    with q.transaction() as tx:
        (m,) = tx.receive("eo2")
        tx.connection.cursor().execute(
            f"INSERT INTO app_effect (msg_id) VALUES ({marker})", (m.id,))
        m.ack()
    check = driver_connection(db_url)
    c = check.cursor()
    c.execute("SELECT msg_id FROM app_effect")
    assert [r[0] for r in c.fetchall()] == [m.id]
    c.execute("DROP TABLE app_effect")
    check.commit()
    check.close()


def test_outbox_send_commits_and_rolls_back_with_the_callers_transaction(
    q: tableq.Queue, db_url: str
) -> None:
    conn = driver_connection(db_url)
    try:
        q.send("outbox", "rolled back", connection=conn)
        assert q.stats("outbox")[0].live == 0  # invisible before commit
        conn.rollback()
        q.send_many("outbox", range(600), connection=conn)  # a batch big enough for COPY
        assert q.stats("outbox")[0].live == 0
        conn.rollback()
        q.send_many("outbox", ["kept-1", "kept-2"], connection=conn)
        q.send_many("outbox", [f"kept-{i}" for i in range(3, 603)], connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert [m.payload for m in q.peek("outbox", 1000)] == [f"kept-{i}" for i in range(1, 603)]
    with pytest.raises(InvalidArgument):
        q.send("outbox", 1, connection=object())


@pytest.mark.parametrize("retention", [False, True])
def test_acks_on_the_callers_connection_commit_and_roll_back_with_it(
    db_url: str, retention: bool
) -> None:
    """ack_many / ack / dead_letter with connection=, on the application's own driver
    connection (not one of tableq's: no tableq session settings or encoders on it)."""
    with tableq.connect(db_url, migrate=True, retention=retention) as q:
        q.send_many("acks", range(6))
        got = q.receive("acks", max=6, visibility_timeout=60)
        conn = driver_connection(db_url)
        try:
            q.ack_many(got[:3], connection=conn)
            conn.rollback()
            assert q.stats("acks")[0].in_flight == 6  # rolled back: still leased
            q.ack_many(got[:3], connection=conn)
            q.ack(got[3], connection=conn)
            q.dead_letter(got[4], "poison", connection=conn)
            conn.commit()
        finally:
            conn.close()
        st = q.stats("acks")[0]
        assert (st.in_flight, st.dead) == (1, 1)
        assert [d.error for d in q.dead_letters("acks")] == ["poison"]


def test_forward_sends_and_acks_atomically(q: tableq.Queue) -> None:
    q.send("step1", {"order": 1})
    (m,) = q.receive("step1")
    r = m.forward("step2", {"order": 1, "paid": True}, priority=2)
    assert r.status == "sent"
    assert q.stats("step1")[0].live == 0
    (n,) = q.receive("step2")
    assert n.payload == {"order": 1, "paid": True} and n.priority == 2
    q.send("step1", 2)
    (m2,) = q.receive("step1", visibility_timeout=0.1)
    wait_until(lambda: q.receive("step1"), timeout=5)
    with pytest.raises(LeaseLost):
        m2.forward("step2", "must not appear")
    assert q.stats("step2")[0].live == 1  # the forward rolled back with the failed ack


def test_registered_kind_validates_on_send_and_receive(q: tableq.Queue) -> None:
    def encode(v: dict) -> dict:
        if not isinstance(v.get("to"), str) or "@" not in v["to"]:
            raise ValueError("'to' must be an email address")
        return v

    q.register_kind("email", encode=encode, decode=lambda v: {**v, "decoded": True})
    q.send("mail", {"to": "a@b.c"}, kind="email")
    with pytest.raises(tableq.PayloadInvalid) as err:
        q.send("mail", {"to": "nobody"}, kind="email")
    assert "email address" in str(err.value)
    with pytest.raises(UnknownKind):
        q.send("mail", {}, kind="sms")
    (m,) = q.receive("mail")
    assert m.payload == {"to": "a@b.c", "decoded": True}


def test_payload_its_kind_rejects_on_receive_is_dead_lettered(q: tableq.Queue) -> None:
    q.register_kind("v1", decode=lambda v: v)
    q.send("ver", {"x": 1}, kind="v1")
    q.send("ver", {"x": 2}, kind="v1")

    def strict(v: dict) -> dict:
        if v["x"] == 1:
            raise ValueError("schema v1 no longer supported")
        return v

    q.register_kind("v1", decode=strict)
    got = q.receive("ver", max=5)
    assert [m.payload for m in got] == [{"x": 2}]
    (dead,) = q.dead_letters("ver")
    assert "schema v1 no longer supported" in dead.error


def test_payload_limit_and_bad_payloads(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True, max_payload_bytes=1000) as q:
        q.send("lim", "x" * 900)
        with pytest.raises(PayloadTooLarge) as err:
            q.send("lim", "x" * 1001)
        assert "1000" in str(err.value)
        with pytest.raises(PayloadTooLarge):
            q.send("lim", b"x" * 1001)
        for bad in (object(), {1, 2}, float("nan"), "nul\x00char", "\ud800"):
            with pytest.raises(tableq.PayloadInvalid):
                q.send("lim", bad)
        assert q.stats("lim")[0].live == 1


def test_bad_arguments_are_clear_errors(q: tableq.Queue) -> None:
    cases = [
        lambda: q.send("", 1),
        lambda: q.send("x" * 201, 1),
        lambda: q.send("tab\tname", 1),
        lambda: q.send(" padded", 1),
        lambda: q.send("t", 1, key=""),
        lambda: q.send("t", 1, key=5),
        lambda: q.send("t", 1, priority=1.5),
        lambda: q.send("t", 1, priority=2**40),
        lambda: q.send("t", 1, delay=-1),
        lambda: q.send("t", 1, delay=1e12),
        lambda: q.send("t", 1, at=datetime(3000, 1, 1, tzinfo=UTC)),
        lambda: q.send("t", 1, headers={"big": "x" * 20_000}),
        lambda: q.send("t", 1, headers={"h": "nul\x00"}),
        lambda: q.send("t", 1, at=datetime(2030, 1, 1)),
        lambda: q.send("t", 1, delay=1, at=datetime.now(UTC)),
        lambda: q.send("t", 1, headers={"a": 1}),
        lambda: q.send("t", 1, on_duplicate="overwrite"),
        lambda: q.receive("t", max=0),
        lambda: q.receive("t", max=10**9),
        lambda: q.receive("t", visibility_timeout=float("nan")),
        lambda: q.receive("t", mode="exactly_once"),
        lambda: q.send_many("t", [{"payload": 1, "prio": 2}]),
        lambda: q.peek("t", limit=-1),
        lambda: q.requeue_dead("t", ids="1,2"),
    ]
    for case in cases:
        with pytest.raises(ValueError) as err:
            case()
        assert isinstance(err.value, tableq.TableqError)
    assert q.topics() == []


def test_hostile_names_round_trip_byte_identical(q: tableq.Queue) -> None:
    q._kinds.strict = False
    names = ["'; DROP TABLE tableq_message; --", '"', "\\", "%", "_", "$.a", "..", "*",
             "emoji 🎉", "ünï", "a" * 200]
    for i, name in enumerate(names):
        q.send(name, {"i": i}, key=name[:255], kind=name[:100])
    for refused in ("\u202eRTL override", "nul\x00", "\ud800", "new\nline"):
        with pytest.raises(tableq.InvalidName):
            q.send(refused, 1)
    assert sorted(q.topics()) == sorted(names)
    for i, name in enumerate(names):
        (m,) = q.receive(name, where={"key": name[:255], "kind": name[:100]})
        assert (m.topic, m.key, m.payload) == (name, name[:255], {"i": i})
        m.ack()


def test_stats_peek_topics_purge(q: tableq.Queue) -> None:
    q.send_many("s1", [1, 2, 3])
    q.send("s1", 4, delay=3600)
    q.send("s2", 1)
    (m,) = q.receive("s1")
    s1, s2 = q.stats()
    assert (s1.topic, s1.ready, s1.scheduled, s1.in_flight, s1.dead) == ("s1", 2, 1, 1, 0)
    assert s1.oldest_ready_age is not None and 0 <= s1.oldest_ready_age < 60
    assert (s2.topic, s2.ready) == ("s2", 1)
    assert q.stats("nothing")[0].oldest_ready_age is None
    assert [p.payload for p in q.peek("s1", limit=2)] == [2, 3]
    assert q.topics() == ["s1", "s2"]
    assert q.get(m.id).payload == 1 and q.get(10**9) is None
    assert q.purge("s1") == 4
    assert q.stats("s1")[0].live == 0
    assert abs((q.now() - datetime.now(UTC)).total_seconds()) < 5


def test_stats_estimate_a_big_table(q: tableq.Queue) -> None:
    """Past its thresholds (made small here) stats() samples id windows for big topics,
    counts their scheduled and in-flight messages and their oldest ready one from the claim
    index, and still counts small topics exactly; exact=True counts everything."""
    q.send_many("big", list(range(300)), priority=1)
    q.send_many("big", list(range(40)), delay=3600)
    q.send_many("tiny", [1, 2, 3])
    leased = q.receive("big", max=20)
    backend = q._backend
    backend.stats_exact_span, backend.stats_sample_ids = 50, 120
    backend.stats_sample_windows, backend.stats_exact_topic = 12, 100
    backend.stats_min_windows = 5

    exact = {s.topic: s for s in q.stats(exact=True)}
    assert (exact["big"].ready, exact["big"].scheduled, exact["big"].in_flight) == (280, 40, 20)
    assert not exact["big"].estimated
    for stats in (q.stats(), q.stats("big")):
        big = {s.topic: s for s in stats}["big"]
        assert big.estimated and abs(big.ready - 280) <= 60, big
        assert (big.scheduled, big.in_flight) == (40, 20)  # counted, below the cap
        age = exact["big"].oldest_ready_age
        assert age is not None and big.oldest_ready_age is not None
        assert abs(big.oldest_ready_age - age) < 5
    tiny = {s.topic: s for s in q.stats()}["tiny"]
    assert (tiny.ready, tiny.estimated) == (3, False)
    backend.stats_exact_topic = 10  # in_flight (20) and scheduled (40) hit the cap: scaled
    big = q.stats("big")[0]
    assert big.estimated and 0 < big.scheduled + big.in_flight < 120  # a 12-window sample
    for m in leased:
        m.ack()


def test_public_queue_holds_user_operations_only(q: tableq.Queue) -> None:
    plumbing = {"stage_many", "stage_json", "publish_staged", "discard_staged", "cleanup_staged",
                "staged_job_state", "receive_batch", "lease_batch", "leased_messages",
                "ack_lease", "extend_lease", "release_lease", "history_bounds", "history",
                "delete_history", "save_token", "find_token", "list_tokens", "revoke_token",
                "idempotent", "expire_idempotency", "backend", "kinds"}
    assert not plumbing & {n for n in dir(q) if not n.startswith("_")}
    assert all(hasattr(Bulk, n) for n in ("stage_many", "lease_batch", "delete_history"))
    assert q.where in repr(q) and "tableq.Queue" in repr(q)
    assert "tableq.bulk" not in {type(v).__module__ for v in vars(tableq).values()}


def test_retention_archives_acked_messages(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True, retention=True) as q:
        q.send_many("ret", [1, 2])
        q.ack_many(q.receive("ret", max=2))
        assert q.stats("ret")[0].done == 2
        lo, hi = Bulk(q).history_bounds("done", "ret")
        rows = Bulk(q).history("done", "ret", lo, hi)
        assert [r["payload"] for r in rows] == [1, 2] and rows[0]["done_at"] is not None
        assert Bulk(q).delete_history("done", [lo]) == 1


def test_staged_load_is_invisible_until_published_and_idempotent(q: tableq.Queue) -> None:
    Bulk(q).stage_many("job-1", 0, "bulk", [{"payload": i, "key": f"k{i}"} for i in range(5)])
    Bulk(q).stage_many("job-1", 1, "bulk", range(100, 103))  # a failed task attempt
    Bulk(q).stage_many("job-1", 2, "bulk", [{"payload": 9, "key": "k0"}, "x"])
    assert q.stats("bulk")[0].live == 0 and Bulk(q).staged_job_state("job-1") == "open"
    assert Bulk(q).publish_staged("job-1", [0, 2]) == 6  # k0 repeated: kept once
    assert Bulk(q).publish_staged("job-1", [0, 2]) is None  # a rerun of the commit is a no-op
    assert Bulk(q).staged_job_state("job-1") == "committed"
    assert sorted(str(m.payload) for m in q.peek("bulk", limit=50)) == sorted(
        ["0", "1", "2", "3", "4", "x"])
    Bulk(q).stage_many("job-4", 0, "bulk", [1, 2])
    with pytest.raises(tableq.LoadIncomplete):  # rows the writers reported are gone
        Bulk(q).publish_staged("job-4", [0], expected_rows=3)
    assert Bulk(q).publish_staged("job-4", [0], expected_rows=2) == 2
    Bulk(q).stage_many("job-2", 0, "bulk", [1, 2])
    assert Bulk(q).discard_staged("job-2") == 2 and Bulk(q).staged_job_state("job-2") == "aborted"
    Bulk(q).stage_many("job-3", 0, "bulk", [1])
    assert Bulk(q).cleanup_staged(older_than=0) == 1
    assert q.stats("bulk")[0].live == 8


def test_staged_json_texts_arrive_as_their_values(q: tableq.Queue) -> None:
    """stage_json (the Spark sink's bulk path): texts that need COPY escapes or are not ASCII
    arrive as the values they encode; a text with a NUL or beyond the size limit is refused
    with its own error and stages nothing."""
    texts = ['{"s":"a\\\\b\\n"}', '{\n\t"t": "é"}', '"\\u00e9\\t"', "[1,2.5,null]",
             '{"u":"\\\\u0000"}']
    assert Bulk(q).stage_json("job-t", 0, "texts", texts) == 5
    with pytest.raises(tableq.PayloadInvalid):
        Bulk(q).stage_json("job-t", 1, "texts", ['{"n":"\\u0000"}'])
    with pytest.raises(tableq.PayloadTooLarge):
        Bulk(q).stage_json("job-t", 1, "texts", ['"' + "x" * q.max_payload_bytes + '"'])
    assert Bulk(q).stage_json("job-t", 2, "texts", []) == 0
    assert Bulk(q).publish_staged("job-t", [0, 1], expected_rows=5) == 5
    assert [m.payload for m in q.peek("texts", limit=10)] == [json.loads(t) for t in texts]


def test_staged_rows_are_hidden_from_every_reader_until_published(q: tableq.Queue) -> None:
    q.send("vis", "before")
    Bulk(q).stage_many("job-v", 7, "vis", [1, 2, {"payload": 3, "delay": 60},
                                     {"payload": 4, "priority": 5}])
    Bulk(q).stage_many("job-v", 9, "only-staged", ["hidden"])
    assert "only-staged" not in q.topics()
    (stats,) = q.stats("vis")
    assert (stats.ready, stats.scheduled, stats.live) == (1, 0, 1)
    assert [m.payload for m in q.peek("vis", limit=10)] == ["before"]
    lo, hi = Bulk(q).history_bounds("live", "vis")  # type: ignore[misc]
    assert [r["payload"] for r in Bulk(q).history("live", "vis", lo, hi + 100)] == ["before"]
    got = q.receive("vis", max=10)
    assert [m.payload for m in got] == ["before"]
    q.ack(got[0])
    q.send("vis", "purged")
    assert q.purge("vis") == 1  # purge takes only what readers see
    assert Bulk(q).publish_staged("job-v", [7, 9], expected_rows=5) == 5
    (stats,) = q.stats("vis")
    assert (stats.ready, stats.scheduled) == (3, 1)
    assert [m.payload for m in q.peek("vis", limit=10)][:1] == [4]  # priority still counts
    assert q.peek("only-staged")[0].payload == "hidden"
    # A task of the finished job arriving late (or replayed) writes nothing.
    assert Bulk(q).stage_many("job-v", 8, "vis", [99]) == 0
    assert Bulk(q).publish_staged("job-v", [8]) is None and q.stats("vis")[0].live == 4
    # A job id reused after an abort starts afresh.
    Bulk(q).stage_many("job-r", 0, "vis", [5])
    assert Bulk(q).discard_staged("job-r") == 1 and q.stats("vis")[0].live == 4
    assert Bulk(q).stage_many("job-r", 0, "vis", [6]) == 1
    assert Bulk(q).publish_staged("job-r", [0], expected_rows=1) == 1
    assert sorted(m.payload for m in q.peek("vis", limit=10)) == [1, 2, 3, 4, 6]


def test_staged_load_round_trips_awkward_values(q: tableq.Queue) -> None:
    q._kinds.register("odd\\kind")
    items = [b"\x00\t\n\\\r\xff", "tab\tnl\ncr\rbs\\ quote\" \u2028 é",
             {"payload": {"k\\": ["\\N", None]}, "headers": {"h\\": "v\\\n"},
              "kind": "odd\\kind", "priority": -7},
             {"payload": 1, "delay": 0.0}, {"payload": 2, "at": datetime.now(UTC)}]
    assert Bulk(q).stage_many("job-odd", 0, "odd\\topic", items) == 5
    assert Bulk(q).publish_staged("job-odd", [0]) == 5
    got = {repr(m.payload): m for m in q.peek("odd\\topic", limit=10)}
    assert set(got) == {repr(b"\x00\t\n\\\r\xff"), repr(items[1]), repr({"k\\": ["\\N", None]}),
                        "1", "2"}
    odd = got[repr({"k\\": ["\\N", None]})]
    assert (odd.kind, odd.headers, odd.priority) == ("odd\\kind", {"h\\": "v\\\n"}, -7)


def test_live_snapshot_by_id_range(q: tableq.Queue) -> None:
    ids = [r.id for r in q.send_many("snap", range(10))]
    q.send("other", "x")
    q.receive("snap", max=2)
    lo, hi = Bulk(q).history_bounds("live", "snap")
    assert (lo, hi) == (ids[0], ids[-1])
    rows = Bulk(q).history("live", "snap", ids[2], ids[5])
    assert [r["payload"] for r in rows] == [2, 3, 4, 5]
    everything = Bulk(q).history("live", "snap", lo, hi)
    assert len(everything) == 10 and all(r["lease"] is None for r in everything)
    with pytest.raises(InvalidArgument):
        Bulk(q).delete_history("live", ids)


def test_group_lease_batch(q: tableq.Queue) -> None:
    q.send_many("g", range(5))
    got = Bulk(q).receive_batch("g", "epoch-1:1", max=3, visibility_timeout=60)
    assert [m.payload for m in got] == [0, 1, 2]
    assert [m.payload for m in Bulk(q).leased_messages("g", "epoch-1:1")] == [0, 1, 2]
    assert Bulk(q).extend_lease("g", "epoch-1:1", 120) == 3
    assert Bulk(q).ack_lease("g", "epoch-1:1") == 3
    assert Bulk(q).ack_lease("g", "epoch-1:1") == 0
    assert q.stats("g")[0].ready == 2
    # By id range, and split between readers (id mod n = k).
    got = Bulk(q).receive_batch("g", "epoch-1:2", max=10, visibility_timeout=60)
    ids = (min(m.id for m in got), max(m.id for m in got))
    halves = [Bulk(q).leased_messages("g", "epoch-1:2", ids=ids, share=(k, 2)) for k in (0, 1)]
    assert sorted(m.id for h in halves for m in h) == sorted(m.id for m in got)
    assert all(m.id % 2 == k for k, h in enumerate(halves) for m in h)
    assert Bulk(q).leased_messages("g", "epoch-1:2", ids=(ids[1] + 1, ids[1] + 9)) == []
    assert Bulk(q).extend_lease("g", "epoch-1:2", 120, ids=ids) == 2
    assert Bulk(q).ack_lease("g", "epoch-1:2", ids=(ids[0], ids[0])) == 1
    assert Bulk(q).ack_lease("g", "epoch-1:2") == 1
    # Leasing by ids only: the same lease, nothing fetched; spent messages are dead-lettered.
    q.send_many("g2", range(4))
    spent = q.receive("g2", max=1)[0]
    q.nack(spent, delay=0)
    ids = Bulk(q).lease_batch("g2", "epoch-2:1", max=10, visibility_timeout=60, max_attempts=1)
    assert len(ids) == 3 and spent.id not in ids
    assert sorted(m.id for m in Bulk(q).leased_messages("g2", "epoch-2:1")) == sorted(ids)
    assert [d.id for d in q.dead_letters("g2")] == [spent.id]
    for bad in [{"share": (2, 2)}, {"share": (0, 0)}, {"ids": (5, 1)}]:
        with pytest.raises(InvalidArgument):
            Bulk(q).leased_messages("g", "epoch-1:2", **bad)  # type: ignore[arg-type]


def test_group_lease_given_back_unread(q: tableq.Queue) -> None:
    """release_lease (a stream's batch leased ahead and never read): due now, no lease, the
    claim's attempt refunded, the token free to lease other messages."""
    q.send_many("gb", range(6))
    b = Bulk(q)
    ids = b.lease_batch("gb", "ep:2", max=4, visibility_timeout=600)
    assert b.release_lease("gb", "ep:2", ids=(max(ids), max(ids))) == 1  # by id range
    assert b.release_lease("gb", "ep:2") == 3 and b.release_lease("gb", "ep:2") == 0
    s = q.stats("gb")[0]
    assert (s.ready, s.in_flight) == (6, 0)
    assert b.leased_messages("gb", "ep:2") == []
    other = b.lease_batch("gb", "other:1", max=1, visibility_timeout=600)
    reused = b.lease_batch("gb", "ep:2", max=2, visibility_timeout=600)  # the token again
    assert sorted(m.id for m in b.leased_messages("gb", "ep:2")) == sorted(reused)
    assert b.release_lease("gb", "ep:2") == 2  # the other lease is left alone
    assert [m.id for m in b.leased_messages("gb", "other:1")] == other
    assert b.release_lease("gb", "other:1") == 1
    again = q.receive("gb", max=10)
    assert sorted(m.payload for m in again) == list(range(6))
    assert all(m.attempts == 1 for m in again)  # the given-back leases cost no attempt
    for m in again:
        m.ack()


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
def test_idle_exactly_once_transaction_is_rolled_back_by_the_server(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True, transaction_idle_timeout_s=1) as q:
        q.send("idle", 1)
        # The error says why: PostgreSQL names the idle timeout; MariaDB only closes the
        # connection, so its advice names the timeout among the causes.
        with pytest.raises(tableq.DatabaseError, match="idle"):
            with q.transaction() as tx:
                (m,) = tx.receive("idle")
                wait_until(lambda: q.receive("idle"), timeout=15)  # freed by the server
                tx.ack(m)


def test_an_at_most_once_receive_in_a_transaction_removes_only_if_it_commits(
    q: tableq.Queue,
) -> None:
    q.send_many("amo", [{"n": 1}, {"n": 2}, {"n": 3}])
    with pytest.raises(RuntimeError, match="changed my mind"):
        with q.transaction() as tx:
            got = tx.receive("amo", max=2, mode="at_most_once", where={"n": 2})
            assert [(m.payload, m.lease, m.attempts) for m in got] == [({"n": 2}, None, 1)]
            raise RuntimeError("changed my mind")
    assert [(m.payload, m.attempts) for m in q.peek("amo")] == [
        ({"n": 1}, 0), ({"n": 2}, 0), ({"n": 3}, 0)]  # as they were
    with q.transaction() as tx:
        assert [m.payload for m in tx.receive("amo", max=2, mode="at_most_once")] == [
            {"n": 1}, {"n": 2}]
    assert [m.payload for m in q.peek("amo")] == [{"n": 3}]
    with pytest.raises(InvalidArgument, match="at_least_once or at_most_once"):
        with q.transaction() as tx:
            tx.receive("amo", mode="exactly_once")  # type: ignore[arg-type]


def test_a_caught_duplicate_does_not_spoil_the_exactly_once_transaction(q: tableq.Queue) -> None:
    q.send("xo", 1)
    q.send("xo-out", "taken", key="k")
    with q.transaction() as tx:
        (m,) = tx.receive("xo")
        with pytest.raises(DuplicateMessage) as err:
            tx.send("xo-out", "again", key="k", on_duplicate="error")
        assert err.value.existing_id is not None
        tx.send("xo-out", "fresh", key="k2")
        m.ack()
    assert q.stats("xo")[0].live == 0  # the ack committed
    assert sorted(p.payload for p in q.peek("xo-out")) == ["fresh", "taken"]


def test_at_most_once_keeps_an_undecodable_payload_as_a_dead_letter(q: tableq.Queue) -> None:
    q.register_kind("strict", decode=lambda v: v if v != "bad" else 1 / 0)
    q.send_many("amo2", [{"payload": "ok-1", "kind": "strict"},
                         {"payload": "bad", "kind": "strict"},
                         {"payload": b"raw", "kind": "strict", "headers": {"h": "v"}}])
    got = q.receive("amo2", max=3, mode="at_most_once")
    assert [m.payload for m in got] == ["ok-1", b"raw"]
    (dead,) = q.dead_letters("amo2")
    assert dead.payload == "bad" and "ZeroDivisionError" in dead.error
    assert q.stats("amo2")[0].live == 0


def test_long_error_texts_are_kept_cut_not_refused(q: tableq.Queue) -> None:
    q.send("err", 1)
    (m,) = q.receive("err")
    m.nack(error="E" * 100_000)
    (p,) = q.peek("err")
    assert p.last_error.startswith("EEE") and p.last_error.endswith("[truncated]")
    assert len(p.last_error) == 16_384


def test_ack_retried_after_it_committed_is_not_a_lost_lease(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True, retention=True) as q:
        q.send("idem", 1)
        (m,) = q.receive("idem")
        m.ack()
        m.ack()  # its reply "was lost": the archive shows it was acked under this lease
        q.send("idem", 2)
        (m2,) = q.receive("idem", visibility_timeout=0.1)
        (m3,) = wait_until(lambda: q.receive("idem"), timeout=5)
        m3.ack()
        with pytest.raises(LeaseLost):
            m2.ack()  # acked by someone else under another lease: still a lost lease


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_outbox_on_a_session_in_another_time_zone_keeps_database_utc(db_url: str) -> None:
    with tableq.connect(db_url, migrate=True) as q:
        conn = driver_connection(db_url)
        try:
            conn.cursor().execute("SET time_zone = '+05:00'")
            q.send("tz", "now", connection=conn)
            q.send("tz", "in an hour", delay=3600, connection=conn)
            conn.commit()
        finally:
            conn.close()
        assert [m.payload for m in q.receive("tz", max=5)] == ["now"]
        assert q.stats("tz")[0].scheduled == 1


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
def test_pool_reuses_connections_with_high_descriptor_numbers(db_url: str, tmp_path) -> None:
    import os

    files = [open(tmp_path / "f", "w") for _ in range(1100)]  # noqa: SIM115
    try:
        with tableq.connect(db_url, migrate=True) as q:
            q.stats()
            (conn,) = q._backend.pool._idle
            fd = conn.fileno() if q.dialect == "postgres" else conn._sock.fileno()
            assert fd >= 1024, fd  # past select()'s limit, on both databases
            for _ in range(5):
                q.stats()
            assert q._backend.pool._idle == [conn]  # the same connection, reused
    finally:
        for f in files:
            f.close()
        os.remove(tmp_path / "f")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_transaction_aborted_by_a_caught_error_does_not_pretend_to_commit(
    db_url: str,
) -> None:
    import psycopg

    with tableq.connect(db_url, migrate=True) as q:
        q.send("ab", 1)
        with pytest.raises(tableq.DatabaseError, match="nothing was committed"):
            with q.transaction() as tx:
                tx.receive("ab")
                try:
                    tx.connection.execute("SELECT * FROM no_such_table")
                except psycopg.Error:
                    pass  # the application swallows its own error
        assert q.stats("ab")[0].ready == 1 and q.peek("ab")[0].attempts == 0


def _other_session(conn: Any, dialect: str) -> None:
    """Sets the driver's other kinds of rows and cursors on a connection, and where the
    driver lets a transaction do it, its own transaction handling (what a caller may do)."""
    if dialect == "postgres":
        import psycopg
        from psycopg.rows import dict_row
        conn.row_factory = dict_row  # psycopg refuses to change autocommit in a transaction
        conn.cursor_factory = psycopg.RawCursor  # $1 placeholders
    elif dialect == "mysql":
        import pymysql
        conn.cursorclass = pymysql.cursors.Cursor  # tuples, where tableq's are dicts
        conn.autocommit(False)
    else:
        conn.row_factory, conn.text_factory = None, bytes
        conn.isolation_level = "DEFERRED"


def test_connection_given_back_by_a_transaction_serves_tableq_whatever_the_caller_set(
    db_url: str,
) -> None:
    """A caller may set its driver's other rows (psycopg's dict_row is a common idiom),
    cursors or transaction handling on the connection of queue.transaction(); tableq's own
    statements on that connection, once it is back in the pool, still work and still
    commit, after a block that committed and after one that raised."""
    one = {} if db_url.startswith("sqlite") else {"pool_size": 1}  # the same connection again
    with tableq.connect(db_url, migrate=True, **one) as q, tableq.connect(db_url) as other:
        with q.transaction() as tx:
            tx.send("rf", 0)
            _other_session(tx.connection, q.dialect)  # after: tableq's statements need it
        sent = [q.send("rf", 1).id]
        assert other.stats("rf")[0].ready == 2  # committed, not held in a transaction
        with pytest.raises(RuntimeError, match="raised"):
            with q.transaction() as tx:
                _other_session(tx.connection, q.dialect)
                raise RuntimeError("raised")
        sent += [q.send("rf", i).id for i in range(2, 4)]
        assert other.stats("rf")[0].ready == 4
        got = q.receive("rf", max=10)
        assert [m.id for m in got][1:] == sent and [m.payload for m in got] == [0, 1, 2, 3]
        assert other.stats("rf")[0].in_flight == 4
        q.ack_many(got)
        assert other.stats("rf") == [] or other.stats("rf")[0].live == 0


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_json_loader_set_in_a_block_does_not_decode_tableq_payloads_later(db_url: str) -> None:
    """psycopg's set_json_loads on the block's connection (orjson, Decimal floats) stayed on
    the pooled connection, and tableq's later receives decoded payloads with it."""
    import json as stdlib_json
    from decimal import Decimal

    from psycopg.types.json import set_json_loads

    with tableq.connect(db_url, migrate=True, pool_size=1) as q:
        q.send("jl", {"x": 1.5})
        with q.transaction() as tx:
            set_json_loads(lambda b: stdlib_json.loads(b, parse_float=Decimal), tx.connection)
            assert tx.connection.execute("SELECT '1.5'::jsonb").fetchone()[0] == Decimal("1.5")
        (m,) = q.receive("jl")
        assert m.payload == {"x": 1.5} and type(m.payload["x"]) is float


@pytest.mark.parametrize("db_url", ["postgres", "mysql"], indirect=True)
def test_pool_keeps_a_connection_after_a_foreign_exception_only_while_it_is_open(
    db_url: str,
) -> None:
    """After an exception that is not tableq's, the pool asks the driver whether the
    connection is still open: psycopg says it by `closed`, PyMySQL by `open`."""
    from tableq.backends._pool import _is_driver_error

    conn = driver_connection(db_url)
    assert not _is_driver_error(conn)
    conn.close()
    assert _is_driver_error(conn)


def _send_without_reading(conn: Any, dialect: str) -> Any:
    """Sends a statement and leaves its result unread on a driver connection, as an interrupt
    landing between the driver's send and its read does (on SQLite, in-process, nothing can
    be left half read: the statement's cursor is returned, open)."""
    if dialect == "postgres":  # slow: its reply must not reach the socket before the pool's
        conn.pgconn.send_query(b"SELECT 424242 AS id FROM pg_sleep(0.3)")  # readable check
    elif dialect == "mysql":
        from pymysql.constants import COMMAND
        conn._execute_command(COMMAND.COM_QUERY, "SELECT 424242 AS id")
    else:
        return conn.execute("SELECT 424242 AS id")
    return None


def test_an_interrupt_mid_statement_leaves_no_half_read_connection_in_the_pool(
    db_url: str,
) -> None:
    """On MySQL the next statement on such a connection read the interrupted one's result
    as its own (q.now() failed with KeyError 'now'; rows of the same shape would have been
    taken for its answer); on PostgreSQL it failed once with 'another command is already in
    progress'. The interrupt propagates as itself and the pool closes the connection."""
    one = {} if db_url.startswith("sqlite") else {"pool_size": 1}
    with tableq.connect(db_url, migrate=True, **one) as q:
        backend = q._backend
        q.send("hr", 0)
        q.stats()
        (first,) = backend.pool._idle

        def interrupted(cur: Any) -> None:
            conn = cur if q.dialect == "sqlite" else cur.connection
            _send_without_reading(conn, q.dialect)
            raise KeyboardInterrupt("between the send and the read")

        for tx in (False, True):
            with pytest.raises(KeyboardInterrupt, match="between the send"):
                backend.run(interrupted, tx=tx)
            assert first not in backend.pool._idle  # closed, not pooled
            assert abs((q.now() - datetime.now(UTC)).total_seconds()) < 60
            (first,) = backend.pool._idle
        with pytest.raises(KeyboardInterrupt, match="inside the block"):
            with q.transaction() as tx:
                tx.send("hr", 1)
                _send_without_reading(tx.connection, q.dialect)
                raise KeyboardInterrupt("inside the block")  # not masked by a failed rollback
        assert first not in backend.pool._idle
        got = q.receive("hr", max=10)
        assert [m.payload for m in got] == [0]  # the block's send was rolled back
        q.ack_many(got)
        assert q.stats("hr")[0].live == 0


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_transaction_block_that_leaves_a_statement_unread_is_rolled_back_and_not_pooled(
    db_url: str, error: type[BaseException],
) -> None:
    """Found by review: on MySQL, after an ordinary exception, the block's rollback read the
    unread statement's reply as its own and the connection was pooled one reply behind (sends
    then returned the previous statement's id); on PostgreSQL it was pooled still inside the
    block's transaction, holding the received message's lock, and the next sends on it were
    never committed; on SQLite an interrupt whose traceback kept the block's cursor alive left
    the write lock held (the connection was closed, not rolled back)."""
    one = {} if db_url.startswith("sqlite") else {"pool_size": 1}
    with tableq.connect(db_url, migrate=True, **one) as q, tableq.connect(db_url) as other:
        q.send("ur", "job")
        kept: list[BaseException] = []
        with pytest.raises(error, match="mid-statement"):
            with q.transaction() as tx:
                (m,) = tx.receive("ur", max=1)
                tx.send("ur", "in the block")
                pending = _send_without_reading(tx.connection, q.dialect)  # noqa: F841 - alive
                try:
                    raise error("mid-statement")
                except BaseException as exc:
                    kept.append(exc)  # its traceback keeps the block's frame (and cursor) alive
                    raise
        ids = [q.send("ur", f"after {i}").id for i in range(3)]
        assert other.stats("ur")[0].live == 4  # the sends committed; the block's did not
        # The block's lock on "job" lasts until its server notices the closed connection
        # (PostgreSQL: when the statement left in flight ends).
        got: list[tableq.Message] = []
        wait_until(lambda: got.extend(other.receive("ur", max=10)) or len(got) == 4, timeout=5)
        got.sort(key=lambda x: x.id)
        assert [x.payload for x in got] == ["job", "after 0", "after 1", "after 2"]
        assert [x.id for x in got] == [m.id, *ids]
        assert got[0].attempts == 1  # the block's receive was rolled back with it
        other.ack_many(got)


def test_a_batch_ack_that_finds_a_lease_lost_keeps_its_connection(db_url: str) -> None:
    """The batch ack's rollback when some lease is lost is tableq's own control flow, not an
    interruption: its connection stays pooled (the first version of the interrupt rule closed
    it on MariaDB, one reconnect per such ack)."""
    one = {} if db_url.startswith("sqlite") else {"pool_size": 1}
    with tableq.connect(db_url, migrate=True, **one) as q:
        q.send_many("al", [0, 1, 2])
        got = q.receive("al", max=3)
        got[1].nack()
        before = list(q._backend.pool._idle)
        with pytest.raises(LeaseLost):
            q.ack_many(got)
        assert q._backend.pool._idle == before
        assert [m.payload for m in q.peek("al")] == [1]


def test_the_pool_closes_a_connection_after_an_exception_tableq_did_not_raise_on_purpose(
    db_url: str,
) -> None:
    """In tableq's own statements any exception but a TableqError may have come mid-read (a
    value that does not decode, a bug): that connection is closed. A TableqError raised on
    purpose, and any exception a caller raises in its queue.transaction() block, leave it
    pooled (the block's transaction is rolled back)."""
    one = {} if db_url.startswith("sqlite") else {"pool_size": 1}
    with tableq.connect(db_url, migrate=True, **one) as q:
        backend = q._backend
        q.send("fx", 0, key="k")
        with q.transaction() as tx:  # the first one reads, once, which database it reaches
            tx.send("fx", 1, key="k")
        before = list(backend.pool._idle)
        with pytest.raises(DuplicateMessage):
            q.send("fx", 1, key="k", on_duplicate="error")
        assert backend.pool._idle == before
        with pytest.raises(RuntimeError, match="the caller's"):
            with q.transaction() as tx:
                tx.send("fx", 2)
                kept = tx.connection
                raise RuntimeError("the caller's")
        assert kept in backend.pool._idle
        idle = list(backend.pool._idle)
        used: list[Any] = []

        def failing(cur: Any) -> None:
            used.append(cur if q.dialect == "sqlite" else cur.connection)
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "as a decoder mid-read")

        with pytest.raises(UnicodeDecodeError):
            backend.run(failing)
        assert used[0] in idle and used[0] not in backend.pool._idle
        assert [m.payload for m in q.peek("fx")] == [0]


def test_json_text_payloads_are_stored_as_given_after_a_syntax_check(q: tableq.Queue) -> None:
    texts = ['{\n\t"a": [1, 2],\r\n "b\\\\": "x"}', " 7 ", '"s"', "null"]
    q.send_many("jt", [tableq.JsonText(t) for t in texts])
    Bulk(q).stage_many("job-jt", 0, "jt-staged", [tableq.JsonText(t) for t in texts])
    Bulk(q).publish_staged("job-jt", [0])
    want = [{"a": [1, 2], "b\\": "x"}, 7, "s", None]
    assert [m.payload for m in q.receive("jt", max=10)] == want
    assert [m.payload for m in q.receive("jt-staged", max=10)] == want
    for bad in ['{"a": NaN}', '{"a": 1} {"b": 2}', "", "{'a': 1}", '{"f": 1, "f": 2}',
                '[{"g": {"f": 1, "f": 1}}]']:  # a repeated key: databases keep different ones
        with pytest.raises(tableq.PayloadInvalid, match="not JSON text"):
            q.send("jt", tableq.JsonText(bad))
        with pytest.raises(tableq.PayloadInvalid, match="not JSON text"):
            Bulk(q).stage_many("job-jt2", 0, "jt", [1, tableq.JsonText(bad)])
    assert q.stats("jt")[0].live == 4  # the refused sends added nothing


def test_sends_without_options_validate_like_any_send(q: tableq.Queue) -> None:
    # A send with no options takes a per-topic template validated once; everything that is
    # still checked per call must still be refused, and a cached topic must not excuse the rest.
    from tableq.queue import PLAIN_TEMPLATES_MAX

    assert q.send("plain", {"n": 1}).status == "sent"
    for bad in ("", "bad\ntopic", 7, None):
        with pytest.raises(tableq.InvalidName):
            q.send(bad, {"n": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="on_duplicate"):
        q.send("plain", {"n": 2}, on_duplicate="overwrite")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="priority"):
        q.send("plain", {"n": 3}, priority=False)
    with pytest.raises(PayloadTooLarge):
        q.send("plain", "x" * (q.max_payload_bytes + 1))
    # More topics than the cache keeps: it starts over, and every send still lands.
    topics = [f"t{i}" for i in range(PLAIN_TEMPLATES_MAX + 5)]
    for topic in topics[-10:]:
        q.send(topic, {"topic": topic})
    for topic in topics:
        q._plain_template(topic)
    assert len(q._plain_templates) <= PLAIN_TEMPLATES_MAX
    assert [m.payload for m in q.receive(topics[-1])] == [{"topic": topics[-1]}]
    (first,) = q.receive("plain", max=10)
    assert first.payload == {"n": 1} and first.priority == 0 and first.kind is None


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_send_many_that_fails_halfway_on_the_callers_connection_leaves_nothing(
    db_url: str, autocommit: bool
) -> None:
    """A batch whose second key is taken, with on_duplicate="error", on the application's
    own connection: none of it stays in the caller's transaction (SQLite and MariaDB
    inserted row by row and kept the first), and the caller's own work in that transaction
    is neither lost nor committed by it (it wrote through a statement that returns rows,
    after which PyMySQL does not know a transaction is open). On an autocommit connection
    the batch is all or nothing too."""
    with tableq.connect(db_url, migrate=True) as q:
        q.send("outbox", "taken", key="k2")
        conn = driver_connection(db_url)
        temp = "TEMPORARY" if q.dialect == "mysql" else "TEMP"
        cur = conn.cursor()
        cur.execute(f"CREATE {temp} TABLE caller_orders (n INT)")
        conn.commit()

        def orders() -> int:
            cur.execute("SELECT count(*) FROM caller_orders")
            return int(cur.fetchone()[0])

        batch = [{"payload": i, "key": f"k{i}"} for i in (1, 2, 3)]
        try:
            if autocommit:
                if q.dialect == "sqlite":
                    conn.isolation_level = None
                elif q.dialect == "postgres":
                    conn.autocommit = True
                else:
                    conn.autocommit(True)
            else:
                cur.execute("INSERT INTO caller_orders (n) VALUES (7) RETURNING n")
                cur.fetchall()
            with pytest.raises(DuplicateMessage):
                q.send_many("outbox", batch, on_duplicate="error", connection=conn)
            if not autocommit:
                assert orders() == 1
                conn.rollback()  # the caller's work goes, and nothing of the batch stays
                assert orders() == 0
                assert sorted(m.key for m in q.peek("outbox", 10)) == ["k2"]
                with pytest.raises(DuplicateMessage):
                    q.send_many("outbox", batch, on_duplicate="error", connection=conn)
            q.send_many("outbox", [{"payload": 4, "key": "k4"}, {"payload": 5, "key": "k5"}],
                        on_duplicate="error", connection=conn)
            if not autocommit:
                conn.commit()
        finally:
            conn.close()
        assert sorted(m.key for m in q.peek("outbox", 10)) == ["k2", "k4", "k5"]


def test_a_transactions_messages_settle_in_it_while_it_runs(q: tableq.Queue) -> None:
    """nack, heartbeat and dead_letter of a message received in a transaction go through
    that transaction, as ack does (they went around it: a false LeaseLost on PostgreSQL, a
    wait on the transaction's own lock elsewhere), and roll back with it."""
    q.send_many("txm", [1, 2, 3])
    with q.transaction() as tx:
        a, b, c = tx.receive("txm", max=3, visibility_timeout=30)
        b2 = b.heartbeat(extend=600)
        assert b2.lease_expires_at is not None and a.lease_expires_at is not None
        assert b2.lease_expires_at > a.lease_expires_at
        a.nack(delay=300, error="later")
        c.dead_letter("poison")
    st = q.stats("txm")[0]
    assert (st.scheduled, st.in_flight, st.dead) == (1, 1, 1)
    (held,) = [m for m in q.peek("txm", 10) if m.id == b.id]
    assert held.available_at > q.now() + timedelta(seconds=500)
    q.send("txr", 1)
    with pytest.raises(RuntimeError), q.transaction() as tx:
        (m,) = tx.receive("txr")
        m.dead_letter("rolled back")
        raise RuntimeError("the block fails")
    st = q.stats("txr")[0]
    assert (st.ready, st.dead) == (1, 0)


def test_a_transaction_is_closed_after_its_block(q: tableq.Queue) -> None:
    """After the block its connection serves others: tx refuses, and a message received in
    it settles through the Queue (an ack used to run on the pooled connection, inside
    whatever transaction it served next, and could be rolled back with it)."""
    q.send_many("late", [1, 2])
    with q.transaction() as tx:
        first, second = tx.receive("late", max=2)
    assert not tx.open
    for call in (lambda: tx.send("late", 3), lambda: tx.ack(first),
                 lambda: tx.receive("late"), lambda: tx.connection):
        with pytest.raises(InvalidArgument, match="block has ended"):
            call()
    first.ack()
    second.nack(delay=300)
    st = q.stats("late")[0]
    assert (st.live, st.scheduled) == (1, 1)


def test_a_stale_delivery_beside_the_live_one_is_told_apart(q: tableq.Queue) -> None:
    """ack_many / heartbeat_many given the same message twice, under an old lease and the
    live one: only the live delivery counts (results were matched by id alone)."""
    q.send("dup", 1)
    (stale,) = q.receive("dup", visibility_timeout=0.1)
    (live,) = wait_until(lambda: q.receive("dup", visibility_timeout=60), timeout=5)
    held = q.heartbeat_many([stale, live], extend=60)
    assert [(m.id, m.lease) for m in held] == [(live.id, live.lease)]
    with pytest.raises(LeaseLost) as err:
        q.ack_many([live, stale])
    assert err.value.message_ids == [stale.id]
    assert q.stats("dup")[0].live == 0


def test_the_same_delivery_given_twice_is_settled_once(q: tableq.Queue) -> None:
    """Found by review (over HTTP: "lost": [id, id]): ack_many([m, m]) acked m, then reported
    it lost, twice; heartbeat_many([m, m]) extended it once and answered it twice."""
    q.send_many("twice", [1, 2])
    a, b = q.receive("twice", max=2)
    assert [m.id for m in q.heartbeat_many([a, a, b], extend=60)] == [a.id, b.id]
    q.ack_many([a, b, a])  # no LeaseLost: both were acked
    assert q.stats("twice")[0].live == 0


def test_send_many_refuses_a_string_or_a_dict_as_its_items(q: tableq.Queue) -> None:
    for items in ("abc", b"abc", {"payload": 1}):
        with pytest.raises(InvalidArgument, match="send_many takes a list"):
            q.send_many("items", items)  # type: ignore[arg-type]
    assert q.stats("items")[0].live == 0


def test_settling_on_something_that_is_not_a_connection_is_refused(q: tableq.Queue) -> None:
    q.send("conn", 1)
    (m,) = q.receive("conn")
    for call in (lambda: q.ack(m, connection=object()),
                 lambda: q.ack_many([m], connection="nope"),
                 lambda: q.nack(m, connection=5),
                 lambda: q.heartbeat(m, connection=5),
                 lambda: q.dead_letter(m, "x", connection=[])):
        with pytest.raises(InvalidArgument, match="connection= must be"):
            call()
    assert q.stats("conn")[0].in_flight == 1


@contextmanager
def _another_database(db_url: str, tmp_path: Any) -> Iterator[str]:
    """A migrated queue in a database other than db_url's, with the same table names: another
    SQLite file, PostgreSQL's `postgres` database with db_url's schema, another MariaDB
    database."""
    conftest = root_conftest()
    u = tableq.url.parse_url(db_url)
    if u.dialect == "sqlite":
        yield f"sqlite:///{tmp_path}/another.db"
    elif u.dialect == "mysql":
        yield from conftest.make_url("mysql", tmp_path)
    else:
        import psycopg

        schema = db_url.rpartition("schema=")[2]
        other = conftest._with_db(db_url, "postgres")
        try:
            yield other
        finally:
            with psycopg.connect(conftest._conninfo_pg(other), autocommit=True) as admin:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_connection_to_another_database_is_refused_and_changes_nothing(
    db_url: str, tmp_path: Any
) -> None:
    """connection= must reach the queue's own database. A connection to another one that holds
    tableq's tables too took the message there, where this queue never sees it."""
    with tableq.connect(db_url, migrate=True) as q, _another_database(db_url, tmp_path) as url2, \
            tableq.connect(url2, migrate=True) as elsewhere:
        q.send("conn", 1)
        (m,) = q.receive("conn")
        conn = driver_connection(url2)
        try:
            for call in (lambda: q.send("conn", 2, connection=conn),
                         lambda: q.send_many("conn", [3, 4], connection=conn),
                         lambda: q.ack(m, connection=conn),
                         lambda: q.dead_letter(m, "poison", connection=conn)):
                with pytest.raises(InvalidArgument, match="another database") as err:
                    call()
                assert "Nothing was changed" in str(err.value)
            conn.commit()
        finally:
            conn.close()
        assert elsewhere.peek("conn", 10) == [] and q.stats("conn")[0].in_flight == 1
        same = driver_connection(db_url)
        try:
            q.ack(m, connection=same)  # the queue's own database, on the caller's connection
            same.commit()
        finally:
            same.close()
        assert q.stats("conn")[0].live == 0


def test_a_connection_to_the_same_database_in_another_form_is_taken(
    db_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database check compares what the connections reach, not how they were opened or
    how the caller's connection decodes: a SQLite file by another path (the queue's relative
    to a directory since left), text as bytes and rows as dicts, PostgreSQL with naive
    timestamps (as Django's USE_TZ=False loads them) and short float text, PyMySQL with
    use_unicode=False."""
    u = tableq.url.parse_url(db_url)
    if u.dialect == "sqlite":
        import sqlite3

        monkeypatch.chdir(tmp_path)
        db_url = "sqlite:///relative.db"
        (tmp_path / "elsewhere").mkdir()
    with tableq.connect(db_url, migrate=True) as q:
        if u.dialect == "sqlite":
            monkeypatch.chdir(tmp_path / "elsewhere")
            conn = sqlite3.connect(str(tmp_path / "relative.db"))
            conn.text_factory = bytes
            conn.row_factory = lambda cur, row: {  # the sqlite3 docs' dict_factory
                d[0]: v for d, v in zip(cur.description, row, strict=True)}
        elif u.dialect == "postgres":
            from psycopg.types.datetime import TimestamptzLoader

            class Naive(TimestamptzLoader):
                def load(self, data: Any) -> Any:
                    return super().load(data).replace(tzinfo=None)

            conn = driver_connection(db_url)
            conn.adapters.register_loader("timestamptz", Naive)
            conn.execute("SET extra_float_digits = 0")
        else:
            conn = driver_connection(db_url, use_unicode=False)
        try:
            sent = q.send("forms", 1, connection=conn)
            conn.commit()
            assert sent.status == "sent" and isinstance(sent.id, int)
        finally:
            conn.close()
        assert [m.payload for m in q.peek("forms", 10)] == [1]


@pytest.mark.parametrize("fresh_url", ["mysql"], indirect=True)
def test_a_duplicate_on_a_found_rows_connection_is_a_duplicate(fresh_url: str) -> None:
    """MariaDB: a caller's PyMySQL connection with CLIENT.FOUND_ROWS (SQLAlchemy sets it)
    counts a duplicate key as one row, like an insert; the status still says duplicate."""
    db_url = fresh_url
    from pymysql.constants import CLIENT

    with tableq.connect(db_url, migrate=True) as q:
        conn = driver_connection(db_url, client_flag=CLIENT.FOUND_ROWS)
        try:
            first = q.send("fr", 1, key="k", connection=conn)
            again = q.send("fr", 2, key="k", connection=conn)
            same = q.send("fr", 1, key="k", on_duplicate="replace", connection=conn)
            conn.commit()
        finally:
            conn.close()
        assert (first.status, again.status, same.status) == ("sent", "duplicate", "replaced")
        assert first.id == again.id == same.id


@pytest.mark.parametrize("fresh_url", ["mysql"], indirect=True)
def test_a_payload_beyond_the_servers_packet_is_refused_before_it_is_sent(
    fresh_url: str,
) -> None:
    """MariaDB drops the connection of a statement beyond its max_allowed_packet, which read
    as "cannot reach the queue database" (and was retried). A payload that cannot fit is
    refused first, naming the server's setting."""
    with tableq.connect(fresh_url, migrate=True, max_payload_bytes=64 << 20) as q:
        limit = q._backend.packet_limit  # type: ignore[attr-defined]
        big = "x" * limit
        with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
            q.send("big", big)
        with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
            q.send_many("big", ["small", big])
        q.send("big", "x" * (limit // 2))  # fits in one statement
        assert q.stats("big")[0].live == 1


@pytest.mark.parametrize("fresh_url", ["sqlite"], indirect=True)
def test_a_write_beside_an_open_transaction_on_sqlite_is_refused_at_once(
    fresh_url: str,
) -> None:
    """SQLite: the block holds the one write lock, so a send, receive or second block on
    another connection from the same thread waited for it 3 x 10 s, then failed with
    'database is locked'. Now it is refused at once, saying what to do; reads still work."""
    import time

    with tableq.connect(fresh_url, migrate=True) as q:
        q.send("t", 1)
        started = time.monotonic()
        with q.transaction() as tx:
            for call in (lambda: q.send("t", 2), lambda: q.send_many("t", [3, 4]),
                         lambda: q.receive("t"), lambda: q.transaction().__enter__()):
                with pytest.raises(InvalidArgument, match="one write lock"):
                    call()
            assert q.stats("t")[0].ready == 1  # reads do not wait for the lock
            tx.send("t", 5)
        assert time.monotonic() - started < 5
        assert q.stats("t")[0].ready == 2
        q.send("t", 6)  # after the block, as before
        assert q.stats("t")[0].ready == 3
