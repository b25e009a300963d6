"""Per-topic counters, a frozen value, and how stats() decides to count or to estimate.
No I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Counting every live row costs time in proportion to the table (about 200 ms a million
# rows on PostgreSQL, a second on MariaDB). Above EXACT_SPAN ids between the oldest and
# newest live message, stats() reads SAMPLE_IDS ids instead, in SAMPLE_WINDOWS evenly spread
# id windows, and scales what it finds; a topic estimated below EXACT_TOPIC rows, or seen in
# fewer than MIN_WINDOWS windows, is then counted exactly anyway, so small topics beside a
# big one stay exact.
EXACT_SPAN = 200_000
SAMPLE_IDS = 20_000
SAMPLE_WINDOWS = 100
EXACT_TOPIC = 20_000
MIN_WINDOWS = 10  # ... and found in fewer windows than this


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
    # True when ready / scheduled / in_flight were scaled up from a sample of the table
    # (topics of more than about EXACT_TOPIC live messages in a big table); like SQS's
    # ApproximateNumberOfMessages, within a few percent. dead, done and oldest_ready_age
    # are always exact.
    estimated: bool = False

    @property
    def live(self) -> int:
        return self.ready + self.scheduled + self.in_flight


@dataclass(frozen=True, slots=True)
class IdSample:
    """Windows of `width` ids starting at lo, lo + stride, ... up to hi: each window stands
    for the `stride` ids from its start."""

    lo: int
    hi: int
    stride: int
    width: int

    @property
    def scale(self) -> float:
        return self.stride / self.width


def id_sample(lo: int | None, hi: int | None, *, exact_span: int = EXACT_SPAN,
              ids: int = SAMPLE_IDS, windows: int = SAMPLE_WINDOWS) -> IdSample | None:
    """The sample to estimate a table whose live ids run from lo to hi, or None when the
    span is small enough to count every row."""
    if lo is None or hi is None or hi - lo + 1 <= max(exact_span, ids):
        return None
    stride = math.ceil((hi - lo + 1) / windows)
    return IdSample(lo, hi, stride, max(1, min(stride, ids // windows)))


def scaled(sampled: Mapping[str, Any], sample: IdSample) -> dict[str, int]:
    """A topic's ready / scheduled / in_flight rows in the sample, scaled to the table."""
    return {k: round(int(sampled[k] or 0) * sample.scale)
            for k in ("ready", "scheduled", "in_flight")}


def needs_exact(counts: Mapping[str, int], windows: int, *, exact_topic: int = EXACT_TOPIC,
                min_windows: int = MIN_WINDOWS) -> bool:
    """Whether a topic's scaled sample is too small to trust (count the topic instead):
    too few rows, or rows found in too few windows (a topic sent in one burst sits in a
    narrow id range, and the one window that hits it would be scaled up as if it were
    everywhere)."""
    return sum(counts.values()) < exact_topic or windows < min_windows


def topic_estimate(counts: Mapping[str, int], heads: Sequence[Mapping[str, Any]],
                   cap: int = EXACT_TOPIC) -> dict[str, Any]:
    """A big topic's stats: ready as scaled from the sample; scheduled and in_flight as
    counted from the claim index (one head a priority), unless a priority had `cap` of them
    (then scaled too); the oldest ready message of all its priorities."""
    out: dict[str, Any] = {**counts, "estimated": True}
    for k in ("scheduled", "in_flight"):
        if all(int(h[k]) < cap for h in heads):
            out[k] = sum(int(h[k]) for h in heads)
    ages = [float(h["oldest_ready_age"]) for h in heads if h["oldest_ready_age"] is not None]
    out["oldest_ready_age"] = max(ages) if ages else None
    return out
