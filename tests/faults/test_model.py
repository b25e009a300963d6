"""S1: the queue against an in-memory model (Hypothesis stateful testing), on every backend,
with the database clock under the test's control (connect(test_clock=True): the clock stands
still and moves only by advance_clock, so due times and lease expiries are exact).

Rules: send, send_many, receive (max, visibility timeout, where, max_attempts), ack (stale
acks must raise LeaseLost and change nothing), nack with delay, heartbeat, dead_letter,
requeue_dead, purge, advance_clock. After every step: stats equal the model's counts, peek
lists the model's live messages in delivery order with their attempts and due times, and no
two live messages share (topic, key). Every receive must return exactly the model's top n by
(priority desc, available_at, id), burying what ran out of attempts on the way.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from sizes import size

import tableq
from tableq.testing import advance_clock

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 2
KEYS = st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"]))
PRIORITIES = st.sampled_from([-1, 0, 0, 1])
DELAYS = st.sampled_from([0, 0, 0, 5, 10, 30])
TOPIC = st.sampled_from([0, 0, 0, 1])  # mostly one topic, so operations meet each other
LEASES = st.sampled_from([5, 10, 30])
NS = st.integers(0, 2)
TOLERANCE = timedelta(milliseconds=1)  # SQLite keeps times as float seconds


@dataclass
class Live:
    id: int
    topic: str
    key: str | None
    n: int
    priority: int
    attempts: int
    avail: float  # seconds after the test clock's start
    lease: str | None = None


class QueueModel(RuleBasedStateMachine):
    """One example: fresh topics on the shared test database, the clock carrying on."""

    queue: tableq.Queue
    examples = 0
    tally: Counter[str] = Counter()

    deliveries = Bundle("deliveries")

    def __init__(self) -> None:
        super().__init__()
        QueueModel.examples += 1
        prefix = f"e{QueueModel.examples}"
        self.topics = [f"{prefix}a", f"{prefix}b"]
        self.q = QueueModel.queue
        self.t0 = self.q.now()
        self.now = 0.0
        self.live: dict[int, Live] = {}
        self.dead: dict[int, Live] = {}
        self.seen_ids: set[int] = set()

    # --- the model's own reading ------------------------------------------------------------

    def _order(self, topic: str) -> list[Live]:
        return sorted((m for m in self.live.values() if m.topic == topic),
                      key=lambda m: (-m.priority, m.avail, m.id))

    def _holder(self, topic: str, key: str | None) -> Live | None:
        if key is None:
            return None
        return next((m for m in self.live.values() if m.topic == topic and m.key == key), None)

    def _new(self, msg_id: int, topic: str, key: str | None, n: int, priority: int,
             delay: float) -> None:
        assert msg_id not in self.seen_ids, f"id {msg_id} handed out twice"
        self.seen_ids.add(msg_id)
        self.live[msg_id] = Live(msg_id, topic, key, n, priority, 0, self.now + delay)

    def _sent(self, result: tableq.SendResult, topic: str, key: str | None, n: int,
              priority: int, delay: float, on_duplicate: str) -> None:
        """Checks one send's result against the model and applies it."""
        held = self._holder(topic, key)
        if held is None:
            assert result.status == "sent", result
            self._new(result.id, topic, key, n, priority, delay)
        elif on_duplicate == "ignore":
            assert (result.status, result.id) == ("duplicate", held.id), result
        else:
            assert (result.status, result.id) == ("replaced", held.id), result
            held.n, held.priority, held.attempts = n, priority, 0
            held.avail, held.lease = self.now + delay, None

    # --- rules --------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        QueueModel.tally["examples"] += 1

    @rule(t=TOPIC, key=KEYS, n=NS, priority=PRIORITIES, delay=DELAYS,
          on_duplicate=st.sampled_from(["ignore", "replace", "error"]))
    def send(self, t: int, key: str | None, n: int, priority: int, delay: float,
             on_duplicate: str) -> None:
        topic = self.topics[t]
        held = self._holder(topic, key)
        if held is not None and on_duplicate == "error":
            with pytest.raises(tableq.DuplicateMessage) as err:
                self.q.send(topic, {"n": n}, key=key, priority=priority, delay=delay,
                            on_duplicate="error")
            assert err.value.existing_id in (held.id, None)
            return
        result = self.q.send(topic, {"n": n}, key=key, priority=priority, delay=delay,
                             on_duplicate=on_duplicate)
        self._sent(result, topic, key, n, priority, delay, on_duplicate)

    @rule(t=TOPIC, items=st.lists(st.tuples(KEYS, NS, PRIORITIES), min_size=1, max_size=5),
          delay=DELAYS, on_duplicate=st.sampled_from(["ignore", "replace"]))
    def send_many(self, t: int, items: list[tuple[str | None, int, int]], delay: float,
                  on_duplicate: str) -> None:
        topic = self.topics[t]
        results = self.q.send_many(
            topic, [{"payload": {"n": n}, "key": key, "priority": p} for key, n, p in items],
            delay=delay, on_duplicate=on_duplicate)
        assert len(results) == len(items)
        for result, (key, n, p) in zip(results, items, strict=True):
            self._sent(result, topic, key, n, p, delay, on_duplicate)  # as one after the other

    @rule(target=deliveries, t=TOPIC, max=st.integers(1, 3), vt=LEASES,
          where=st.sampled_from([None, None, None, {"key": "k1"}, {"key": "k2"}, {"n": 0},
                                 {"n": 1}]),
          max_attempts=st.sampled_from([None, None, None, 1, 2, 3]))
    def receive(self, t: int, max: int, vt: float, where: dict | None,
                max_attempts: int | None = None) -> object:
        topic = self.topics[t]
        limit = max_attempts or MAX_ATTEMPTS

        def matches(m: Live) -> bool:
            if where is None:
                return True
            return m.key == where["key"] if "key" in where else m.n == where["n"]

        expected: list[Live] = []
        for _ in range(10):  # as Queue.receive: claim again after burying spent messages
            due = [m for m in self._order(topic) if m.avail <= self.now and matches(m)
                   and m not in expected]  # leased by an earlier pass: no longer due
            due = due[: max - len(expected)]
            spent = [m for m in due if m.attempts >= limit]
            for m in spent:
                self.dead[m.id] = self.live.pop(m.id)
            self.tally["dead-lettered at receive"] += len(spent)
            expected += [m for m in due if m.attempts < limit]
            if len(expected) >= max or not spent:
                break
        got = self.q.receive(topic, max=max, visibility_timeout=vt, where=where,
                             max_attempts=max_attempts)
        assert [m.id for m in got] == [m.id for m in expected], (got, expected)
        for msg, m in zip(got, expected, strict=True):
            m.attempts += 1
            m.avail = self.now + vt
            m.lease = msg.lease
            assert msg.attempts == m.attempts and msg.payload == {"n": m.n}
            assert abs(msg.available_at - (self.t0 + timedelta(seconds=m.avail))) < TOLERANCE
        self.tally["received"] += len(got)
        return multiple(*got)  # each delivery may be settled (or settled late) on its own

    @rule(target=deliveries, max=st.integers(1, 3), vt=LEASES)
    def receive_first_topic(self, max: int, vt: float) -> object:
        """Unfiltered receives are the common case: a second rule makes them more frequent."""
        return self.receive(0, max, vt, None)

    @rule(t=TOPIC)
    def fail_once(self, t: int) -> None:
        """A handler that fails at once: receive one message and nack it without delay, so
        attempts add up and later receives dead-letter spent messages."""
        got = self.receive(t, 1, 10, None)
        for msg in got.values:
            self.nack(msg, 0)

    @rule(seconds=st.sampled_from([5, 10, 30]))
    def advance_more(self, seconds: float) -> None:
        self.advance(seconds)

    def _holds(self, msg: tableq.Message) -> Live | None:
        m = self.live.get(msg.id)
        return m if m is not None and m.lease == msg.lease else None

    @rule(msg=deliveries)
    def ack(self, msg: tableq.Message) -> None:
        m = self._holds(msg)
        if m is None:
            with pytest.raises(tableq.LeaseLost):
                self.q.ack(msg)
            self.tally["stale acks rejected"] += 1
            return
        self.q.ack(msg)
        del self.live[m.id]

    @rule(msg=deliveries, delay=DELAYS)
    def nack(self, msg: tableq.Message, delay: float) -> None:
        m = self._holds(msg)
        if m is None:
            with pytest.raises(tableq.LeaseLost):
                self.q.nack(msg, delay=delay, error="model nack")
            self.tally["stale nacks rejected"] += 1
            return
        self.q.nack(msg, delay=delay, error="model nack")
        m.lease, m.avail = None, self.now + delay

    @rule(msg=deliveries, extend=LEASES)
    def heartbeat(self, msg: tableq.Message, extend: float) -> None:
        m = self._holds(msg)
        if m is None:
            with pytest.raises(tableq.LeaseLost):
                self.q.heartbeat(msg, extend=extend)
            self.tally["stale heartbeats rejected"] += 1
            return
        renewed = self.q.heartbeat(msg, extend=extend)
        m.avail = self.now + extend
        assert abs(renewed.available_at - (self.t0 + timedelta(seconds=m.avail))) < TOLERANCE

    @rule(msg=deliveries)
    def dead_letter(self, msg: tableq.Message) -> None:
        m = self._holds(msg)
        if m is None:
            with pytest.raises(tableq.LeaseLost):
                self.q.dead_letter(msg, "model dead letter")
            return
        self.q.dead_letter(msg, "model dead letter")
        self.dead[m.id] = self.live.pop(m.id)

    @rule(t=TOPIC)
    def requeue_dead(self, t: int) -> None:
        topic = self.topics[t]
        moved = 0
        for msg_id in sorted(i for i, m in self.dead.items() if m.topic == topic):
            m = self.dead[msg_id]
            if self._holder(topic, m.key) is not None:
                continue  # its key is live again: it stays dead
            del self.dead[msg_id]
            m.attempts, m.avail, m.lease = 0, self.now, None
            self.live[msg_id] = m
            moved += 1
        assert self.q.requeue_dead(topic) == moved

    @rule(t=TOPIC)
    def purge(self, t: int) -> None:
        topic = self.topics[t]
        gone = [i for i, m in self.live.items() if m.topic == topic]
        assert self.q.purge(topic) == len(gone)
        for i in gone:
            del self.live[i]

    @rule(seconds=st.sampled_from([1, 5, 10, 30]))
    def advance(self, seconds: float) -> None:
        advance_clock(self.q, seconds)
        self.now += seconds

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        QueueModel.tally["steps checked"] += 1
        for topic in self.topics:
            order = self._order(topic)
            (s,) = self.q.stats(topic)
            ready = sum(m.avail <= self.now for m in order)
            scheduled = sum(m.avail > self.now and m.lease is None for m in order)
            in_flight = sum(m.avail > self.now and m.lease is not None for m in order)
            dead = sum(m.topic == topic for m in self.dead.values())
            assert (s.ready, s.scheduled, s.in_flight, s.dead) == (
                ready, scheduled, in_flight, dead), (topic, s)
            peeked = self.q.peek(topic, limit=100)
            assert [p.id for p in peeked] == [m.id for m in order], topic
            for p, m in zip(peeked, order, strict=True):
                assert (p.attempts, p.priority, p.key, p.payload) == (
                    m.attempts, m.priority, m.key, {"n": m.n}), (p, m)
                assert abs(p.available_at - (self.t0 + timedelta(seconds=m.avail))) < TOLERANCE
            keys = [p.key for p in peeked if p.key is not None]
            assert len(keys) == len(set(keys)), f"two live messages share a key on {topic}"
            dead_ids = sorted(d.id for d in self.q.dead_letters(topic, limit=1000))
            assert dead_ids == sorted(i for i, m in self.dead.items() if m.topic == topic)


def test_queue_matches_its_model(db_url: str) -> None:
    dialect = db_url.split(":", 1)[0].replace("postgresql", "postgres")
    # The scale multiplies the examples; the steps per example stay 30 unless set.
    examples = size("s1_examples", 100)
    steps = int(os.environ.get("TABLEQ_FAULT_S1_STEPS", "30"))
    q = tableq.connect(db_url, migrate=True, test_clock=True, max_attempts=MAX_ATTEMPTS)
    QueueModel.queue, QueueModel.examples, QueueModel.tally = q, 0, Counter()
    try:
        run_state_machine_as_test(QueueModel, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
            suppress_health_check=list(HealthCheck), print_blob=True))
    finally:
        q.close()
    t = QueueModel.tally
    print(f"\nS1/{dialect}: 0 divergences in {t['examples']} examples x up to {steps} steps "
          f"({t['steps checked']} states checked, {t['received']} messages received, "
          f"{t['dead-lettered at receive']} dead-lettered at receive, "
          f"{t['stale acks rejected']} stale acks, {t['stale nacks rejected']} stale nacks and "
          f"{t['stale heartbeats rejected']} stale heartbeats got LeaseLost)")


def test_requeue_of_dead_letters_sharing_a_key(q: tableq.Queue) -> None:
    """Found while writing the model: two dead letters with one key, requeued together. The
    first goes back and the second stays dead (its key is live again) on every backend; MySQL
    used to fail the whole call with DatabaseBusy after a second of retries."""
    for i in range(2):
        q.send("t", {"i": i}, key="k")
        (m,) = q.receive("t")
        m.dead_letter("poison")
    first, second = (d.id for d in q.dead_letters("t"))
    assert q.requeue_dead("t") == 1
    assert [(m.id, m.key) for m in q.peek("t")] == [(first, "k")]
    assert [d.id for d in q.dead_letters("t")] == [second]
