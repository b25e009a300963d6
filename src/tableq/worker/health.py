"""The worker's view of its database: reachable, or in an outage. Fetching, settling,
heartbeats and handler starts all report into one Health, so an outage is logged once
(`database_unreachable`, WARNING, with the first error) and its end once
(`database_reachable`, with how long it lasted), not once per message. While it is down the
worker fetches nothing and starts no handler; each part retries its own work after a
jittered, capped delay, and all of them retry at once when any one of them gets through.

A failure that heals within OUTAGE_CONFIRM_S (a cut connection: the next try gets a new one)
pauses the worker just as briefly but is logged at DEBUG only (`database_blip`), so a server
that kills connections now and then does not fill the log. What counts as an outage and how
long to wait are pure functions. No SQL."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from tableq.errors import (
    DatabaseBusy,
    DatabaseTimeout,
    DatabaseUnavailable,
    ServerUnavailable,
    StorageFull,
    public_kind,
)
from tableq.worker import events

DATABASE_UNREACHABLE = "database_unreachable"
DATABASE_REACHABLE = "database_reachable"
DATABASE_BLIP = "database_blip"
OUTAGE_CONFIRM_S = 0.5  # down this long: an outage worth a WARNING, not a blip
RETRY_MIN_S = 0.05
RETRY_MAX_S = 2.0  # a server back from an outage is noticed within this long

# The database could not do the work now, and the same call will succeed later: it is down or
# unreachable, the connection was cut, it stayed locked or busy past the retries the backend
# already made, it cancelled the statement, or its disk is full; or, for a worker over HTTP
# (`--api`), the tableq server is unreachable or a proxy in front of it answered 502/503/504.
# Nothing else is an outage: a DatabaseError from bad SQL or data would fail again, so it is
# an error of that one call.
OUTAGE_ERRORS = (DatabaseUnavailable, DatabaseBusy, DatabaseTimeout, StorageFull,
                 ServerUnavailable)


def is_outage(exc: BaseException | None) -> bool:
    return isinstance(exc, OUTAGE_ERRORS)


def retry_delay(attempt: int, rng: random.Random, *, min_s: float = RETRY_MIN_S,
                max_s: float = RETRY_MAX_S) -> float:
    """Seconds to wait before try number `attempt` (0-based) during an outage: doubling from
    min_s, capped at max_s, drawn from [d/2, d] so many workers do not retry in step."""
    d = min(max_s, min_s * 2.0 ** min(attempt, 32))
    return rng.uniform(d / 2, d)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class Health:
    """Shared up/down state. `failed(exc, during)` returns whether exc is an outage (the caller
    then keeps its work and retries it); `ok()` marks the database reachable again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self.up = True  # read without the lock on hot paths; written under it
        self._down_since = 0.0
        self._first: tuple[str, BaseException] | None = None  # what failed first, and how
        self._logged = False  # the current outage was logged (it lasted OUTAGE_CONFIRM_S)
        self.outages = 0  # logged outages so far
        self.blips = 0  # failures that healed before OUTAGE_CONFIRM_S
        self._on_up: list[Callable[[], None]] = []

    def on_recovery(self, callback: Callable[[], None]) -> None:
        """Calls `callback()` (from the reporting thread) each time an outage ends."""
        with self._cond:
            self._on_up.append(callback)

    def ok(self) -> None:
        if self.up:  # the hot path: one attribute read
            return
        with self._cond:
            if self.up:
                return
            self.up = True
            down_s = self._clock() - self._down_since
            logged, first = self._logged, self._first
            if not logged:
                self.blips += 1
            callbacks = list(self._on_up)
            self._cond.notify_all()
        if logged:
            events.emit(DATABASE_REACHABLE, down_s=round(down_s, 2))
        elif first is not None:
            events.emit(DATABASE_BLIP, logging.DEBUG, during=first[0],
                        error=first_line(first[1]), down_s=round(down_s, 3))
        for callback in callbacks:
            callback()

    def failed(self, exc: BaseException, during: str) -> bool:
        if not is_outage(exc):
            return False
        with self._cond:
            if self.up:
                self.up = False
                self._down_since = self._clock()
                self._first = (during, exc)
                self._logged = False
        self._confirm_if_lasting()
        return True

    def wait_up(self, timeout_s: float | None) -> bool:
        """Waits until the database is reachable again, `timeout_s` passes, or wake() is
        called; returns whether it is up."""
        with self._cond:
            if not self.up:
                self._cond.wait(timeout_s)
            up = self.up
        if not up:
            self._confirm_if_lasting()
        return up

    def wake(self) -> None:
        """Ends every wait_up() now (the worker is stopping)."""
        with self._cond:
            self._cond.notify_all()

    def _confirm_if_lasting(self) -> None:
        """Logs the outage once it has lasted OUTAGE_CONFIRM_S (the parts of the worker check
        this as they report and wait, which they do every RETRY_MAX_S at most)."""
        with self._cond:
            if (self.up or self._logged or self._first is None
                    or self._clock() - self._down_since < OUTAGE_CONFIRM_S):
                return
            self._logged = True
            self.outages += 1
            during, exc = self._first
        events.emit(DATABASE_UNREACHABLE, logging.WARNING, during=during,
                    error=first_line(exc), kind=public_kind(exc))
