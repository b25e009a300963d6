"""Keeps PostgreSQL's message table small between autovacuum's visits. Every claim, charge,
heartbeat and ack leaves a dead row version behind, and autovacuum looks at a table at most
once a minute (autovacuum_naptime, server-wide): a queue churning 8,000 messages a second
piles up about a million dead versions in that minute, and the table and its indexes grow
to hold them for good (VACUUM frees space for reuse, it does not give it back). So the
backend runs `VACUUM (SKIP_LOCKED)` on the message table itself, in a background thread,
once the rows it changed since the last one reach a share of the table.

The decision is pure (vacuum_due); the thread only counts and waits."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

log = logging.getLogger("tableq.vacuum")

# Vacuum once the row versions this process made dead since the last vacuum reach this share
# of the table's rows. A 20k backlog with 300k messages through at 8k a second ended at 1.8x
# its size (vacuumed every 0.5 s; every 1 s by a timer, 2.6x; left to autovacuum, 33x); a 2k
# backlog levelled off at 3.0x (28x left to autovacuum, and growing).
CHURN_SHARE = 0.5
# ... and never for fewer than this many: a nearly empty table is cheap to let grow a little.
MIN_CHURN = 2_000
# ... and not sooner after the last vacuum than this many times its duration, so vacuuming
# takes at most about a tenth of one connection's time. This also paces it while a long
# transaction keeps dead rows from being removed, when every vacuum scans them again.
DUTY = 10.0
# After a failed vacuum (the database away), the next try waits this long.
RETRY_S = 10.0


def vacuum_due(churn: int, rows: float, since_s: float, last_took_s: float) -> bool:
    """Whether `churn` dead row versions (made since the last vacuum, `since_s` ago, which
    took `last_took_s`) in a table of about `rows` live rows call for a vacuum now."""
    return churn >= max(MIN_CHURN, CHURN_SHARE * rows) and since_s >= DUTY * last_took_s


class Vacuumer:
    """Counts churn (`churned(n)`) and runs `vacuum()` on its own daemon thread when
    vacuum_due says so. `vacuum()` vacuums and returns the table's row estimate after it, or
    None when it cannot vacuum (not the table's owner): then the Vacuumer stops for good.
    Errors (the database away) are logged and the churn is kept for the next try."""

    def __init__(self, vacuum: Callable[[], float | None], where: str) -> None:
        self._vacuum, self._where = vacuum, where
        self._cond = threading.Condition()
        self._churn = 0
        self._rows = 0.0
        self._last_end = time.monotonic()
        self._last_took = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._off = False
        self._failing = False
        self.runs = 0  # vacuums finished by this process (tests and tuning read it)
        ref = weakref.ref(self)

        def after_fork() -> None:
            me = ref()
            if me is not None:  # a forked child has no threads, and maybe a held lock
                me._cond, me._thread = threading.Condition(), None
        os.register_at_fork(after_in_child=after_fork)

    def churned(self, n: int) -> None:
        if n <= 0 or self._off:
            return
        with self._cond:
            self._churn += n
            if self._due():
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="tableq-vacuum",
                                                    daemon=True)
                    self._thread.start()
                self._cond.notify()

    def _due(self) -> bool:
        return vacuum_due(self._churn, self._rows, time.monotonic() - self._last_end,
                          self._last_took)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due():
                    # Woken by churned(), or once the duty wait after the last vacuum is over.
                    wait = self._last_took * DUTY - (time.monotonic() - self._last_end)
                    self._cond.wait(timeout=max(0.001, wait) if self._churn else None)
                if self._closed:
                    return
                counted = self._churn
            began = time.monotonic()
            try:
                rows = self._vacuum()
            except Exception as e:  # the thread outlives an outage: tried again, paced below
                if not self._failing:
                    log.warning("tableq: vacuuming the message table at %s failed (%s); "
                                "trying again every %.0f s", self._where, e, RETRY_S)
                self._failing = True
                with self._cond:
                    self._last_end, self._last_took = time.monotonic(), RETRY_S / DUTY
                continue
            self._failing = False
            with self._cond:
                end = time.monotonic()
                self._last_end, self._last_took = end, end - began
                self._churn -= counted
                if rows is None:
                    self._off = True
                    return
                self._rows = rows
                self.runs += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
