"""PostgreSQL: sends NOTIFY only while a listener waits for their topic
(0004_quiet_sends.sql; since 0005_wake_in_statements.sql the statements that send call
wake() themselves). NOTIFY makes committing senders take turns, so a send that no one
waits for must not notify; one that someone waits for must never be missed, whatever the
sender's transaction or timing. Observed from a plain LISTEN connection on the channel."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from workerhelpers import running

import tableq
from tableq.bulk import Bulk
from tableq.names import ANY_TOPIC
from tableq.testing import wait_until

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


@pytest.fixture
def heard(q: tableq.Queue, db_url: str) -> Iterator[Callable[..., list[str]]]:
    """heard(): the topics NOTIFYed on the queue's channel since the last call."""
    schema = db_url.split("schema=")[1]
    with psycopg.connect(db_url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'LISTEN "{schema}_wake"')

        def take(timeout: float = 0.3) -> list[str]:
            return [json.loads(n.payload)["topic"]
                    for n in conn.notifies(timeout=timeout, stop_after=50)]
        yield take


def test_a_send_notifies_only_while_a_listener_waits_for_its_topic(q, heard):
    q.send("a", 1)
    q.send_many("a", list(range(600)))  # by COPY, then wake_topics: the same rules
    assert heard() == []
    listener = q.listener(["a"])
    try:
        assert listener.wait(0.05) == []  # registered when made: the first wait just waits
        q.send("a", 2)
        assert heard() == ["a"] and listener.wait(1) == ["a"]
        q.send("b", 3)  # nobody waits for b
        assert heard() == [] and listener.wait(0.05) == []
        listener.pause()  # busy: sends stop notifying
        q.send("a", 4)
        assert heard() == []
        assert listener.wait(1) == [ANY_TOPIC]  # waiting again: look for work first
        q.send("a", 5)
        assert heard() == ["a"] and listener.wait(1) == ["a"]
    finally:
        listener.close()
    q.send("a", 6)  # the registration ended with the session
    assert heard() == []
    everything = q.listener()  # no topics: every topic
    try:
        q.send("z", 7)
        assert heard() == ["z"] and everything.wait(1) == ["z"]
    finally:
        everything.close()


def test_every_way_a_message_becomes_due_wakes_a_waiting_listener(q, heard):
    """Each statement that puts due rows in the table wakes the listener once per topic; a
    delayed or duplicate send wakes nobody."""
    listener = q.listener(["w"])

    def woken(what: str) -> None:
        assert heard() == ["w"], what
        assert listener.wait(1) == ["w"], what

    try:
        q.send("w", 1)
        woken("a single send")
        q.send("w", 2, key="k", on_duplicate="error")
        woken("a keyed send")
        q.send("w", 3, key="k", on_duplicate="ignore")
        assert heard() == [], "a duplicate ignored"
        q.send("w", 4, key="k", on_duplicate="replace")
        woken("a single replace")
        q.send_many("w", [5, 6, 7])
        woken("a batch, by arrays: once for the topic")
        q.send_many("w", list(range(600)))
        woken("a batch by COPY")
        q.send_many("w", [{"payload": i, "key": f"b{i}"} for i in range(3)],
                    on_duplicate="replace")
        woken("a keyed batch")
        q.send_many("w", [{"payload": i, "key": f"b{i}"} for i in range(3)],
                    on_duplicate="replace")
        woken("a batch of replaces")
        q.send("w", 8, delay=60)
        q.send_many("w", [9, 10], delay=60)
        assert heard() == [], "delayed sends"
        assert listener.wait(0.05) == []
        msg = q.receive("w")[0]
        q.nack(msg)
        woken("a nack back to now")
        q.dead_letter(q.receive("w")[0], "poison")
        assert heard() == []
        assert q.requeue_dead("w") == 1
        woken("a requeued dead letter")
        bulk = Bulk(q)
        bulk.stage_many("job1", 0, "w", [{"payload": 1, "key": "s1"}, {"payload": 2}])
        assert heard() == [], "staged rows are not due yet"
        assert bulk.publish_staged("job1", [0]) == 2
        woken("a published load")
    finally:
        listener.close()


def test_a_listener_looks_again_until_a_send_it_could_not_see_has_committed(q, heard):
    with q.transaction() as tx:
        q.send("o", "outbox", connection=tx.connection)  # looked for listeners: none yet
        listener = q.listener(["o"])
        try:
            for _ in range(3):  # the send is in flight: look, and again, backing off
                started = time.monotonic()
                assert listener.wait(5) == [ANY_TOPIC]
                assert time.monotonic() - started < 1
            assert q.receive("o") == []  # uncommitted yet
        except BaseException:
            listener.close()
            raise
    try:
        assert heard() == []  # it did not notify: the listener must look by itself
        assert listener.wait(5) == [ANY_TOPIC]  # it has ended: one more look finds it
        [msg] = q.receive("o")
        assert msg.payload == "outbox"
        assert listener.wait(0.2) == []  # settled: waits quietly
        q.send("o", "next")
        assert listener.wait(1) == ["o"]
    finally:
        listener.close()


def test_a_repeatable_read_sender_that_began_before_the_wait_still_notifies(q, heard, db_url):
    # Its snapshot predates the registration; a table of waiters would look empty to it.
    # The wait lock is seen by every snapshot.
    with psycopg.connect(db_url.split("?")[0], autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")  # the snapshot is taken
        listener = q.listener(["rr"])
        try:
            q.send("rr", 1, connection=conn)
            conn.commit()
            assert heard() == ["rr"] and listener.wait(1) == ["rr"]
        finally:
            listener.close()


def test_a_busy_worker_lets_sends_skip_notify_and_an_idle_one_hears_them(make_app, heard):
    app = make_app(poll_interval_min=10, poll_interval_max=10)
    release, started, seen = threading.Event(), threading.Event(), []

    @app.handler("job", concurrency=1)
    def handle(message):
        seen.append(message.payload)
        started.set()
        release.wait(10)

    app.queue.send("job", "first")
    worker = app.worker()
    with running(worker):
        assert started.wait(5)
        listener = worker._waker._listener
        # every thread busy for a while: its listener stops waiting
        wait_until(lambda: not listener._registered, timeout=5)
        heard(0.1)
        app.queue.send("job", "while busy")
        assert heard() == []
        release.set()
        wait_until(lambda: seen == ["first", "while busy"], timeout=5)
        wait_until(lambda: worker.waiting.is_set() and listener._registered
                   and listener._settled, timeout=5)
        heard(0.1)
        app.queue.send("job", "while idle")
        assert heard() == ["job"]
        wait_until(lambda: len(seen) == 3, timeout=5)  # long before its 10 s poll
