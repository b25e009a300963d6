"""Retry delays: a pure Backoff value and the decision what to do with a failed delivery.
No I/O and no clock: callers pass the attempt count and a random source."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from tableq.errors import InvalidArgument

BACKOFF_MAX_S = 100 * 365 * 86400.0  # as every other duration: beyond a century is a typo


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: attempt 1 waits `base` seconds, each later attempt `factor` times
    longer, never more than `max`. With `jitter`, the delay is drawn uniformly from
    [delay / 2, delay] ("equal jitter"), so failures that happened together spread out while
    the wait never drops below half the nominal delay."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "factor", "max"):
            value = getattr(self, name)
            # Compared before any float(): 10**400 is a clear error, not an OverflowError.
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not 0 <= value <= BACKOFF_MAX_S):
                shown = repr(value) if not isinstance(value, int) or value < 10**20 else "huge"
                raise InvalidArgument(f"Backoff {name} must be a number from 0 to "
                                      f"{BACKOFF_MAX_S:.0f} (100 years), not {shown}")
            object.__setattr__(self, name, float(value))
        if self.factor < 1:
            raise InvalidArgument(f"Backoff factor must be >= 1, not {self.factor!r}")

    def nominal(self, attempt: int) -> float:
        """The delay before the retry that follows failed attempt number `attempt` (1-based),
        without jitter."""
        if attempt < 1:
            raise InvalidArgument(f"attempt must be >= 1, not {attempt!r}")
        # Compare exponents instead of computing factor**n, which overflows for big n.
        if self.base == 0:
            return 0.0
        if self.factor > 1 and (attempt - 1) * math.log(self.factor) > math.log(
                max(self.max, 1e-12) / self.base) + 1:
            return float(self.max)
        return float(min(self.max, self.base * self.factor ** (attempt - 1)))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay in seconds after failed attempt `attempt`; `rng` draws the jitter."""
        d = self.nominal(attempt)
        if not self.jitter or d == 0:
            return d
        return (rng or random).uniform(d / 2, d)


Action = Literal["ack", "retry", "dead_letter"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a delivery after its handler ran."""

    action: Action
    delay_s: float = 0.0
    error: str | None = None


def decide(*, succeeded: bool, attempts: int, max_attempts: int, backoff: Backoff,
           error: str | None, rng: random.Random | None = None) -> Decision:
    """Ack a success; retry a failure after the backoff delay; dead-letter a failure that used
    the last allowed attempt (so a poison message is dead-lettered after exactly max_attempts
    deliveries, with its error, instead of waiting for one more receive)."""
    if succeeded:
        return Decision("ack")
    if attempts >= max_attempts:
        return Decision("dead_letter", 0.0, error)
    return Decision("retry", backoff.delay(attempts, rng), error)
