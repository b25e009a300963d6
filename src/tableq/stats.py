"""Per-topic counters, a frozen value. No I/O."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TopicStats:
    """Counts for one topic at one moment (database time). `oldest_ready_age` is in seconds,
    None when nothing is ready."""

    topic: str
    ready: int
    scheduled: int
    in_flight: int
    dead: int
    oldest_ready_age: float | None
    done: int = 0

    @property
    def live(self) -> int:
        return self.ready + self.scheduled + self.in_flight
