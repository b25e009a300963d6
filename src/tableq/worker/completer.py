"""Settles finished and given-back messages through one outbox owned by one thread: acks
(group-committed: one ack_many for whatever finished while the previous one ran), nacks with
their retry delay, dead letters and releases. A message stays under heartbeat until its
settlement is answered. Queue API only.

During an outage the outbox keeps every settlement the database did not answer and sends it
again when the database is reachable (Health), without waiting for the lease to end: fencing
makes a late settlement safe, and one that lands before anyone else took the message saves a
redelivery and the attempt it would cost. The outbox is bounded by what the worker held, since
it fetches nothing while the database is down.

The rule for a settlement whose earlier try failed with its outcome unknown (the connection
died after the statement was sent, so it may have committed) and whose retry finds the lease
no longer held: look the message up.
- Gone: the earlier try did it (an ack removed it, a dead letter moved it), or, only possible
  after the lease ran out, another worker took and finished it. Either way the message is
  done with, so the settlement counts as done, not as a lost lease.
- Still live: for an ack or a dead letter, someone else took it after the lease ran out (had
  the earlier try committed, the row would be gone): the lease is lost. For a nack or a
  release, which asked for another delivery, it is done either way.
Without an unknown earlier try, "not held" means the lease was lost, as always."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tableq.errors import LeaseLost, TableqError
from tableq.message import Message
from tableq.queue import Queue
from tableq.worker import events
from tableq.worker.health import Health, first_line, retry_delay

ACK_BATCH_MAX = 500

Action = Literal["ack", "nack", "dead_letter", "release"]
# done: the database applied it (now, or by an earlier try); gone: the message left the queue
# without this settlement being needed (see the module docstring); lost: someone else holds
# it; failed: a non-outage error (the lease will run out and the message come back);
# abandoned: the worker stopped while the database was still unreachable.
Verdict = Literal["done", "gone", "lost", "failed", "abandoned"]


@dataclass(eq=False, slots=True)
class Settlement:
    action: Action
    msg: Message
    duration_s: float = 0.0  # how long the handler ran (for the acked log line)
    delay_s: float = 0.0  # nack: when the retry is due
    error: str | None = None  # nack and dead_letter: the error kept on the message
    refund: bool = False  # release: give back the attempt charged for this delivery
    # An earlier try may have taken effect (the reply was lost); see the module docstring.
    ambiguous: bool = False
    # release: the handler ran in an exactly-once transaction that failed with the database;
    # if the message turns out gone, that transaction committed (its reply was lost).
    handler_ran: bool = False


def not_held_verdict(action: Action, ambiguous: bool, row_exists: bool | None) -> Verdict:
    """What a settlement means when the database says its lease is not held (pure; the rule
    is in the module docstring). `row_exists` is only looked up when `ambiguous`."""
    if not ambiguous:
        return "lost"
    if not row_exists:
        return "gone"
    return "done" if action in ("nack", "release") else "lost"


class Completer:
    """The outbox. `on_settled(settlement, verdict)` is called once per settlement, from the
    completer's thread."""

    def __init__(self, queue: Queue, health: Health,
                 on_settled: Callable[[Settlement, Verdict], None]) -> None:
        self._queue = queue
        self._health = health
        self._on_settled = on_settled
        self._acks: list[Settlement] = []  # kept apart: one ack_many takes a batch of them
        self._others: list[Settlement] = []
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._give_up_at: float | None = None  # monotonic; set by close()
        self._retries = 0
        self._rng = random.Random()
        self._thread = threading.Thread(target=self._loop, name="tableq-completer", daemon=True)
        self._thread.start()

    # --- handing in --------------------------------------------------------------------------

    def settle(self, settlement: Settlement) -> None:
        with self._cond:
            (self._acks if settlement.action == "ack" else self._others).append(settlement)
            self._cond.notify_all()

    def ack(self, msg: Message, duration_s: float) -> None:
        self.settle(Settlement("ack", msg, duration_s=duration_s))

    def pending(self) -> int:
        with self._cond:
            return len(self._acks) + len(self._others) + (1 if self._busy else 0)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every settlement handed in so far is answered."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._acks and not self._others and not self._busy, timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Delivers what is pending, for up to `timeout_s` if the database is unreachable;
        what is still undelivered then is abandoned (its leases run out and the messages come
        back to other workers)."""
        with self._cond:
            self._give_up_at = time.monotonic() + timeout_s
            self._closed = True
            self._cond.notify_all()
        self._health.wake()
        self._thread.join(timeout_s + 10)

    # --- the thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._acks or self._others or self._closed)
                if not self._acks and not self._others:
                    return
                acks = self._acks[:ACK_BATCH_MAX]
                del self._acks[:ACK_BATCH_MAX]
                others, self._others = self._others, []
                self._busy = True
            undelivered: list[Settlement] = []
            try:
                undelivered = self._deliver(acks, others)
            finally:
                with self._cond:
                    # First in line when the database is back.
                    self._acks[:0] = [s for s in undelivered if s.action == "ack"]
                    self._others[:0] = [s for s in undelivered if s.action != "ack"]
                    self._busy = False
                    self._cond.notify_all()
            if undelivered:
                self._await_database()
            else:
                self._retries = 0

    def _await_database(self) -> None:
        """Waits for the database (or the next retry); gives up only when closing."""
        if self._give_up_at is not None and time.monotonic() >= self._give_up_at:
            with self._cond:
                left = self._acks + self._others
                self._acks, self._others = [], []
                self._cond.notify_all()
            if left:
                events.emit("settle_abandoned", logging.WARNING, count=len(left),
                            actions=",".join(sorted({s.action for s in left})))
            for s in left:
                self._on_settled(s, "abandoned")
            return
        delay = retry_delay(self._retries, self._rng)
        self._retries += 1
        if self._give_up_at is not None:
            delay = min(delay, max(0.0, self._give_up_at - time.monotonic()))
        self._health.wait_up(delay)

    def _deliver(self, acks: list[Settlement], others: list[Settlement]) -> list[Settlement]:
        """Sends the settlements; returns those to send again (the database was unreachable)."""
        if acks:
            undelivered = self._deliver_acks(acks)
            if undelivered:
                return undelivered + others
        for i, s in enumerate(others):
            if not self._deliver_one(s):
                return others[i:]
        return []

    def _deliver_acks(self, batch: list[Settlement]) -> list[Settlement]:
        lost: set[int] = set()
        try:
            self._queue.ack_many([s.msg for s in batch])
        except LeaseLost as exc:
            # ack_many acked every message still held in one statement, then named all the
            # lost ones: the rest of the batch is acked.
            lost.update(exc.message_ids)
        except Exception as exc:  # noqa: BLE001 - whatever failed, this thread must go on
            if self._health.failed(exc, "ack"):
                for s in batch:
                    s.ambiguous = True
                return batch
            # Not an outage: the statement itself failed; the leases will run out and the
            # messages come back (at-least-once still holds).
            events.emit("settle_failed", logging.ERROR, action="ack", count=len(batch),
                        error=first_line(exc))
            for s in batch:
                self._on_settled(s, "failed")
            return []
        self._health.ok()
        for s in batch:
            if s.msg.id not in lost:
                self._on_settled(s, "done")
        unsure = [s for s in batch if s.msg.id in lost]
        for i, s in enumerate(unsure):
            verdict = self._verdict_not_held(s)
            if verdict is None:
                return unsure[i:]  # asked again when the database is back
            self._on_settled(s, verdict)
        return []

    def _deliver_one(self, s: Settlement) -> bool:
        """Sends one nack, dead letter or release; False if the database was unreachable."""
        try:
            if s.action == "nack":
                self._queue.nack(s.msg, delay=s.delay_s, error=s.error)
            elif s.action == "dead_letter":
                self._queue.dead_letter(s.msg, (s.error or "").strip() or "failed")
            elif s.refund:
                self._queue.release(s.msg, delay=s.delay_s)
            else:
                # Never charged (a prefetched message): give it back with attempts unchanged.
                self._queue.nack(s.msg, delay=s.delay_s)
        except LeaseLost:
            verdict = self._verdict_not_held(s)
            if verdict is None:
                return False
            self._on_settled(s, verdict)
            return True
        except Exception as exc:  # noqa: BLE001 - whatever failed, this thread must go on
            if self._health.failed(exc, s.action):
                s.ambiguous = True
                return False
            events.emit("settle_failed", logging.ERROR, action=s.action, topic=s.msg.topic,
                        id=s.msg.id, error=first_line(exc))
            self._on_settled(s, "failed")
            return True
        self._health.ok()
        self._on_settled(s, "done")
        return True

    def _verdict_not_held(self, s: Settlement) -> Verdict | None:
        """None if the database became unreachable while looking."""
        if not s.ambiguous:
            return "lost"
        try:
            exists = self._queue.get(s.msg.id) is not None
        except TableqError as exc:
            if self._health.failed(exc, "settle_check"):
                return None
            exists = True  # cannot tell: report the lease lost, the cautious reading
        return not_held_verdict(s.action, True, exists)
