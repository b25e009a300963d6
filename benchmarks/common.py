"""Shared pieces of the benchmark cases: the payload every system sends, the target a case
runs against, percentiles, and thread helpers. No database code and no system-specific code."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PAYLOAD: dict[str, Any] = {"user": 12345, "action": "noop", "pad": "x" * 60}
PAYLOAD_BYTES = len(json.dumps(PAYLOAD))  # ~100 bytes of JSON, as in issue 15
FILL_BATCH = 1000


def payload(n: int = 0, **extra: Any) -> dict[str, Any]:
    """The ~100-byte JSON payload, numbered so a consumer can tell messages apart."""
    return {**PAYLOAD, "n": n, **extra}


@dataclass(frozen=True)
class Target:
    """Where one case runs: a fresh PostgreSQL database, MariaDB database or SQLite file,
    made for this case alone and dropped after it."""

    db: str  # postgres | mysql | sqlite
    host: str = "127.0.0.1"
    port: int = 0
    database: str = ""  # PostgreSQL/MariaDB database name, or the SQLite file path
    user: str = ""
    synchronous: str = "FULL"  # SQLite only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tableq_url(self) -> str:
        if self.db == "sqlite":
            return f"sqlite:///{self.database}"
        if self.db == "postgres":
            return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"
        return f"mysql://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def dsn(self) -> str:
        """libpq connection string (PostgreSQL only)."""
        return f"host={self.host} port={self.port} dbname={self.database} user={self.user}"

    @property
    def sqlalchemy_url(self) -> str:
        if self.db == "sqlite":
            return f"sqlite:///{self.database}"
        return f"mysql+pymysql://{self.user}@{self.host}:{self.port}/{self.database}"

    def to_json(self) -> dict[str, Any]:
        return {"db": self.db, "host": self.host, "port": self.port, "database": self.database,
                "user": self.user, "synchronous": self.synchronous, "extra": self.extra}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Target:
        return Target(**d)


def idle_gaps(p: dict[str, Any]) -> Callable[[], float]:
    """The pause before each pickup sample: uniform in p["gap_s"] (default 20-200 ms, as
    between real sends), seeded so every system sees the same sequence. Long enough gaps let
    an adaptive poller back off, which is where a polling tail comes from."""
    lo, hi = p.get("gap_s", (0.02, 0.2))
    rng = random.Random(p.get("seed", 1))
    return lambda: rng.uniform(lo, hi)


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile by nearest rank (no interpolation: a p99 is a value seen)."""
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def latency_summary(ms: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms), "samples": len(ms)}


def run_threads(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Runs target(i) in n threads, started together; returns their results in order and
    re-raises the first exception any of them raised."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    gate = threading.Barrier(n + 1)

    def body(i: int) -> None:
        gate.wait()
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def timed_threads(n: int, target: Callable[[int], Any]) -> tuple[float, list[Any]]:
    """run_threads with the wall time from the common start to the last thread's end."""
    t0 = time.perf_counter()
    out = run_threads(n, target)
    return time.perf_counter() - t0, out


def split(total: int, parts: int) -> list[int]:
    """total split into `parts` near-equal whole shares."""
    base, rest = divmod(total, parts)
    return [base + (1 if i < rest else 0) for i in range(parts)]


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.005) -> Any:
    """Polls condition until truthy; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout_s} s")
        time.sleep(interval_s)
