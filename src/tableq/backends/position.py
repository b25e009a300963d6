"""Where a topic's next claim starts reading the claim index. Pure decisions, no I/O.

A claim reads the claim index (topic, priority DESC, due time, id) in order and takes the
first due rows nobody holds. On PostgreSQL every message leased or acked leaves index entries
behind (its old row versions) until VACUUM removes them, and while any snapshot older than
them is open (a long report, a REPEATABLE READ transaction, a lagging replica) it cannot. A
claim that starts at the index's beginning then walks over all of them, every call, and the
drain slows as the queue churns.

So the PostgreSQL backend remembers the key of the last message it leased on each topic, and
the next claim reads from there: every higher priority from the start (their range holds
only their own history), and the same priority after that key. A row can be behind the
position without having been leased: an outbox send whose transaction committed after a
claim passed its due time, a send scheduled in the past, a row a failed claim had locked.
Such rows are never lost, only served later: a claim from the position that finds nothing
reads from the start at once, one that comes back short makes the next claim read from the
start, and every SWEEP_S at the latest a claim starts from the beginning anyway.

(InnoDB keeps delete-marked records until purge, too, but a position does not help there: a
range scan walks the delete-marked records past its end up to the next live one, and
MariaDB's optimizer would not range over the descending priority key part; see
benchmarks/misses.md.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A claim starts from the index's beginning at least this often, so that a row behind the
# position waits at most this long while claims from the position keep coming back full.
SWEEP_S = 2.0
# The lowest priority a message can have (they are 32-bit).
_LOWEST = -(2**31)


@dataclass(frozen=True, slots=True)
class Position:
    """The claim-order key of the last message a claim leased, in the database's own types,
    and when (time.monotonic) a claim on this topic last read from the start."""

    priority: int
    due: Any
    id: int
    swept_at: float


def start(position: Position | None, now: float) -> Position | None:
    """Where the next claim reads from: `position`, or None for the index's beginning when
    there is no position or the last read from the beginning is SWEEP_S old."""
    if position is None or now - position.swept_at >= SWEEP_S:
        return None
    return position


def after(start: Position | None, leased: int, wanted: int,
          last: tuple[int, Any, int] | None, now: float) -> Position | None:
    """The position after a claim from `start` that leased `leased` of the `wanted` messages,
    the last with key `last`: there, unless it leased nothing, or it read from a position and
    came back short (then the next claim reads from the start)."""
    if last is None or (start is not None and leased < wanted):
        return None
    priority, due, msg_id = last
    return Position(priority, due, msg_id, now if start is None else start.swept_at)


def params(position: Position | None) -> dict[str, Any]:
    """The claim statement's parameters for reading from `position` (None: the beginning):
    the priorities from `from_priority` up are read from the start, and `after_priority`
    after (after_due, after_id); with no position, that is every priority from the start,
    and no row after a key."""
    if position is None:
        return {"from_priority": _LOWEST, "after_priority": _LOWEST - 1, "after_due": None,
                "after_id": None}
    return {"from_priority": position.priority + 1, "after_priority": position.priority,
            "after_due": position.due, "after_id": position.id}
