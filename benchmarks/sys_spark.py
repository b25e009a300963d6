"""The Spark scenario of the benchmark command: benchmarks/spark_bench.py's measure() on
the case's PostgreSQL database (local[2], Java 17, Debian's pgJDBC jar for the JDBC paths)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Target


def setup(t: Target) -> None:
    """Nothing: every path makes its own schema."""


def spark(t: Target, p: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.spark_bench import measure

    return measure(t.tableq_url, rows=p["rows"], stream_rows=p["stream_rows"],
                   rounds=p.get("rounds", 2))


CASES = {"spark": spark}
