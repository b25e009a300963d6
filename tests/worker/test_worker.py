"""The worker runtime against every backend: success, retries with backoff measured on the
database clock, dead-lettering, timeouts, heartbeats, exactly-once rollback, forwarding,
periodic jobs with several workers, lease bounds. No sleeping to wait: wait_until."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter

import pytest
from workerhelpers import run_burst, running

from tableq.testing import wait_until
from tableq.worker import Backoff


def test_handler_success_acks_every_message_once(make_app):
    app = make_app()
    seen: list[int] = []
    lock = threading.Lock()

    @app.handler("emails", concurrency=4)
    def handle(message):
        with lock:
            seen.append(message.payload["n"])

    app.queue.send_many("emails", [{"n": i} for i in range(30)])
    worker = app.worker(burst=True)
    run_burst(worker)
    assert sorted(seen) == list(range(30))
    s = app.queue.stats("emails")[0]
    assert (s.ready, s.scheduled, s.in_flight, s.dead) == (0, 0, 0, 0)
    assert worker.stats["acked"] == 30


def test_async_handler(make_app):
    app = make_app()
    seen: list[int] = []

    @app.handler("a")
    async def handle(message):
        await asyncio.sleep(0)
        seen.append(message.payload)

    app.queue.send_many("a", [1, 2, 3])
    run_burst(app.worker(burst=True))
    assert sorted(seen) == [1, 2, 3]
    assert app.queue.stats("a")[0].live == 0


def test_retry_backoff_timing_on_database_clock(make_app):
    app = make_app(poll_interval_max=0.05)
    calls: list[tuple[int, float]] = []

    @app.handler("flaky", max_attempts=3, retry=Backoff(base=0.5, factor=2, jitter=False))
    def handle(message):
        calls.append((message.attempts, app.queue.now().timestamp()))
        raise RuntimeError(f"fail {message.attempts}")

    app.queue.send("flaky", {})
    with running(app.worker()):
        wait_until(lambda: app.queue.stats("flaky")[0].dead == 1, timeout=15)
    assert [a for a, _ in calls] == [1, 2, 3]
    gap1, gap2 = calls[1][1] - calls[0][1], calls[2][1] - calls[1][1]
    # Nominal delays 0.5 s then 1.0 s on the database clock: never early (exact lower
    # bounds), and the second at least double the first's nominal. The delays' exact values
    # are the pure Backoff tests' (test_units.py); the upper bound here only catches a delay
    # that is grossly wrong, with room for a busy machine's scheduling.
    assert 0.5 <= gap1 < 0.5 + 3.0, gap1
    assert 1.0 <= gap2 < 1.0 + 3.0, gap2
    (dead,) = app.queue.dead_letters("flaky")
    assert dead.attempts == 3
    assert "fail 3" in (dead.error or "")


def test_nack_records_error_and_backoff_in_available_at(make_app):
    app = make_app()
    marks: list[float] = []

    @app.handler("slowretry", retry=Backoff(base=30, jitter=False))
    def handle(message):
        marks.append(app.queue.now().timestamp())
        raise ValueError("nope")

    app.queue.send("slowretry", {"x": 1})
    with running(app.worker()):
        wait_until(lambda: app.queue.stats("slowretry")[0].scheduled == 1, timeout=10)
    (msg,) = app.queue.peek("slowretry")
    assert msg.attempts == 1
    assert "ValueError: nope" in (msg.last_error or "")
    delay = msg.available_at.timestamp() - marks[0]
    assert 29.5 <= delay <= 31.0, delay


def test_dead_letter_after_exactly_max_attempts(make_app):
    app = make_app()
    attempts: list[int] = []

    @app.handler("poison", max_attempts=4, retry=Backoff(base=0, jitter=False))
    def handle(message):
        attempts.append(message.attempts)
        raise KeyError("poison pill")

    app.queue.send("poison", {"bad": True})
    worker = app.worker(burst=True)
    run_burst(worker)
    assert attempts == [1, 2, 3, 4]
    (dead,) = app.queue.dead_letters("poison")
    assert dead.attempts == 4 and "poison pill" in (dead.error or "")
    assert worker.stats["dead_lettered"] == 1 and worker.stats["retried"] == 3


def test_timeout_counts_as_failure(make_app):
    app = make_app()
    release = threading.Event()

    @app.handler("hang", timeout=0.3, max_attempts=1)
    def handle(message):
        release.wait(10)  # a handler stuck on I/O; the test lets it go at the end

    try:
        app.queue.send("hang", {})
        started = time.monotonic()
        run_burst(app.worker(burst=True))
        assert time.monotonic() - started < 5
        (dead,) = app.queue.dead_letters("hang")
        assert "timed out after 0.3 s" in (dead.error or "")
    finally:
        release.set()


def test_async_timeout_cancels(make_app):
    app = make_app()
    cancelled = threading.Event()

    @app.handler("ahang", timeout=0.2, max_attempts=1)
    async def handle(message):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    app.queue.send("ahang", {})
    run_burst(app.worker(burst=True))
    wait_until(cancelled.is_set, timeout=5)
    assert app.queue.stats("ahang")[0].dead == 1


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_any_exception_a_handler_raises_is_its_failure(make_app, raised):
    """SystemExit and KeyboardInterrupt from a handler (sync, sync with a timeout, async)
    are failures like any other: retried, then dead-lettered with their error. Before, a
    sync handler's left its message in flight while the worker ran."""
    app = make_app()
    backoff = Backoff(base=0, jitter=False)

    @app.handler("exit.sync", max_attempts=2, retry=backoff)
    def plain(message):
        raise raised("bad input")

    @app.handler("exit.timed", max_attempts=2, retry=backoff, timeout=30)
    def timed(message):
        raise raised("bad input")

    @app.handler("exit.async", max_attempts=2, retry=backoff)
    async def coroutine(message):
        raise raised("bad input")

    topics = ["exit.sync", "exit.timed", "exit.async"]
    for topic in topics:
        app.queue.send_many(topic, [1, 2])
    worker = app.worker(burst=True)
    run_burst(worker)
    for topic in topics:
        dead = app.queue.dead_letters(topic)
        assert [d.attempts for d in dead] == [2, 2], topic
        assert all(raised.__name__ in (d.error or "") for d in dead), dead
        assert app.queue.stats(topic)[0].live == 0
    assert worker.stats["dead_lettered"] == 6 and worker.stats["retried"] == 6


def test_a_timeout_error_the_handler_raises_is_its_own_failure(make_app):
    """TimeoutError is concurrent.futures' timeout too: a handler that raises one itself
    (a socket, asyncio.wait_for) failed with its own error; it did not time out."""
    app = make_app()

    @app.handler("own.sync", max_attempts=1, timeout=30)
    def plain(message):
        raise TimeoutError("the payment service did not answer")

    @app.handler("own.async", max_attempts=1)
    async def coroutine(message):
        await asyncio.wait_for(asyncio.sleep(10), 0.01)

    app.queue.send("own.sync", 1)
    app.queue.send("own.async", 1)
    worker = app.worker(burst=True)
    run_burst(worker)
    (sync_dead,) = app.queue.dead_letters("own.sync")
    (async_dead,) = app.queue.dead_letters("own.async")
    assert "the payment service did not answer" in (sync_dead.error or "")
    assert "TimeoutError" in (async_dead.error or "")
    assert "timed out after" not in (sync_dead.error or "") + (async_dead.error or "")
    assert worker.stats["timed_out"] == 0 and worker.stats["dead_lettered"] == 2


def test_heartbeat_keeps_a_long_job_from_redelivery(make_app):
    # visibility_timeout 1 s, jobs of 3.2 s; a second worker polls the same topic all along.
    app = make_app(visibility_timeout=1)
    other = make_app(visibility_timeout=1)
    calls: list[int] = []
    lock = threading.Lock()

    def handle(message):
        with lock:
            calls.append(message.id)
        time.sleep(3.2)  # the long job itself

    app.handler("long", concurrency=8)(handle)
    other.handler("long", concurrency=8)(handle)
    sent = [r.id for r in app.queue.send_many("long", list(range(8)))]
    with running(app.worker()), running(other.worker()):
        wait_until(lambda: app.queue.stats("long")[0].live == 0, timeout=20)
    assert sorted(calls) == sorted(sent)  # each job ran once: no redelivery
    assert app.queue.stats("long")[0].dead == 0


def test_exactly_once_rolls_back_handler_writes_on_failure(make_app):
    app = make_app()
    runs: list[int] = []

    @app.handler("eo", mode="exactly_once", retry=Backoff(base=0, jitter=False))
    def handle(message):
        runs.append(message.attempts)
        message.transaction.send("effects", {"from": message.id, "attempt": message.attempts})
        if message.attempts == 1:
            raise RuntimeError("first try fails after writing")

    sent = app.queue.send("eo", {"v": 1})
    run_burst(app.worker(burst=True))
    assert runs == [1, 2]
    effects = app.queue.peek("effects", 10)
    assert [(m.payload["from"], m.payload["attempt"]) for m in effects] == [(sent.id, 2)]
    assert app.queue.stats("eo")[0].live == 0


def test_exactly_once_lease_lost_rolls_back(make_app):
    app = make_app()

    @app.handler("eo2", mode="exactly_once", max_attempts=1)
    def handle(message):
        message.transaction.send("effects2", {"n": 1})
        # The lease changes hands before the ack (here inside the same transaction, which
        # works on every backend; SQLite's single writer would block another connection).
        app.queue._backend.message_release(message.id, message.lease, 0.0, None, False,
                                  message.transaction.connection)

    app.queue.send("eo2", {})
    worker = app.worker(burst=True)
    run_burst(worker)
    assert app.queue.stats("effects2")[0].live == 0  # the handler's write was rolled back
    assert worker.stats["lease_lost"] == 1 and worker.stats["acked"] == 0
    assert app.queue.stats("eo2")[0].live == 1  # still there, never acked


def test_an_exactly_once_handler_settles_its_message_in_its_transaction(make_app):
    """A handler's own nack or dead_letter in exactly_once mode commits with its writes
    (before, it went around the transaction: on PostgreSQL and MariaDB the writes were
    rolled back while the dead letter stayed; on SQLite it waited on its own write lock)."""
    app = make_app()

    @app.handler("eo.self", mode="exactly_once", concurrency=2)
    def handle(message):
        n = message.payload
        message.transaction.send("eo.effects", n)
        if n % 3 == 0:
            message.nack(delay=300, error="later")
        elif n % 3 == 1:
            message.dead_letter("refused")
        # the rest return: the worker acks them in the transaction

    app.queue.send_many("eo.self", list(range(9)))
    worker = app.worker(burst=True)
    run_burst(worker)
    assert sorted(m.payload for m in app.queue.peek("eo.effects", 20)) == list(range(9))
    (stats,) = app.queue.stats("eo.self")
    assert (stats.live, stats.scheduled, stats.dead) == (3, 3, 3)
    assert {m.last_error for m in app.queue.peek("eo.self", 20)} == {"later"}
    assert {d.error for d in app.queue.dead_letters("eo.self")} == {"refused"}
    assert (worker.stats["acked"], worker.stats["retried"], worker.stats["dead_lettered"],
            worker.stats["lease_lost"]) == (3, 3, 3, 0)


def test_forward_sends_next_step_and_acks(make_app):
    app = make_app()
    got: list[dict] = []

    @app.handler("step1")
    def first(message):
        message.forward("step2", {"n": message.payload["n"] + 1}, key=f"k{message.id}")

    @app.handler("step2")
    def second(message):
        got.append(message.payload)

    app.queue.send("step1", {"n": 1})
    worker = app.worker(burst=True)
    run_burst(worker)
    assert got == [{"n": 2}]
    assert worker.stats["lease_lost"] == 0
    assert app.queue.stats("step1")[0].live == 0 and app.queue.stats("step2")[0].live == 0


def test_a_handler_that_settles_its_message_is_not_settled_again(make_app):
    """A handler's own ack, nack or dead_letter is the message's outcome: the worker neither
    acks it after the handler returns nor loses track of which run settled what, with many
    messages fetched ahead of their runs."""
    app = make_app()

    @app.handler("self", concurrency=4)
    def handle(message):
        n = message.payload
        if n % 3 == 0:
            message.nack(delay=300, error="later")
        elif n % 3 == 1:
            message.dead_letter("refused")
        elif n % 6 == 2:
            message.ack()
        # the rest return: the worker acks them

    app.queue.send_many("self", list(range(60)))
    worker = app.worker(burst=True)
    run_burst(worker)
    assert worker.stats["lease_lost"] == 0
    # Logged and counted as what the handler did, not as acks.
    assert (worker.stats["acked"], worker.stats["retried"],
            worker.stats["dead_lettered"]) == (20, 20, 20)
    (stats,) = app.queue.stats("self")
    assert (stats.live, stats.scheduled, stats.dead) == (20, 20, 20)
    assert sorted(m.payload for m in app.queue.peek("self", limit=100)) == list(range(0, 60, 3))
    assert {m.last_error for m in app.queue.peek("self", limit=100)} == {"later"}


def test_at_most_once_removes_before_running(make_app):
    app = make_app()
    seen: list[tuple[int, object]] = []

    @app.handler("amo", mode="at_most_once")
    def handle(message):
        # Recorded here, asserted below: the worker would swallow an assert in a handler.
        seen.append((message.attempts, app.queue.get(message.id)))
        raise RuntimeError("lost on purpose")

    app.queue.send("amo", {})
    worker = app.worker(burst=True)
    run_burst(worker)
    assert seen == [(1, None)]  # delivered once, and already gone while it ran
    s = app.queue.stats("amo")[0]
    assert (s.live, s.dead) == (0, 0)
    assert worker.stats["failed"] == 1


def test_at_most_once_never_prefetches(make_app):
    """Its receive removes the message: one held and never started would be gone, so even
    with prefetch asked for it takes only what its free thread starts."""
    app = make_app(prefetch=5)
    gate = threading.Event()

    @app.handler("amo-pf", mode="at_most_once", concurrency=1)
    def handle(message):
        gate.wait(10)

    app.queue.send_many("amo-pf", list(range(10)))
    worker = app.worker()
    try:
        with running(worker):
            wait_until(lambda: worker.lanes[0].running == 1, timeout=10)
            time.sleep(0.5)  # time for a (wrong) prefetch to happen, not a wait for a result
            assert app.queue.stats("amo-pf")[0].ready == 9
            gate.set()
            wait_until(lambda: app.queue.stats("amo-pf")[0].live == 0, timeout=15)
    finally:
        gate.set()


def test_leases_bounded_by_free_threads(make_app):
    app = make_app()
    gate = threading.Event()
    peak = Counter()

    @app.handler("bounded", concurrency=3)
    def handle(message):
        gate.wait(10)

    app.queue.send_many("bounded", list(range(20)))
    try:
        with running(app.worker()):
            wait_until(lambda: app.queue.stats("bounded")[0].in_flight == 3, timeout=10)
            for _ in range(5):
                peak["max"] = max(peak["max"], app.queue.stats("bounded")[0].in_flight)
            gate.set()
            wait_until(lambda: app.queue.stats("bounded")[0].live == 0, timeout=15)
    finally:
        gate.set()
    assert peak["max"] == 3


def test_threads_scale_with_backlog(make_app):
    app = make_app()
    gate = threading.Event()

    @app.handler("scaled", concurrency=(1, 4))
    def handle(message):
        gate.wait(10)

    worker = app.worker()
    (lane,) = worker.lanes
    try:
        with running(worker):
            assert lane.threads == 1  # the minimum, while idle
            app.queue.send_many("scaled", list(range(10)))
            wait_until(lambda: lane.running == 4, timeout=10)
            assert lane.threads == 4
            gate.set()
            wait_until(lambda: app.queue.stats("scaled")[0].live == 0, timeout=15)
    finally:
        gate.set()


def test_a_lane_parks_threads_beyond_what_its_handlers_need(make_app):
    from tableq.worker.lane import STUCK_MIN_S, active_threads

    app = make_app()
    app.handler("parked", concurrency=16)(lambda message: None)
    (lane,) = app.worker().lanes
    lane.buffer.append(object())  # a message waits
    for _ in range(8):
        lane.record(1e-5)
    target = active_threads(1e-5, 16)
    now = time.monotonic()
    lane.running = target
    lane._started = {i: now for i in range(target)}
    assert not lane._may_start()  # enough run for no-op handlers
    lane._started[0] = now - 2 * STUCK_MIN_S
    assert lane._may_start()  # one is stuck far beyond the typical run: another may start
    lane._started[0] = now
    for _ in range(32):
        lane.record(0.5)
    assert lane._may_start()  # slow handlers: every thread may run


def test_fast_handlers_run_on_few_threads_and_a_stuck_one_does_not_block_the_rest(make_app):
    """No-op handlers gain nothing from sixteen threads taking turns on one GIL: the lane
    keeps active_threads() of them running. A handler that then blocks far beyond the
    average does not hold up the messages behind it: a parked thread starts beside it."""
    from tableq.worker.lane import active_threads

    app = make_app()
    gate = threading.Event()
    lock = threading.Lock()
    now = {"running": 0, "done": 0}

    @app.handler("fast", concurrency=16)
    def handle(message):
        with lock:
            now["running"] += 1
        if message.payload == "block":
            gate.wait(30)
        with lock:
            now["running"] -= 1
            now["done"] += 1

    worker = app.worker()
    (lane,) = worker.lanes
    try:
        with running(worker):
            app.queue.send_many("fast", list(range(3000)))
            wait_until(lambda: app.queue.stats("fast")[0].live == 0, timeout=30)
            assert lane.threads == 16  # all there, most of them parked
            assert lane._active == active_threads(lane._typical, 16) < 16
            app.queue.send_many("fast", ["block"] * 3)
            app.queue.send_many("fast", list(range(200)))
            wait_until(lambda: now["done"] == 3200, timeout=20)  # all but the blocked ones
            assert now["running"] == 3
            gate.set()
            wait_until(lambda: app.queue.stats("fast")[0].live == 0, timeout=15)
    finally:
        gate.set()


def test_periodic_job_once_per_tick_with_three_workers(make_app):
    apps = [make_app() for _ in range(3)]
    ticks: list[str] = []
    lock = threading.Lock()

    def handle(message):
        with lock:
            ticks.append(message.headers["tableq-tick"])

    for app in apps:
        app.every("tick", seconds=1, payload={"job": "cleanup"})
        app.handler("tick")(handle)
    workers = [app.worker() for app in apps]
    with running(workers[0]), running(workers[1]), running(workers[2]):
        wait_until(lambda: len(set(ticks)) >= 5, timeout=20)
    counts = Counter(ticks)
    assert all(n == 1 for n in counts.values()), counts
    stamps = sorted(counts)
    from datetime import datetime

    seconds_ = [datetime.fromisoformat(s).timestamp() for s in stamps]
    # Consecutive ticks, none skipped, each one second apart.
    assert [round(b - a, 3) for a, b in itertools.pairwise(seconds_)] == [1.0] * (len(stamps) - 1)


def test_burst_waits_for_its_own_retries(make_app):
    app = make_app()
    runs: Counter[int] = Counter()

    @app.handler("transient", retry=Backoff(base=0.3, jitter=False))
    def handle(message):
        runs[message.payload] += 1
        if message.attempts < 3:
            raise ConnectionError("upstream timed out")

    app.queue.send_many("transient", list(range(5)))
    worker = app.worker(burst=True)
    run_burst(worker)
    assert runs == {n: 3 for n in range(5)}
    assert app.queue.stats("transient")[0].live == 0
    assert worker.stats["retried"] == 10 and worker.stats["acked"] == 5


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_burst_leaves_a_retry_the_handler_scheduled_itself_for_later(make_app, mode,
                                                                      caplog):
    """A handler's own message.nack(delay=...) is a decision to try later, like a send with
    a delay: the burst worker does not wait for it (docs/worker.md). Its retried line says
    when it is due (delay_s was missing for a handler's nack)."""
    app = make_app()
    runs: list[int] = []

    @app.handler("self-retry", mode=mode)
    def handle(message):
        runs.append(message.attempts)
        message.nack(delay=300, error="try later")

    app.queue.send("self-retry", 1)
    worker = app.worker(burst=True)
    caplog.set_level(logging.INFO, logger="tableq")
    started = time.monotonic()
    run_burst(worker)
    assert time.monotonic() - started < 30 and runs == [1]
    assert app.queue.stats("self-retry")[0].scheduled == 1
    (line,) = [r.fields for r in caplog.records if getattr(r, "event", None) == "retried"]
    assert line["delay_s"] == 300 and line["settled_by"] == "handler"


def test_a_message_whose_lease_lapsed_here_is_not_started_twice_in_this_worker(make_app,
                                                                               caplog):
    """Found by review: with its heartbeat stuck, a worker fetched the message it was still
    running and ran it a second time beside the first. The new delivery now goes back
    (uncharged, after a visibility timeout) with a warning, and runs once the first ends."""
    app = make_app()
    spans: list[tuple[int, float, float]] = []
    unstick = threading.Event()

    @app.handler("stuck", visibility_timeout=1)
    def handle(message):
        started = time.monotonic()
        time.sleep(2.5 if message.attempts == 1 else 0)
        spans.append((message.attempts, started, time.monotonic()))

    real = app.queue.heartbeat_many

    def stuck(msgs, **kw):  # a heartbeat that cannot get through
        unstick.wait(30)
        return real(msgs, **kw)

    app.queue.heartbeat_many = stuck
    app.queue.send("stuck", 1)
    worker = app.worker()
    caplog.set_level(logging.WARNING, logger="tableq")
    try:
        with running(worker):
            wait_until(lambda: len(spans) >= 2, timeout=20)
    finally:
        unstick.set()
    (first, a, b), (second, c, _) = sorted(spans, key=lambda x: x[1])[:2]
    assert b <= c, spans  # one after the other, never side by side in this process
    assert worker.stats["redelivered_while_held"] >= 1
    assert any(getattr(r, "event", None) == "redelivered_while_held" for r in caplog.records)


def test_a_message_dead_lettered_by_the_fetch_is_logged_and_counted(make_app, caplog):
    """Found by review: a message whose last deliveries ended without an ack (crashes) was
    dead-lettered by the worker's own claim with no log line and no count."""
    app = make_app()

    @app.handler("spent", max_attempts=3)
    def handle(message):
        raise AssertionError("never started: its attempts are spent")

    q = app.queue
    q.send("spent", 1)
    for _ in range(3):  # three deliveries that ended without an ack
        assert q.receive("spent", visibility_timeout=0.2, max_attempts=3)
        time.sleep(0.3)
    caplog.set_level(logging.ERROR, logger="tableq")
    worker = app.worker(burst=True)
    run_burst(worker)
    assert worker.stats["dead_lettered"] == 1
    (line,) = [r.fields for r in caplog.records
               if getattr(r, "event", None) == "dead_lettered_at_fetch"]
    assert line["topic"] == "spent" and line["count"] == 1
    assert q.stats("spent")[0].dead == 1


def test_burst_exits_on_empty_queue(make_app):
    app = make_app()

    @app.handler("empty")
    def handle(message):
        raise AssertionError("nothing to handle")

    started = time.monotonic()
    run_burst(app.worker(burst=True))
    assert time.monotonic() - started < 5


def _woken_after(app, topic: str, act) -> float:
    """Seconds from act() to the handler's start, for a worker parked in its idle wait with
    a 10 s poll interval: a pickup within a few seconds can only come from its listener
    (LISTEN/NOTIFY on PostgreSQL, the data_version watch on SQLite)."""
    picked = threading.Event()

    @app.handler(topic)
    def handle(message):
        picked.set()

    worker = app.worker()
    with running(worker):
        assert worker._waker is not None and worker._waker.listening
        assert worker._waker.mode == {"postgres": "notify", "sqlite": "data_version"}[
            app.queue.dialect]
        wait_until(worker.waiting.is_set, timeout=5)
        time.sleep(0.2)
        assert not picked.is_set()
        started = time.monotonic()
        act()
        wait_until(picked.is_set, timeout=9, interval=0.005)
        return time.monotonic() - started


@pytest.mark.parametrize("db_url", ["postgres", "sqlite"], indirect=True)  # with a listener
def test_notify_wakes_idle_worker(make_app, db_url):
    app = make_app(poll_interval_min=10, poll_interval_max=10)
    latency = _woken_after(app, "wake", lambda: app.queue.send("wake", {}))
    assert latency < 5.0, latency


@pytest.mark.parametrize("db_url", ["postgres", "sqlite"], indirect=True)  # with a listener
def test_a_nack_back_to_now_wakes_an_idle_worker(make_app, db_url):
    # Not a send: PostgreSQL's release NOTIFYs itself; SQLite's commit counter sees any change.
    app = make_app(poll_interval_min=10, poll_interval_max=10)
    app.queue.send("again", {})
    [held] = app.queue.receive("again", visibility_timeout=600)  # leased before the worker
    latency = _woken_after(app, "again", lambda: app.queue.nack(held, delay=0))
    assert latency < 5.0, latency


@pytest.mark.parametrize("db_url", ["postgres", "sqlite"], indirect=True)  # with a listener
@pytest.mark.parametrize("many", [False, True], ids=["send", "send_many"])
def test_a_replace_due_now_wakes_an_idle_worker(make_app, db_url, many):
    # Not an insert: PostgreSQL's replace NOTIFYs itself (the insert trigger sees inserted rows
    # only); SQLite's commit counter sees any change.
    app = make_app(poll_interval_min=10, poll_interval_max=10)
    app.queue.send("swap", {"v": 1}, key="k", delay=600)  # scheduled: the worker has no work

    def replace():
        if many:
            app.queue.send_many("swap", [{"payload": {"v": 2}, "key": "k"},
                                         {"payload": {"v": 3}, "key": "j", "delay": 600}],
                                on_duplicate="replace")
        else:
            app.queue.send("swap", {"v": 2}, key="k", on_duplicate="replace")
    latency = _woken_after(app, "swap", replace)
    assert latency < 5.0, latency


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # LISTEN/NOTIFY
def test_lost_listen_connection_falls_back_to_polling_then_reconnects(make_app, db_url,
                                                                      caplog, monkeypatch):
    import psycopg

    from tableq.worker import poller

    monkeypatch.setattr(poller, "LISTEN_RETRY_S", 0.2)
    app = make_app(poll_interval_max=0.3)
    picked: list[int] = []

    @app.handler("w2")
    def handle(message):
        picked.append(message.payload)

    schema = db_url.split("schema=")[1]
    worker = app.worker()
    with caplog.at_level("INFO", logger="tableq.worker"), running(worker):
        wait_until(worker.waiting.is_set, timeout=5)
        with psycopg.connect(db_url.split("?")[0], autocommit=True) as admin:
            # The waiting listener holds its topic's wait lock (0004_quiet_sends.sql).
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = "
                "'advisory' AND classid = hashtext(%s || '_wake_wait')::oid AND objsubid = 2 "
                "AND pid <> pg_backend_pid()", (schema,)).fetchone()[0]
        assert killed == 1
        app.queue.send("w2", 1)
        wait_until(lambda: picked == [1], timeout=5)  # polling still delivers
        wait_until(lambda: "listener_lost" in caplog.text, timeout=5)
        wait_until(lambda: "listener_restored" in caplog.text, timeout=5)
        assert worker.running.is_set() and worker._waker is not None
        assert worker._waker.listening


def test_a_lane_reserves_room_for_each_fetch_in_flight(make_app):
    from tableq.worker.lane import FETCH_MAX, HOLD_MAX

    app = make_app()

    @app.handler("room", concurrency=2)
    def handle(message):
        pass

    (lane,) = app.worker().lanes
    lane.avg_duration_s = 1e-5  # fast handlers: the lane holds HOLD_MAX beyond its threads
    assert lane.prefetch_target() == HOLD_MAX
    first = lane.reserve(FETCH_MAX)
    second = lane.reserve(FETCH_MAX)
    assert (first, second) == (FETCH_MAX, FETCH_MAX)  # two fetches in flight at once
    assert lane.want() == 0 and lane.reserve(FETCH_MAX) == 0  # and no third: room is taken
    assert lane.busy()
    lane.unreserve(first)  # a fetch that failed frees its room
    assert lane.want() == 2 + HOLD_MAX - second
    lane.stop()
    assert lane.reserve(FETCH_MAX) == 0  # a stopped lane is fetched for no more
    assert lane.put([], 0.0, second) is None  # what a fetch brings after the stop goes back
    assert lane.claiming == 0 and not lane.busy()


def _worker_loop_claims_slowed(queue, delay_s=0.02, then=None):
    """Makes the worker's own fetches slow (as a busy database would), so the fetch-ahead
    thread surely gets room to fetch; `then(got)` runs after each of its fetches."""
    real = queue._receive_deferred

    def claim(*args, **kwargs):
        ahead = threading.current_thread().name == "tableq-fetch-ahead"
        if not ahead:  # the worker's own loop
            time.sleep(delay_s)
        got = real(*args, **kwargs)
        if ahead and then is not None:
            then(got)
        return got

    queue._receive_deferred = claim


def test_a_backlog_is_fetched_by_two_threads_and_handled_once_each(make_app, db_url):
    app = make_app()
    seen: Counter = Counter()
    lock = threading.Lock()

    @app.handler("backlog", concurrency=4)
    def handle(message):
        with lock:
            seen[message.payload["n"]] += 1

    app.queue.send_many("backlog", [{"n": i} for i in range(6000)])
    _worker_loop_claims_slowed(app.queue)
    worker = app.worker(burst=True)
    run_burst(worker, timeout=120)
    assert len(seen) == 6000 and max(seen.values()) == 1
    assert app.queue.stats("backlog")[0].live == 0
    if db_url.startswith("sqlite"):
        assert worker.fetcher.ahead_fetched == 0  # claims take turns there: no second thread
    else:
        assert worker.fetcher.ahead_fetched > 0


def test_a_stop_mid_backlog_leaves_no_message_leased(make_app):
    """Whatever the fetch threads had fetched but not started when the worker stopped is
    given back at once: every message is handled once or receivable right away."""
    app = make_app()
    handled: list[int] = []
    lock = threading.Lock()

    @app.handler("stopped", concurrency=4, visibility_timeout=300)
    def handle(message):
        with lock:
            handled.append(message.id)

    sent = {r.id for r in app.queue.send_many("stopped", [{"n": i} for i in range(20000)])}
    _worker_loop_claims_slowed(app.queue)
    with running(app.worker()):
        wait_until(lambda: len(handled) >= 2000, timeout=60)
    assert len(handled) == len(set(handled)) and len(handled) < len(sent)
    left: set[int] = set()
    while batch := app.queue.receive("stopped", max=10_000, visibility_timeout=60):
        left.update(m.id for m in batch)
    assert left == sent - set(handled)


def test_a_fetch_ahead_that_ends_after_the_stop_gives_its_messages_back(make_app, db_url):
    app = make_app()

    @app.handler("late", concurrency=2, visibility_timeout=300)
    def handle(message):
        pass

    worker = app.worker(grace_period=2)
    if db_url.startswith("sqlite"):  # its claims take turns: no fetch-ahead thread at all
        with running(worker):
            assert worker.fetcher._ahead is None
            assert "tableq-fetch-ahead" not in {t.name for t in threading.enumerate()}
        return
    (lane,) = worker.lanes
    late: list[int] = []

    def answer_after_the_stop(got):  # the fetch-ahead's first claim answers only then
        if not late:
            late.extend(m.id for m, _ in got)
            wait_until(lambda: lane.stopping, timeout=30)

    app.queue.send_many("late", [{"n": i} for i in range(20000)])
    _worker_loop_claims_slowed(app.queue, then=answer_after_the_stop)
    with running(worker, timeout=40):
        wait_until(lambda: bool(late), timeout=30)
    s = app.queue.stats("late")[0]
    assert s.in_flight == 0  # nothing left leased: what came late went back
    back: set[int] = set()
    while batch := app.queue.receive("late", max=10_000, visibility_timeout=60):
        back.update(m.id for m in batch)
    assert set(late) <= back
