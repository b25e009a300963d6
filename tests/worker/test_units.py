"""Pure parts of the worker, no database: backoff, the retry decision, adaptive polling,
periodic ticks, log line format, App validation."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta

import pytest

from tableq.errors import ConfigurationError, InvalidArgument
from tableq.worker import App, Backoff, PeriodicJob, PollPolicy, events
from tableq.worker.heartbeat import heartbeat_interval
from tableq.worker.periodic import next_tick, plan, send_margin_s, tick_key
from tableq.worker.retry import decide


def test_backoff_grows_and_caps():
    b = Backoff(base=1, factor=2, max=10, jitter=False)
    assert [b.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert b.delay(10_000) == 10  # no overflow


def test_backoff_jitter_stays_in_half_to_full():
    b = Backoff(base=4, factor=3, max=100, jitter=True)
    rng = random.Random(7)
    for attempt in range(1, 8):
        nominal = b.nominal(attempt)
        for _ in range(50):
            assert nominal / 2 <= b.delay(attempt, rng) <= nominal


@pytest.mark.parametrize("kwargs", [{"base": -1}, {"factor": 0.5}, {"max": float("nan")},
                                    {"base": "1"}])
def test_backoff_rejects_bad_values(kwargs):
    with pytest.raises(InvalidArgument):
        Backoff(**kwargs)


def test_decide():
    b = Backoff(base=2, jitter=False)
    assert decide(succeeded=True, attempts=5, max_attempts=5, backoff=b, error=None).action == "ack"
    d = decide(succeeded=False, attempts=2, max_attempts=5, backoff=b, error="x")
    assert (d.action, d.delay_s, d.error) == ("retry", 4.0, "x")
    assert decide(succeeded=False, attempts=5, max_attempts=5, backoff=b,
                  error="x").action == "dead_letter"


def test_poll_policy_drains_then_backs_off():
    p = PollPolicy(interval_min_s=0.1, interval_max_s=1.0)
    assert p.next_delay(0.0, True) == 0.0
    delays, d = [], 0.0
    for _ in range(6):
        d = p.next_delay(d, False)
        delays.append(d)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert p.next_delay(1.0, True) == 0.0
    with pytest.raises(InvalidArgument):
        PollPolicy(interval_min_s=2, interval_max_s=1)


def test_poll_policy_caps_a_polling_worker_shorter_than_a_listening_one():
    # Without a listener (MariaDB, use_notify=False) nothing ends the wait early, so the
    # default cap keeps a send's pickup within 0.08 s; with one, hints do and 2 s is enough.
    p = PollPolicy()
    assert (p.cap(listening=True), p.cap(listening=False)) == (2.0, 0.08)
    d = 0.0
    for _ in range(20):
        d = p.next_delay(d, False, listening=False)
    assert d == 0.08
    assert PollPolicy(interval_max_s=5.0).cap(listening=False) == 5.0  # a set cap is kept
    assert PollPolicy(interval_min_s=0.5).cap(listening=False) == 0.5  # never below the floor


def test_heartbeat_interval_is_a_third_of_the_lease():
    assert heartbeat_interval(30) == 10
    assert heartbeat_interval(0.01) == 0.05


def test_interval_ticks_align_to_epoch():
    job = PeriodicJob("cleanup", "cleanup", None, 300)
    now = datetime(2026, 1, 1, 12, 3, 10, tzinfo=UTC)
    assert next_tick(job, now) == datetime(2026, 1, 1, 12, 5, tzinfo=UTC)
    assert next_tick(job, datetime(2026, 1, 1, 12, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 12, 10, tzinfo=UTC)
    assert tick_key(job, next_tick(job, now)) == "every:cleanup@2026-01-01T12:05:00.000+00:00"


def test_cron_ticks():
    job = PeriodicJob("report", "reports", "0 3 * * *", None)
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert next_tick(job, now) == datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
    assert job.period_s(now) == 86400


def test_plan_skips_a_tick_too_close_to_send():
    job = PeriodicJob("p", "p", None, 10)
    tick = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    margin = send_margin_s(10)
    assert plan(job, tick - timedelta(seconds=5)) .send
    assert not plan(job, tick - timedelta(seconds=margin / 2)).send


@pytest.mark.parametrize("kwargs", [{}, {"cron": "* * * * *", "seconds": 5},
                                    {"cron": "not cron"}, {"seconds": 0.5}])
def test_every_rejects_bad_schedules(kwargs):
    with pytest.raises(InvalidArgument):
        App("sqlite:///unused.db").every("job", **kwargs)


def test_handler_validation():
    app = App("sqlite:///unused.db")
    with pytest.raises(InvalidArgument, match="mode"):
        app.handler("t", mode="twice")
    with pytest.raises(InvalidArgument, match="concurrency"):
        app.handler("t", concurrency=0)
    with pytest.raises(InvalidArgument, match="Backoff"):
        app.handler("t", retry=5)  # type: ignore[arg-type]
    app.handler("t")(lambda m: None)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        app.handler("t")(lambda m: None)
    with pytest.raises(ConfigurationError, match="no handler for topic"):
        app.worker(["other"])


def test_event_lines_are_key_value(caplog):
    with caplog.at_level(logging.INFO, logger="tableq.worker"):
        events.emit(events.RETRIED, topic="emails", id=4, attempts=2, delay_s=1.5,
                    error="ValueError: no such user", skipped=None)
    (record,) = caplog.records
    assert record.getMessage() == ('retried topic=emails id=4 attempts=2 delay_s=1.5 '
                                   'error="ValueError: no such user"')
    assert record.event == "retried" and record.fields["id"] == 4


# --- outages: classification, retry delays, the health state, the outbox's rule -----------


def test_outage_classification():
    from tableq.errors import (
        DatabaseBusy,
        DatabaseError,
        DatabaseTimeout,
        DatabaseUnavailable,
        LeaseLost,
        StorageFull,
    )
    from tableq.worker.health import is_outage, public_kind

    for exc in (DatabaseUnavailable("db", "refused"), DatabaseBusy("db", "locked"),
                DatabaseTimeout("db", "cancelled", "wait"), StorageFull("db", "full")):
        assert is_outage(exc)
    for exc in (DatabaseError("bad SQL"), LeaseLost("t", 1), ValueError("x"), None):
        assert not is_outage(exc)
    from tableq.backends.base import TransientError

    assert public_kind(TransientError("locked")) == "DatabaseBusy"


def test_outage_retry_delay_doubles_with_jitter_and_caps():
    from tableq.worker.health import RETRY_MAX_S, RETRY_MIN_S, retry_delay

    rng = random.Random(3)
    for attempt in range(40):
        nominal = min(RETRY_MAX_S, RETRY_MIN_S * 2**attempt)
        for _ in range(20):
            assert nominal / 2 <= retry_delay(attempt, rng) <= nominal
    assert retry_delay(10_000, rng) <= RETRY_MAX_S


def test_health_logs_an_outage_once_and_a_blip_at_debug(caplog):
    from tableq.errors import DatabaseError, DatabaseUnavailable
    from tableq.worker import health as health_mod

    recovered: list[int] = []
    clock = [100.0]
    h = health_mod.Health(clock=lambda: clock[0])
    h.on_recovery(lambda: recovered.append(1))
    with caplog.at_level(logging.DEBUG, logger="tableq.worker"):
        assert not h.failed(DatabaseError("bad SQL"), "ack") and h.up
        # A cut connection that heals at once: DEBUG only.
        assert h.failed(DatabaseUnavailable("db", "reset"), "fetch") and not h.up
        clock[0] += 0.05
        h.ok()
        assert h.up and h.blips == 1 and h.outages == 0
        # An outage: many parts fail, one WARNING once it lasted; one INFO when it ends.
        for during in ("fetch", "ack", "heartbeat", "ack", "start"):
            assert h.failed(DatabaseUnavailable("db", "refused"), during)
            clock[0] += 0.3
        assert not h.wait_up(0)
        h.ok()
        h.ok()
    lines = [(r.levelname, r.event) for r in caplog.records]  # type: ignore[attr-defined]
    assert lines == [("DEBUG", "database_blip"), ("WARNING", "database_unreachable"),
                     ("INFO", "database_reachable")]
    first = [r for r in caplog.records if r.event == "database_unreachable"][0]
    assert first.fields["during"] == "fetch"  # type: ignore[attr-defined]
    assert h.outages == 1 and recovered == [1, 1]


def test_not_held_verdicts():
    from tableq.worker.completer import not_held_verdict

    for action in ("ack", "nack", "dead_letter", "release"):
        assert not_held_verdict(action, False, None) == "lost"  # no earlier try: lost
        assert not_held_verdict(action, True, False) == "gone"  # the earlier try did it
    assert not_held_verdict("ack", True, True) == "lost"  # live under someone else's lease
    assert not_held_verdict("dead_letter", True, True) == "lost"
    assert not_held_verdict("nack", True, True) == "done"  # asked for a redelivery anyway
    assert not_held_verdict("release", True, True) == "done"


def test_charge_pace_is_not_slowed_by_the_charges_it_sizes():
    from tableq.worker.lane import CHARGE_AHEAD_S, charge_pace, charge_window

    assert charge_pace(None, None, 4) is None
    assert charge_pace(0.01, None, 4) == 0.01  # no handler has finished yet
    assert charge_pace(None, 0.004, 4) == 0.001
    # Starts 16 ms apart because each waited for its own charge, handlers of 0.1 ms: sized
    # by the gap, the window stays at one message per charge; by the handlers, it covers
    # what they start in CHARGE_AHEAD_S.
    assert charge_window(0.016) == 1
    assert charge_window(charge_pace(0.016, 0.0001, 1)) == int(CHARGE_AHEAD_S / 0.0001)
    assert charge_pace(0.5, 2.0, 4) == 0.5  # slow handlers: the measured gap is shorter


def test_charge_window():
    from tableq.worker.lane import CHARGE_AHEAD_S, FETCH_MAX, charge_window

    assert charge_window(None) == 0  # not measured yet: only what starts now
    assert charge_window(1.0) == 0  # slow jobs: never charged ahead
    assert charge_window(CHARGE_AHEAD_S / 10) == 10
    assert charge_window(0.5) == 0
    assert charge_window(1e-9) == FETCH_MAX


def test_active_threads_follow_the_handlers_duration():
    from tableq.worker.lane import RUN_PER_THREAD_S, active_threads

    assert active_threads(None, 16) == 2  # not measured yet: two, more once measured
    assert active_threads(0.5, 16) == 16  # slow handlers: threads overlap their waits
    assert active_threads(0.0, 16) == 2  # no-op handlers: one runs while one is handed off
    assert active_threads(4 * RUN_PER_THREAD_S, 16) == 6
    assert active_threads(1e-6, 1) == 1  # never more than the maximum
    assert active_threads(0.0, 16, per_thread_s=1.0) == 2


def test_a_typical_run_ignores_the_odd_wait_for_the_gil():
    from tableq.worker.lane import RUNS_MEASURED, typical_run

    assert typical_run([]) is None
    assert typical_run([1e-5] * (RUNS_MEASURED - 1)) is None  # too few yet
    assert typical_run([1e-5] * 20 + [0.005] * 3) == 1e-5
    assert typical_run([0.01] * 20 + [1e-5] * 3) == 0.01


def test_a_handler_far_beyond_the_average_is_stuck():
    from tableq.worker.lane import STUCK_MIN_S, counts_as_busy

    assert counts_as_busy(10.0, 10.0 + STUCK_MIN_S / 2, 1e-5)
    assert not counts_as_busy(10.0, 10.0 + STUCK_MIN_S * 2, 1e-5)
    assert counts_as_busy(10.0, 13.0, 1.0)  # within four times a slow lane's average
    assert not counts_as_busy(10.0, 15.0, 1.0)
    assert not counts_as_busy(10.0, 11.0, None)
