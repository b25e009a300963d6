"""Attempt accounting for workers, on every backend: a claim can leave prefetched messages
uncharged, a charge right before the handler starts counts the attempt (fenced by the lease),
and the dead-letter rule still buries a message after exactly max_attempts charged starts."""

from __future__ import annotations

import time

import pytest

import tableq


def test_deferred_receive_charges_only_the_first(q):
    q.send_many("t", [{"n": i} for i in range(5)])
    got = q._receive_deferred("t", max=5, charge=2)
    assert [charged for _, charged in got] == [True, True, False, False, False]
    msgs = [m for m, _ in got]
    assert [m.payload["n"] for m in msgs] == [0, 1, 2, 3, 4]
    assert [m.attempts for m in msgs] == [1, 1, 0, 0, 0]
    in_db = {m.id: m.attempts for m in q.peek("t", 10)}
    assert [in_db[m.id] for m in msgs] == [1, 1, 0, 0, 0]


def test_deferred_receive_charges_a_last_attempt_only_within_charge_last(q):
    q.send_many("t", [{"n": i} for i in range(6)])
    for m in q.receive("t", max=6):
        if m.payload["n"] % 2 == 0:
            q.nack(m)  # n even: one of two attempts used
        else:
            q.release(m)
    got = q._receive_deferred("t", max=6, charge=4, charge_last=1, max_attempts=2)
    assert [m.payload["n"] for m, _ in got] == [0, 1, 2, 3, 4, 5]
    # Within the first charge_last, a last attempt is charged; beyond it, within charge, only
    # the others are; beyond charge, nothing.
    assert [charged for _, charged in got] == [True, True, False, True, False, False]
    in_db = {m.id: m.attempts for m in q.peek("t", 10)}
    assert [in_db[m.id] for m, _ in got] == [2, 1, 1, 1, 1, 0]


def test_charge_counts_the_attempt_and_extends_the_lease(q):
    q.send_many("t", [1, 2, 3])
    msgs = [m for m, _ in q._receive_deferred("t", max=3, charge=0, visibility_timeout=1)]
    charged = q._charge(msgs[:2], extend=60)
    assert [m.attempts for m in charged] == [1, 1]
    pairs = zip(charged, msgs[:2], strict=True)
    assert all(c.lease_expires_at > m.lease_expires_at for c, m in pairs)
    # The lease is unchanged: the charged delivery acks as usual; the uncharged one too.
    q.ack_many([*charged, msgs[2]])
    assert q.stats("t")[0].live == 0


def test_a_charge_sent_twice_counts_once(q):
    # The worker sends a charge again when the database went away before its reply (the
    # COMMIT may have landed): the second must not spend a second attempt.
    q.send("t", 1)
    ((m, _),) = q._receive_deferred("t", max=1, charge=0)
    (first,) = q._charge([m])
    (second,) = q._charge([m])
    assert first.attempts == second.attempts == 1
    assert q.peek("t", 1)[0].attempts == 1
    q.ack(second)


def test_charge_is_fenced_by_the_lease(q):
    q.send("t", 1)
    ((m, _),) = q._receive_deferred("t", max=1, charge=0)
    q.nack(m)  # gives the lease up (no penalty is charged beyond what the receive did)
    assert q._charge([m]) == []
    (again,) = q.receive("t")
    assert again.attempts == 1  # the deferred delivery was never charged
    with pytest.raises(tableq.LeaseLost):
        q.ack(m)


def test_dead_lettered_after_exactly_max_attempts_charged_starts(q):
    q.send("t", "poison")
    runs = 0
    for _ in range(10):
        got = q._receive_deferred("t", max=1, charge=0, max_attempts=3)
        if not got:
            break
        (m,) = q._charge([m for m, _ in got])
        runs += 1
        q.nack(m, error=f"run {runs}")
    assert runs == 3
    (dead,) = q.dead_letters("t")
    assert dead.attempts == 3 and dead.error == "run 3"


def test_uncharged_deliveries_do_not_count(q):
    q.send("t", 1)
    for _ in range(8):  # a worker killed while holding it, again and again
        ((m, _),) = q._receive_deferred("t", max=1, charge=0, max_attempts=2,
                                        visibility_timeout=60)
        q.nack(m)
    assert q.stats("t")[0].dead == 0
    assert q.peek("t")[0].attempts == 0


def test_worker_never_charges_a_last_attempt_ahead_of_its_start(make_app):
    """Prefetched messages are charged in groups ahead of their start, except a message's
    last allowed attempt, which is charged only right before its own handler runs: so a
    worker killed at any moment never leaves a message dead-lettered without a run."""
    from workerhelpers import run_burst

    app = make_app(max_attempts=3, prefetch=60)
    q = app.queue
    q.send_many("w", [{"n": i} for i in range(200)])
    for _ in range(2):  # every other message has used two of its three attempts
        for m in q.receive("w", max=200):
            if m.payload["n"] % 2 == 0:
                q.nack(m)
            else:
                q.release(m)
    attempts_before = {m.id: m.attempts for m in q.peek("w", 200)}
    assert sorted(set(attempts_before.values())) == [0, 2]
    groups: list[list[int]] = []
    real = q._charge

    def charge(msgs, **kw):  # type: ignore[no-untyped-def]
        groups.append([m.id for m in msgs])
        return real(msgs, **kw)

    q._charge = charge  # type: ignore[method-assign]
    ran: list[int] = []

    @app.handler("w", concurrency=2)
    def handle(message):
        ran.append(message.payload["n"])
        time.sleep(0.002)

    run_burst(app.worker(burst=True))
    assert sorted(ran) == list(range(200)) and q.stats("w")[0].dead == 0
    assert any(len(g) > 1 for g in groups)  # charging ahead happened
    for g in groups:  # only the starting message (first) may be on its last attempt
        assert all(attempts_before[i] < 2 for i in g[1:]), g
