"""Settling: what each handler's outcome means for its message (ack, retry with backoff,
dead-letter, release, or nothing when the handler settled it itself or the lease was lost),
handed to the completer's outbox while the heartbeater keeps the lease; the answers logged and
counted. Owns the worker's heartbeater, completer and counters, and the Tracker that stands in
for the Queue inside a handler's Message. Never dead-letters a message for an outage. Queue
API only; no SQL."""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from tableq.errors import TableqError
from tableq.message import Message, OnDuplicate, SendResult
from tableq.queue import Queue, seconds
from tableq.worker import events
from tableq.worker.completer import Completer, Settlement, Verdict
from tableq.worker.executor import Outcome
from tableq.worker.health import Health, is_outage
from tableq.worker.heartbeat import Heartbeater
from tableq.worker.retry import decide
from tableq.worker.spec import HandlerSpec

P = TypeVar("P")
# The level of a handler's own settlement, as when the worker settles the same way.
_LEVEL = {events.RETRIED: logging.WARNING, events.DEAD_LETTERED: logging.ERROR}


class Tracker:
    """Stands in for the Queue inside a handler's Message (a message.Settler), to notice
    when the handler settles the message itself (ack, nack, forward, dead_letter), so the
    worker does not. `settled` is what the handler did, as the event it is logged and
    counted as (None: nothing yet)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self.settled: str | None = None
        self.retry_delay_s: float | None = None  # the handler's own nack: due after this

    def note_retry(self, delay: float | timedelta | None) -> None:
        """The handler nacked the message itself, due again after `delay` (for the retried
        line's delay_s)."""
        self.retry_delay_s = seconds("delay", delay, 0.0)

    def ack(self, msg: Message) -> None:
        if msg.lease is not None:  # at_most_once: already removed, nothing to ack
            self._queue.ack(msg)
        self.settled = events.ACKED

    def nack(self, msg: Message, *, delay: float | timedelta | None = None,
             error: str | None = None) -> None:
        self._queue.nack(msg, delay=delay, error=error)
        self.settled = events.RETRIED
        self.note_retry(delay)

    def heartbeat(self, msg: Message[P], *, extend: float | timedelta | None = None,
                  progress: Any = None) -> Message[P]:
        return self._queue.heartbeat(msg, extend=extend, progress=progress)

    def dead_letter(self, msg: Message, error: str) -> None:
        self._queue.dead_letter(msg, error)
        self.settled = events.DEAD_LETTERED

    def forward(self, msg: Message, topic: str, payload: Any, *, key: str | None = None,
                kind: str | None = None, headers: Mapping[str, str] | None = None,
                priority: int = 0, delay: float | timedelta | None = None,
                at: datetime | None = None, on_duplicate: OnDuplicate = "ignore") -> SendResult:
        if msg.lease is None:  # at_most_once: already removed, so only the send is left
            result = self._queue.send(topic, payload, key=key, kind=kind, headers=headers,
                                      priority=priority, delay=delay, at=at,
                                      on_duplicate=on_duplicate)
        else:
            result = self._queue.forward(msg, topic, payload, key=key, kind=kind,
                                         headers=headers, priority=priority, delay=delay,
                                         at=at, on_duplicate=on_duplicate)
        self.settled = events.ACKED
        return result


class Settling:
    """One worker's settling. `start()` opens the heartbeater and the completer (threads);
    `close()` commits what is pending and stops them. `stop` is called when a timed-out
    handler asks for a fresh process (exit_on_timeout)."""

    def __init__(self, queue: Queue, health: Health, rng: random.Random, *,
                 exit_on_timeout: bool, stop: Callable[[], None]) -> None:
        self._queue = queue
        self._health = health
        self._rng = rng
        self._exit_on_timeout = exit_on_timeout
        self._stop = stop
        self._heartbeater: Heartbeater | None = None
        self._completer: Completer | None = None
        self.stats = collections.Counter[str]()
        self._stats_lock = threading.Lock()
        self.retry_due = 0.0  # monotonic: when the last retry this worker scheduled is due
        self.restart_requested = False

    def start(self) -> None:
        self._heartbeater = Heartbeater(self._queue, self._health)
        self._completer = Completer(self._queue, self._health, self._settled)

    def close(self, timeout_s: float) -> None:
        if self._completer is not None:
            # Commit the settlements of everything that finished; if the database is still
            # unreachable, wait out the timeout, then leave them to their leases.
            self._completer.close(timeout_s)
        if self._heartbeater is not None:
            self._heartbeater.close()

    @property
    def heartbeater(self) -> Heartbeater:
        assert self._heartbeater is not None, "start() first"
        return self._heartbeater

    def pending(self) -> int:
        """Settlements handed in and not yet answered."""
        return self._completer.pending() if self._completer is not None else 0

    def count(self, what: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[what] += n

    def unhold(self, msg: Message) -> None:
        if self._heartbeater is not None:
            self._heartbeater.drop(msg)

    def give_back(self, msg: Message, *, charged: bool, delay_s: float = 0.0) -> None:
        """Releases a fetched message that will not start here: its attempt back if it was
        charged, unchanged if not; due again at once or after delay_s."""
        if msg.lease is None:
            return  # at_most_once: already gone; nothing to give back
        assert self._completer is not None and self._heartbeater is not None
        self._heartbeater.settling(msg)
        self._completer.settle(Settlement("release", msg, refund=charged, delay_s=delay_s))

    # --- one handler's outcome --------------------------------------------------------------

    def settle(self, spec: HandlerSpec, msg: Message, outcome: Outcome,
               tracker: Tracker) -> None:
        """Acts on the outcome: most settlements go to the completer's outbox, which reports
        back to _settled; the others are done here and the heartbeat is dropped."""
        assert self._completer is not None
        fields: dict[str, Any] = {"topic": msg.topic, "id": msg.id, "attempts": msg.attempts}
        if spec.mode == "at_most_once":
            if outcome.ok:
                self.count("acked")
                events.emit(events.ACKED, **fields, mode="at_most_once",
                            duration_s=round(outcome.duration_s, 4))
            else:
                self.count("failed")
                events.emit(events.FAILED, logging.WARNING, **fields, mode="at_most_once",
                            error=_last_line(outcome.error))
            return
        if outcome.status == "lease_lost":
            self.unhold(msg)
            self.count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during="ack",
                        rolled_back=True)
            return
        if outcome.ok and (tracker.settled or spec.mode == "exactly_once"):
            # Acked by the worker's transaction, or settled by the handler (in exactly_once
            # mode through that transaction, which reports how as its value).
            how = tracker.settled or (outcome.value if outcome.value in _LEVEL
                                      else events.ACKED)
            self.unhold(msg)
            self.count(how)
            # A retry the handler scheduled itself is left for later, as a send with a delay:
            # a burst worker does not wait for it (docs/worker.md).
            delay_s = tracker.retry_delay_s if how == events.RETRIED else None
            events.emit(how, _LEVEL.get(how, logging.INFO), **fields,
                        duration_s=round(outcome.duration_s, 4),
                        settled_by=None if how == events.ACKED else "handler",
                        delay_s=None if delay_s is None else round(delay_s, 3))
            return
        if tracker.settled and not outcome.ok:
            # The handler settled the message itself, then raised: its settlement stands.
            self.unhold(msg)
            events.emit(events.FAILED, logging.WARNING, **fields, settled_by="handler",
                        error=_last_line(outcome.error))
            return
        if outcome.status == "outage" or (not outcome.ok and is_outage(outcome.exc)):
            state = self._probe(spec, msg)
            if state == "down":
                # The database's failure, not the handler's: once it is back, the message is
                # released with its attempt given back (never dead-lettered for an outage).
                # An exactly-once transaction may have committed before the connection died:
                # the outbox then finds the row gone and counts it acked.
                assert self._heartbeater is not None
                self._heartbeater.settling(msg)
                self._completer.settle(Settlement(
                    "release", msg, refund=True, ambiguous=outcome.status == "outage",
                    handler_ran=outcome.status == "outage"))
                return
            if state != "held":
                self.unhold(msg)
                if state == "gone" and outcome.status == "outage":
                    self.count("acked")
                    events.emit(events.ACKED, **fields, duration_s=round(outcome.duration_s, 4),
                                committed="reply_lost")
                else:
                    self.count("lease_lost")
                    events.emit(events.LEASE_LOST, logging.WARNING, **fields, during="settle")
                return
            # Held: the database answers, so the failure belongs to this delivery (a cut
            # connection, a slow transaction, another database): the usual retry policy.
        if outcome.status == "timeout":
            self.count("timed_out")
            events.emit(events.TIMED_OUT, logging.WARNING, **fields, timeout_s=spec.timeout_s,
                        restart=self._exit_on_timeout or None)
            if self._exit_on_timeout:
                self.restart_requested = True
                self._stop()
        assert self._heartbeater is not None
        self._heartbeater.settling(msg)
        if outcome.ok:  # decide() acks every success: no retry policy to look up
            self._completer.ack(msg, outcome.duration_s)
            return
        decision = decide(succeeded=False, attempts=msg.attempts,
                          max_attempts=self._queue.max_attempts_for(msg.topic, spec.max_attempts),
                          backoff=spec.retry, error=outcome.error, rng=self._rng)
        if decision.action == "retry":
            self._completer.settle(Settlement("nack", msg, delay_s=decision.delay_s,
                                              error=decision.error))
        else:
            self._completer.settle(Settlement("dead_letter", msg,
                                              error=decision.error or "failed"))

    def _probe(self, spec: HandlerSpec, msg: Message) -> Literal["held", "gone", "lost", "down"]:
        """After a failure that may be the database's: is msg still held by us (the database
        answers, so the failure was this delivery's), gone (its exactly-once transaction
        committed), taken by someone else, or is the database down? One fenced heartbeat,
        which also keeps the lease while the settlement is pending."""
        assert self._heartbeater is not None
        for attempt in range(2):  # twice: a connection killed under us is not an outage
            try:
                kept = self._queue.heartbeat_many([msg], extend=spec.visibility_timeout_s)
                if kept:
                    self._health.ok()
                    self._heartbeater.hold(msg, spec.visibility_timeout_s)
                    return "held"
                return "gone" if self._queue.get(msg.id) is None else "lost"
            except TableqError as exc:
                if not self._health.failed(exc, "settle"):
                    return "held"  # not an outage: settle as usual (and meet the error there)
                if attempt == 1:
                    return "down"
        raise AssertionError("unreachable")

    def _settled(self, s: Settlement, verdict: Verdict) -> None:
        """The completer's answer for one settlement: log it, count it, stop its heartbeat."""
        msg = s.msg
        self.unhold(msg)
        if verdict == "done" and s.action == "ack":  # the hot path: one per message
            self.count("acked")
            events.emit(events.ACKED, topic=msg.topic, id=msg.id, attempts=msg.attempts,
                        duration_s=round(s.duration_s, 4))
            return
        fields: dict[str, Any] = {"topic": msg.topic, "id": msg.id, "attempts": msg.attempts}
        if verdict == "lost":
            self.count("lease_lost")
            events.emit(events.LEASE_LOST, logging.WARNING, **fields, during=s.action)
            return
        if verdict in ("failed", "abandoned"):
            self.count(f"settle_{verdict}")
            return  # logged once per batch by the completer; the lease will run out
        if s.action == "ack" or (verdict == "gone" and s.handler_ran):
            self.count("acked")
            events.emit(events.ACKED, **fields, duration_s=round(s.duration_s, 4),
                        committed="reply_lost" if s.action != "ack" else None)
        elif s.action == "nack":
            with self._stats_lock:  # due from when the database set it (burst waits for it)
                self.retry_due = max(self.retry_due, time.monotonic() + s.delay_s)
            self.count("retried")
            events.emit(events.RETRIED, logging.WARNING, **fields,
                        delay_s=round(s.delay_s, 3), error=_last_line(s.error))
        elif s.action == "dead_letter":
            self.count("dead_lettered")
            events.emit(events.DEAD_LETTERED, logging.ERROR, **fields,
                        error=_last_line(s.error))
        else:
            if s.delay_s:  # given back for later (redelivered_while_held): burst waits
                with self._stats_lock:
                    self.retry_due = max(self.retry_due, time.monotonic() + s.delay_s)
            self.count("released")
            events.emit(events.RELEASED, topic=msg.topic, id=msg.id,
                        attempts=msg.attempts - (1 if s.refund else 0),
                        after="outage" if s.handler_ran else None)


def _last_line(text: str | None) -> str | None:
    """The error's last non-blank line (a traceback's is the exception), at most 300
    characters, for a log field."""
    if text is None:
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else text[:300]
