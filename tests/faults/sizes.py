"""Sizes of the fault tests, as environment variables, so the longer tier reruns the same
tests with larger N: TABLEQ_FAULT_SCALE multiplies every default (1 in CI), and
TABLEQ_FAULT_<NAME> sets one size outright (e.g. TABLEQ_FAULT_D1_KEYS=10000)."""

from __future__ import annotations

import os

SCALE = float(os.environ.get("TABLEQ_FAULT_SCALE", "1"))


def size(name: str, default: float) -> int:
    """The size called `name`: TABLEQ_FAULT_<NAME> if set, else default x TABLEQ_FAULT_SCALE."""
    raw = os.environ.get(f"TABLEQ_FAULT_{name.upper()}")
    return int(raw) if raw else max(1, int(round(default * SCALE)))
