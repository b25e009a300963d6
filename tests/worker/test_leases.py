"""The heartbeater and the completer against a real queue, every backend: due leases are
extended with one heartbeat_many per visibility timeout, lost ones are reported once, and an
ack batch with some lost leases acks the rest."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

import tableq
from tableq.message import Message
from tableq.testing import wait_until
from tableq.worker.completer import Completer
from tableq.worker.health import Health
from tableq.worker.heartbeat import Heartbeater


class Spy:
    """Records every heartbeat call the Heartbeater makes on `q`, then lets it through."""

    def __init__(self, q: tableq.Queue) -> None:
        self.many: list[tuple[float, list[int]]] = []
        self.single = 0
        self.lock = threading.Lock()
        real_many, real_one = q.heartbeat_many, q.heartbeat

        def heartbeat_many(msgs: list[Message], *, extend: Any = None) -> list[Message]:
            with self.lock:
                self.many.append((extend, [m.id for m in msgs]))
            return real_many(msgs, extend=extend)

        def heartbeat(msg: Message, **kw: Any) -> Message:
            with self.lock:
                self.single += 1
            return real_one(msg, **kw)

        q.heartbeat_many = heartbeat_many  # type: ignore[method-assign]
        q.heartbeat = heartbeat  # type: ignore[method-assign]

    def calls(self) -> list[tuple[float, list[int]]]:
        with self.lock:
            return list(self.many)


def lease_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if getattr(r, "event", None) == "lease_lost"]


@pytest.mark.parametrize("batched", [False, True], ids=["hold", "hold_many"])
def test_due_leases_are_extended_in_one_statement(q: tableq.Queue, batched: bool) -> None:
    q.send_many("hb", list(range(20)))
    sent = time.monotonic()
    msgs = q.receive("hb", max=20, visibility_timeout=0.6)
    spy = Spy(q)
    hb = Heartbeater(q)
    try:
        if batched:  # as the worker's fetcher holds what one receive leased
            hb.hold_many(msgs, 0.6, since=sent)
            hb.hold_many([], 0.6, since=sent)
        else:
            for m in msgs:
                hb.hold(m, 0.6)
        # Four beats of 0.2 s outlast the 0.6 s lease: only the extensions keep it.
        wait_until(lambda: len(spy.calls()) >= 4, timeout=10)
        assert q.stats("hb")[0].in_flight == 20
    finally:
        hb.close()
    assert spy.single == 0
    assert all(extend == 0.6 and sorted(ids) == sorted(m.id for m in msgs)
               for extend, ids in spy.calls())


def test_a_message_rescheduled_alone_leaves_its_batch_schedule(q: tableq.Queue) -> None:
    """A member of a held batch rescheduled on its own (a confirm) is beaten on its own
    schedule only: its entry from the batch is stale, not beaten as well."""
    q.send_many("hb5", [1, 2, 3])
    sent = time.monotonic()
    msgs = q.receive("hb5", max=3, visibility_timeout=0.6)
    spy = Spy(q)
    hb = Heartbeater(q)
    try:
        hb.hold_many(msgs, 0.6, since=sent)
        assert hb.confirm(msgs[0])
        wait_until(lambda: len(spy.calls()) >= 7, timeout=10)
        assert q.stats("hb5")[0].in_flight == 3
    finally:
        hb.close()
    beats = [ids for _, ids in spy.calls()]
    assert beats[0] == [msgs[0].id]  # the confirm's own extension
    assert all(len(ids) == len(set(ids)) for ids in beats)
    counts = [sum(m.id in ids for ids in beats[1:]) for m in msgs]
    assert max(counts) - min(counts) <= 1, counts


def test_each_visibility_timeout_gets_its_own_call(q: tableq.Queue) -> None:
    q.send_many("hb2", list(range(6)))
    short = q.receive("hb2", max=3, visibility_timeout=0.6)
    long = q.receive("hb2", max=3, visibility_timeout=1.2)
    spy = Spy(q)
    hb = Heartbeater(q)
    try:
        for m in short:
            hb.hold(m, 0.6)
        for m in long:
            hb.hold(m, 1.2)
        wait_until(lambda: sum(e == 1.2 for e, _ in spy.calls()) >= 2, timeout=10)
        assert q.stats("hb2")[0].in_flight == 6
    finally:
        hb.close()
    groups = {0.6: {m.id for m in short}, 1.2: {m.id for m in long}}
    for extend, ids in spy.calls():
        assert set(ids) == groups[extend]


def test_a_lease_missing_from_the_result_is_reported_lost_once(
        q: tableq.Queue, caplog: pytest.LogCaptureFixture) -> None:
    q.send_many("hb3", [1, 2, 3])
    msgs = q.receive("hb3", max=3, visibility_timeout=0.6)
    lost_cb: list[int] = []
    spy = Spy(q)
    hb = Heartbeater(q)
    with caplog.at_level(logging.WARNING, logger="tableq.worker"):
        try:
            for m in msgs:
                hb.hold(m, 0.6, on_lost=lambda m: lost_cb.append(m.id))
            q.ack(msgs[0])  # behind the heartbeater's back: its next extension finds no row
            wait_until(lambda: hb.is_lost(msgs[0]), timeout=10)
            n = len(spy.calls())
            wait_until(lambda: len(spy.calls()) >= n + 2, timeout=10)
        finally:
            hb.close()
    assert lost_cb == [msgs[0].id]
    assert lease_events(caplog) == [{"topic": "hb3", "id": msgs[0].id, "attempts": 1,
                                     "during": "heartbeat"}]
    assert not hb.is_lost(msgs[1]) and not hb.is_lost(msgs[2])
    # Once lost, a message is no longer extended; the others still are.
    assert all(msgs[0].id not in ids for _, ids in spy.calls()[n:])
    assert all(set(ids) == {msgs[1].id, msgs[2].id} for _, ids in spy.calls()[n:])


def test_a_dropped_message_is_neither_extended_nor_reported(
        q: tableq.Queue, caplog: pytest.LogCaptureFixture) -> None:
    q.send_many("hb4", [1, 2])
    a, b = q.receive("hb4", max=2, visibility_timeout=0.6)
    spy = Spy(q)
    hb = Heartbeater(q)
    with caplog.at_level(logging.WARNING, logger="tableq.worker"):
        try:
            hb.hold(a, 0.6)
            hb.hold(b, 0.6)
            hb.drop(a)
            q.ack(a)
            wait_until(lambda: len(spy.calls()) >= 2, timeout=10)
        finally:
            hb.close()
    assert all(ids == [b.id] for _, ids in spy.calls())
    assert lease_events(caplog) == []


def test_ack_batch_with_lost_leases_acks_the_rest(q: tableq.Queue) -> None:
    q.send_many("ack", list(range(5)))
    msgs = q.receive("ack", max=5)
    for m in (msgs[1], msgs[3]):
        q.ack(m)  # settled elsewhere: the completer's ack of these finds no lease
    verdicts: dict[int, str] = {}
    done = Completer(q, Health(), lambda s, v: verdicts.__setitem__(s.msg.id, v))
    # Hand the batch in under the completer's (reentrant) lock, so it is one ack_many.
    with done._cond:
        for m in msgs:
            done.ack(m, 0.01)
    done.close()
    assert sorted(i for i, v in verdicts.items() if v == "lost") == sorted(
        [msgs[1].id, msgs[3].id])
    assert sorted(i for i, v in verdicts.items() if v == "done") == sorted(
        [msgs[0].id, msgs[2].id, msgs[4].id])
    assert q.stats("ack")[0].live == 0


def test_outbox_rule_for_a_settlement_whose_earlier_try_may_have_committed(
        q: tableq.Queue) -> None:
    """An ack or release retried after an unknown outcome (reply lost): the row gone means
    the earlier try (or, after the lease, someone else) finished it; the row live under
    another lease means someone else took it."""
    from tableq.worker.completer import Completer, Settlement

    q.send_many("ob", list(range(4)))
    acked, taken, released, eo = q.receive("ob", max=4, visibility_timeout=60)
    q.ack(acked)  # the earlier try committed; its reply was "lost"
    q.nack(taken)
    (retaken,) = q.receive("ob")  # someone else holds it now
    assert retaken.id == taken.id
    with tableq.connect(q._backend.url.raw) as other:
        with other.transaction() as tx:  # an exactly-once commit whose reply was lost
            tx.ack(eo)
    verdicts: dict[int, str] = {}
    done = Completer(q, Health(), lambda s, v: verdicts.__setitem__(s.msg.id, v))
    for s in (Settlement("ack", acked, ambiguous=True), Settlement("ack", taken, ambiguous=True),
              Settlement("release", released, refund=True, ambiguous=True),
              Settlement("release", eo, refund=True, ambiguous=True, handler_ran=True)):
        done.settle(s)
    done.close()
    assert verdicts == {acked.id: "gone", taken.id: "lost", released.id: "done", eo.id: "gone"}
    assert sorted(m.id for m in q.peek("ob")) == sorted([taken.id, released.id])
    assert q.get(released.id).attempts == 0  # type: ignore[union-attr]  # refunded
