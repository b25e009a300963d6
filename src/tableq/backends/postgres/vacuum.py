"""Keeps PostgreSQL's message table small between autovacuum's visits. Every claim, charge,
heartbeat and ack leaves a dead row version behind, and autovacuum looks at a table at most
once a minute (autovacuum_naptime, server-wide): a queue churning 8,000 messages a second
piles up about a million dead versions in that minute, and the table and its indexes grow
to hold them for good (VACUUM frees space for reuse, it does not give it back). So the
backend runs `VACUUM (SKIP_LOCKED)` on the message table itself, in a background thread,
once the rows it changed since the last one reach a share of the table.

The decision is pure (vacuum_wait); the thread only counts and waits."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("tableq.vacuum")

# Vacuum once the row versions this process made dead since the last vacuum reach this share
# of the table's rows. Left to autovacuum, a 20k backlog with 1M messages through at 9k a
# second grew 45x, a 2k backlog 28x and growing. The table settles where it holds its rows
# and one interval's churn: with a 20k backlog, 800k through (alternating runs on one
# throwaway cluster), 0.5 held 1,516-1,521 pages of 805 at the start, 0.35 1,347-1,357 and
# 0.25 1,239-1,245; 0.35 also churned fastest (median 59 s against 66 s for 0.5 over three
# pairs, 44-47 s against 48-51 s for 0.25 over two): a smaller table is quicker to claim
# from and to vacuum.
CHURN_SHARE = 0.35
# The table's rows are counted after a vacuum while there are fewer than this many (an
# index-only count, cheap once the vacuum marked the pages visible: 2.1 ms for 20,000, 8.7 ms
# for 100,000); beyond, the server's estimate. That estimate drifts up as the table grows (the
# vacuum extrapolates the rows of the pages it skips): paced by it, a 20k backlog read as up
# to 27k, up to 14,100 rows churned between vacuums instead of 10,500 by 4M messages through,
# and the table grew to hold them.
COUNTED_BELOW = 100_000
# ... and never for fewer than this many: a nearly empty table is cheap to let grow a little.
MIN_CHURN = 2_000
# While the last vacuum could not remove what churned (a long transaction holds the rows
# visible: see `tableq doctor`), every vacuum scans them again for nothing; then the next one
# waits this many times the last one's duration, so it takes at most about a tenth of one
# connection's time. A vacuum that did remove its rows is never held back by its duration:
# one slowed by a checkpoint's writes would otherwise let the table grow meanwhile, making
# the next one slower still (a benchmark run ended at 45x its size that way).
DUTY = 10.0
# After a failed vacuum (the database away), the next try waits this long.
RETRY_S = 10.0
# A vacuum skipped because another holds the table (autovacuum's VACUUM or ANALYZE, another
# process's) keeps its churn and is tried again this soon, for QUICK_SKIPS skips in a row
# (autovacuum's ANALYZE of the table held it 0.09-0.12 s), then twice as long after each one
# up to SKIPPED_RETRY_MAX_S (each skip is a line in the server's log, and an autovacuum of a
# big table holds it for minutes). Counted as done, a skip let twice the churn in before the
# next vacuum: each minute's autovacuum visit that met one of the backend's vacuums left the
# table a step larger (1,516 -> 1,893 pages at 1M messages through).
SKIPPED_RETRY_S = 0.05
QUICK_SKIPS = 10
SKIPPED_RETRY_MAX_S = 2.0
# While a snapshot is held (the claims' horizon, floors.py) a vacuum can remove nothing that
# churned since it began, and one over millions of dead versions slowed every commit beside
# it (acks of 0.3-0.4 s for seconds at a time): it waits, looking again this often.
HELD_RECHECK_S = 1.0


@dataclass(frozen=True)
class Swept:
    """What a vacuum left: the table's live rows and the dead row versions it could not
    remove (the server's estimate), or that it was skipped, another holding the table (then
    nothing was read)."""

    rows: float
    dead: float
    skipped: bool = False


def skipped_wait(skips: int) -> float:
    """Seconds before trying again after `skips` skipped vacuums in a row (1 or more)."""
    doublings = min(max(skips - QUICK_SKIPS, 0), 16)
    return min(SKIPPED_RETRY_S * 2.0 ** doublings, SKIPPED_RETRY_MAX_S)


def vacuum_wait(churn: int, last: Swept, since_s: float, last_took_s: float) -> float | None:
    """Seconds until `churn` dead row versions, made since the last vacuum (which left
    `last`, took `last_took_s` and ended `since_s` ago), call for a vacuum: 0.0 for now, None
    while too few have churned."""
    threshold = max(MIN_CHURN, CHURN_SHARE * last.rows)
    if churn < threshold:
        return None
    if last.dead < threshold:  # it removed what churned: the next may come at once
        return 0.0
    return max(0.0, DUTY * last_took_s - since_s)


class Vacuumer:
    """Counts churn (`churned(n)`) and runs `vacuum()` on its own daemon thread when
    vacuum_wait says so and `held()` does not. `vacuum()` vacuums and returns what it left
    (Swept), or None when it cannot vacuum (not the table's owner): then the Vacuumer stops
    for good. Errors (the database away) are logged and the churn is kept for the next try;
    so is a skipped vacuum's, tried again after skipped_wait."""

    def __init__(self, vacuum: Callable[[], Swept | None], where: str,
                 held: Callable[[], bool] = lambda: False) -> None:
        self._vacuum, self._where, self._held = vacuum, where, held
        self._cond = threading.Condition()
        self._churn = 0
        self._last = Swept(0.0, 0.0)
        self._last_end = time.monotonic()
        self._last_took = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._off = False
        self._failing = False
        self._retry_at = 0.0
        self._skips = 0
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

    def _wait_s(self) -> float | None:
        """vacuum_wait, and no sooner than a failed vacuum's retry time, nor while held."""
        now = time.monotonic()
        wait = vacuum_wait(self._churn, self._last, now - self._last_end, self._last_took)
        if wait is not None and self._held():
            return max(wait, HELD_RECHECK_S)
        return None if wait is None else max(wait, self._retry_at - now)

    def _due(self) -> bool:
        wait = self._wait_s()
        return wait is not None and wait <= 0.0

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due():
                    # Woken by churned() once enough churned, or when the wait after a
                    # vacuum that removed too little (or failed) is over.
                    self._cond.wait(timeout=self._wait_s())
                if self._closed:
                    return
                counted = self._churn
            began = time.monotonic()
            try:
                swept = self._vacuum()
            except Exception as e:  # the thread outlives an outage: tried again, paced below
                if not self._failing:
                    log.warning("tableq: vacuuming the message table at %s failed (%s); "
                                "trying again every %.0f s", self._where, e, RETRY_S)
                self._failing = True
                with self._cond:
                    self._retry_at = time.monotonic() + RETRY_S
                continue
            self._failing = False
            with self._cond:
                end = time.monotonic()
                if swept is not None and swept.skipped:
                    self._skips += 1
                    self._retry_at = end + skipped_wait(self._skips)
                    continue
                self._skips = 0
                self._last_end, self._last_took = end, end - began
                self._churn -= counted
                if swept is None:
                    self._off = True
                    return
                self._last = swept
                self.runs += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
