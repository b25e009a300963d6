"""The history checker ("total-queue", after Jepsen): from what producers invoked and were
told, what handlers committed, and what was left after the final drain, it counts lost,
duplicated and unexpected messages, redeliveries and recovery times, and prints one line per
run. Pure: no I/O, so pytest and the long tier use it alike.

Terms:
- a send is *acknowledged* when the producer got `ok`; `info` means the outcome is unknown
  (the connection died around the commit) and `fail` that it certainly did not happen;
- a message is *processed* when its handler's effect committed (an effect row in the
  database under test), not when its handler started;
- *lost*: an acknowledged send that was neither processed nor dead-lettered;
- *duplicated*: processed more than once (must be 0 for exactly_once). For at_least_once,
  duplicates are reported and *dup_live* (two effects under different leases whose lease
  intervals overlap: the queue handed out a message that was still leased) must be 0;
- *unexpected*: an effect for a value nobody sent.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SendOp:
    """The end of one send call: phase 'ok', 'fail' or 'info' (unknown outcome)."""

    value: str
    phase: str
    t: float = 0.0


@dataclass(frozen=True, slots=True)
class Effect:
    """One committed handler effect: its value, the lease it ran under, the database time it
    committed at (`at`), the lease's expiry then (`until`, when known) and the database time
    the lease began (`since`, when known: a starved handler commits long after it)."""

    value: str
    lease: str | None = None
    at: float = 0.0
    until: float | None = None
    since: float | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: what, and when it began and healed (wall clock, seconds)."""

    what: str
    start: float
    healed: float


@dataclass(frozen=True)
class Result:
    test: str
    backend: str
    mode: str
    attempted: int
    acknowledged: int
    unknown: int
    recovered: int
    lost: list[str]
    duplicated: dict[str, int]
    dup_live: list[str]
    unexpected: list[str]
    dead: int
    deliveries: int
    redelivered: int
    faults: list[Fault] = field(default_factory=list)
    recovery_s: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def dup(self) -> int:
        return sum(n - 1 for n in self.duplicated.values())

    @property
    def ok(self) -> bool:
        """Zero lost and zero unexpected always; zero duplicates for exactly_once and zero
        overlapping-lease duplicates for at_least_once."""
        if self.lost or self.unexpected or self.dup_live:
            return False
        return self.mode != "exactly_once" or not self.duplicated

    def recovery_p99(self) -> float | None:
        return percentile(self.recovery_s, 99) if self.recovery_s else None

    def line(self) -> str:
        what = _fault_phrase(self.faults) if self.faults else "no faults"
        text = (f"{self.test}/{self.backend}: {len(self.lost)} lost / {self.dup} dup of "
                f"N={self.acknowledged} across {what}")
        if self.mode != "exactly_once":
            text += f" (at_least_once: {len(self.dup_live)} while leased)"
        text += f"; redelivered {self.redelivered}"
        if self.unknown:
            text += f"; unknown sends {self.unknown}, {self.recovered} found"
        if self.dead:
            text += f"; dead-lettered {self.dead}"
        if self.unexpected:
            text += f"; UNEXPECTED {len(self.unexpected)}"
        p99 = self.recovery_p99()
        if p99 is not None:
            text += f"; recovery p99 {p99:.1f} s"
        if self.note:
            text += f"; {self.note}"
        return text

    def explain(self, limit: int = 10) -> str:
        """The first offending values, for an assertion message."""
        parts = [self.line()]
        if self.lost:
            parts.append(f"lost: {sorted(self.lost)[:limit]}")
        if self.duplicated and self.mode == "exactly_once":
            parts.append(f"duplicated: {sorted(self.duplicated.items())[:limit]}")
        if self.dup_live:
            parts.append(f"dup while leased: {sorted(self.dup_live)[:limit]}")
        if self.unexpected:
            parts.append(f"unexpected: {sorted(self.unexpected)[:limit]}")
        return "\n".join(parts)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _fault_phrase(faults: Sequence[Fault]) -> str:
    kinds = Counter(f.what for f in faults)
    return ", ".join(f"{n} {what}{'' if n == 1 else 'es' if what.endswith('sh') else 's'}"
                     for what, n in kinds.items())


def check(
    test: str,
    backend: str,
    *,
    sends: Iterable[SendOp],
    effects: Iterable[Effect],
    dead: Iterable[str] = (),
    deliveries: int | None = None,
    faults: Sequence[Fault] = (),
    mode: str = "exactly_once",
    note: str = "",
) -> Result:
    """Checks one run. `sends` holds each send call's outcome; `effects` every committed
    effect; `dead` the values in the dead-letter store after the final drain; `deliveries`
    how many times handlers started (for the redelivery count; defaults to the effects)."""
    if mode not in ("exactly_once", "at_least_once"):
        raise ValueError(f"mode must be exactly_once or at_least_once, not {mode!r}")
    phases: dict[str, set[str]] = defaultdict(set)
    for op in sends:
        phases[op.value].add(op.phase)
    acknowledged = {v for v, p in phases.items() if "ok" in p}
    unknown = {v for v, p in phases.items() if "info" in p and "ok" not in p}
    effects = list(effects)
    per_value: dict[str, list[Effect]] = defaultdict(list)
    for e in effects:
        per_value[e.value].append(e)
    dead_values = set(dead)
    done = set(per_value) | dead_values
    lost = sorted(acknowledged - done)
    # A value nobody invoked, or one whose every send certainly failed, should never run.
    unexpected = sorted(v for v in done if v not in phases or phases[v] == {"fail"})
    duplicated = {v: len(es) for v, es in per_value.items() if len(es) > 1}
    dup_live = sorted(v for v in duplicated if _overlapping(per_value[v]))
    n_deliveries = len(effects) if deliveries is None else deliveries
    redelivered = max(0, n_deliveries - len(per_value))
    recovery = _recovery_times(faults, effects)
    return Result(
        test=test, backend=backend, mode=mode, attempted=len(phases),
        acknowledged=len(acknowledged), unknown=len(unknown),
        recovered=len(unknown & done), lost=lost, duplicated=duplicated, dup_live=dup_live,
        unexpected=unexpected, dead=len(dead_values), deliveries=n_deliveries,
        redelivered=redelivered, faults=list(faults), recovery_s=recovery, note=note,
    )


def _overlapping(effects: list[Effect]) -> bool:
    """Two effects under different leases whose lease intervals overlap. An interval starts
    when its lease began (`since`) where that is known, else when its effect committed."""

    def start(e: Effect) -> float:
        return e.at if e.since is None else e.since

    timed = sorted((e for e in effects if e.until is not None), key=start)
    for a, b in zip(timed, timed[1:], strict=False):
        if a.lease != b.lease and a.until is not None and start(b) < a.until:
            return True
    return False


def _recovery_times(faults: Sequence[Fault], effects: Sequence[Effect]) -> list[float]:
    """Per fault, seconds from its healing to the first effect committed after it."""
    times = sorted(e.at for e in effects)
    out = []
    for f in faults:
        later = [t for t in times if t >= f.healed]
        if later:
            out.append(later[0] - f.healed)
    return out
