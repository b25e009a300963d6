"""Claim floors: where a PostgreSQL claim may start reading its topic while a snapshot is held
or the topic holds an open bulk load.

While any transaction holds an old snapshot, no dead row version of the message table can be
removed, and a claim that reads its topic from the start of the claim index walks over every
message received since: claims get slower with every message, and a queue that churned for
minutes ran at a tenth of its speed. A floor is a position in the claim index, (priority,
available_at, id), before which no live message of that priority sorts; the claim reads that
priority from the floor (message_claim_floor). Each claim learns the next floor:

- the first row of the floor's priority that its snapshot could see (`first`, locked or not:
  a row another claim holds may yet be given back), or its own start if it saw none;
- capped by the write bound: rows that transactions in flight have written, invisible to
  the claim, are due no earlier than their transaction's start, or, for a statement waiting
  for a lock, its start (less WRITE_MARGIN_S, for a statement between its start and its first
  row). The bound must be read before the claim's snapshot, so a claim uses the bound an
  earlier one read (Horizon): a transaction that commits after the claim's snapshot was
  either in flight then, or not yet begun (and then writes nothing due before its start).

That rests on one rule that every statement of queries.sql keeps: no row is written due
before the statement's start (a send with `at=` in the past is due at its send). Rows due
later than the claim's start sort after the floor anyway, so leases that run out are found.

The rows of an open load part (bulk.py) are committed but not claimable, and sit where they
were copied, before the topic's later messages: a claim from the start walks all of them. A
floor passes over them as over dead versions, for as long as no part of the topic is
published (then its rows are due where they sit): the claim reads the topic's count of
publishes (`gen`, 0008_open_load_floors.sql), which moves in commit order, and reads from the
start again when it has moved since the floor was learned.

Floors are used while the database's oldest snapshot is older than HELD_AFTER_S, or for a
topic with open load parts (a process that claims plainly looks every HORIZON_EVERY_S), and
only when this role can see every session's transactions (pg_read_all_stats): a write in
flight in a session it cannot see could sort before any floor. While floors are on, a claim
reads the horizon at most every LOOK_EVERY_S; the claims between use the bound the last look
left, which is older and so no higher: a transaction begun since then writes nothing due
before its start, which is later. Without a held snapshot or an open load, dead versions are
cleaned up and the plain claim is cheapest. The decisions are pure; the class holds this
process's floors."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

HELD_AFTER_S = 1.0
HORIZON_EVERY_S = 1.0
WRITE_MARGIN_S = 0.05
# Reading the horizon (pg_stat_activity) took 0.1-0.2 ms of a floor claim's 2.5-3 ms on the
# server (claims of 100 while a snapshot was held: EXPLAIN ANALYZE samples, pg_stat_statements).
# Looking every 20 ms instead of at every claim, alternating 30 s phases under one held
# snapshot (2026-11-27): about a third of the claims looked, a claim's mean server time went
# from 3.13 to 2.96 ms (medians of 4), the drain rate moved within the phases' noise. At 10k
# messages a second the floor then trails by at most about 200 more drained rows.
LOOK_EVERY_S = 0.02
START = datetime.min.replace(tzinfo=UTC)  # before every due time: read from the start

Position = tuple[datetime, int]  # (available_at, id) within one priority
NO_OPEN_LOADS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Horizon:
    """What a claim read of the database's other transactions (the horizon() function),
    at `at` (the claim's statement time)."""

    hidden: bool  # some session's transactions cannot be seen by this role
    oldest_snapshot: datetime | None
    oldest_write: datetime | None
    at: datetime
    open_topics: frozenset[str] = NO_OPEN_LOADS  # topics with open load parts

    def held(self) -> bool:
        """A snapshot old enough that dead row versions pile up in the claim index."""
        return (not self.hidden and self.oldest_snapshot is not None
                and self.at - self.oldest_snapshot > timedelta(seconds=HELD_AFTER_S))

    def open_loads(self) -> frozenset[str]:
        """The topics whose claims run from floors past open loads (none unless every
        session is seen)."""
        return NO_OPEN_LOADS if self.hidden else self.open_topics

    def write_bound(self) -> datetime:
        """No row that a transaction in flight at `at` may yet make visible is due before
        this (tableq writes no due time before its statement's start)."""
        oldest = self.at if self.oldest_write is None else min(self.oldest_write, self.at)
        return oldest - timedelta(seconds=WRITE_MARGIN_S)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """How one claim of a topic runs: plainly (floor None), after a look at the horizon
    (`check`), or from a floor (message_claim_floor) learned while the topic's count of load
    publishes was `gen`, with the write bound read before it, reading the horizon for the
    claims after it or not (`look`)."""

    floor: tuple[int, Position] | None = None  # (priority, position)
    check: bool = False
    bound: datetime | None = None
    look: bool = True
    gen: int = 0

    def params(self) -> dict[str, Any]:
        if self.floor is None:
            return {}
        priority, (at, msg_id) = self.floor
        return {"f_priority": priority, "f_at": at, "f_id": msg_id, "f_gen": self.gen,
                "look": self.look}


PLAIN = ClaimPlan()


def next_floor(old: Position | None, first: Position | None, claimed_at: datetime,
               bound: datetime | None) -> Position | None:
    """The floor after a claim that started reading at `old` (None: the start), saw `first`
    (None: no visible row from there) at `claimed_at`, with the write bound `bound` read
    before it (None: not known yet, so no floor)."""
    if bound is None:
        return old
    seen = first if first is not None else (claimed_at, 0)
    new = min(seen, (bound, 0))
    return new if old is None or new > old else old


class Floors:
    """This process's claim floors (one backend's): per topic, the priority whose floor a
    claim uses (the first leased message's; 0 at first) and a floor per (topic, priority),
    with the count of load publishes it was learned under. Thread-safe: claims of one process
    share them, and a floor only moves forward until the snapshot is let go or a load of its
    topic is published."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._lock = threading.Lock()
        self._held = False
        self._open = NO_OPEN_LOADS
        self._checked = -HORIZON_EVERY_S  # monotonic time of the last look at the horizon
        self._looked = -LOOK_EVERY_S  # ... of the last floor claim that read it
        self._bound: datetime | None = None
        self._level: dict[str, int] = {}
        self._floor: dict[tuple[str, int], tuple[Position, int]] = {}

    @property
    def held(self) -> bool:
        """Claims run from floors: a snapshot is held (and every session can be seen)."""
        return self._held

    def on(self, topic: str) -> bool:
        """Claims of this topic run from floors: a snapshot is held or it has an open load."""
        return self._held or topic in self._open

    def plan(self, topic: str) -> ClaimPlan:
        if not self._enabled:
            return PLAIN
        with self._lock:
            now = time.monotonic()
            if not self.on(topic):
                if now - self._checked < HORIZON_EVERY_S:
                    return PLAIN
                self._checked = now
                return ClaimPlan(check=True)
            level = self._level.get(topic, 0)
            start, gen = self._floor.get((topic, level), ((START, 0), 0))
            look = now - self._looked >= LOOK_EVERY_S
            if look:
                self._looked = now
            return ClaimPlan(floor=(level, start), bound=self._bound, look=look, gen=gen)

    def checked(self, horizon: Horizon) -> None:
        """The horizon looked at before a plain claim (ClaimPlan.check)."""
        with self._lock:
            self._switch(horizon)

    def learn(self, topic: str, plan: ClaimPlan, meta: dict[str, Any],
              first_priority: int | None) -> None:
        """What a claim from a floor returned: its first row's helper columns (`meta`: the
        first visible row from the floor, the topic's count of load publishes, its statement
        time, and the horizon if it looked) and the priority of the first message it leased
        (None: none)."""
        assert plan.floor is not None
        priority, start = plan.floor
        horizon = Horizon(bool(meta["hidden"]), meta["oldest_snapshot"], meta["oldest_write"],
                          meta["claimed_at"], frozenset(meta["open_topics"] or ()))
        first = None if meta["first_at"] is None else (meta["first_at"], int(meta["first_id"]))
        gen = int(meta["gen"])
        with self._lock:
            if plan.look:
                self._switch(horizon)
            if not self.on(topic):
                return
            key = (topic, priority)
            # The claim read from the plan's floor, or from the start if a load was published
            # since; a floor learned under an older count is not one any more.
            old = start if gen == plan.gen else None
            known = self._floor.get(key)
            if known is not None and known[1] > gen:
                return  # a claim older than a publish another claim has seen
            if known is not None and known[1] == gen:
                old = known[0] if old is None else max(old, known[0])
            floor = next_floor(old, first, horizon.at, plan.bound)
            if floor is not None:
                self._floor[key] = (floor, gen)
            if first_priority is not None:
                self._level[topic] = first_priority

    def _switch(self, horizon: Horizon) -> None:
        """Floors on while the horizon is held (and visible), for every topic, or for the
        topics with open loads; off and forgotten after. The horizon's write bound serves the
        claims that start after it was read."""
        held, opened = horizon.held(), horizon.open_loads()
        if held != self._held:
            self._held = held
            self._level.clear()
            self._floor.clear()
        if not held:
            for key in [k for k in self._floor if k[0] not in opened]:
                del self._floor[key]
        self._open = opened
        if not (held or opened):
            self._bound = None
        elif self._bound is None or horizon.write_bound() > self._bound:
            self._bound = horizon.write_bound()
