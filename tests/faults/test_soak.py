"""The soak (soak.py) run for a few seconds on SQLite, so the long tier's one-hour command
cannot rot unseen: its workers log at WARNING, and stopping them once waited for an INFO
line they never write (TimeoutError after the hour, no checker line printed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAULTS_DIR = Path(__file__).parent


def test_short_soak_reports_and_passes() -> None:
    run = subprocess.run(
        [sys.executable, "soak.py", "--minutes", "0.25", "--db", "sqlite", "--rate", "20",
         "--sample-s", "5"],
        cwd=FAULTS_DIR, capture_output=True, text=True, timeout=280)
    out = run.stdout + run.stderr
    print(out)
    assert run.returncode == 0, out
    lines = out.splitlines()
    checker = [line for line in lines if line.startswith("B3-soak/sqlite: ")]
    assert len(checker) == 2, out
    assert all(" 0 lost / 0 dup of N=" in line for line in checker), out
    assert any(line.startswith("t=") and " rss=[" in line for line in lines), out
    assert any(line.startswith("drained a backlog of about ") for line in lines), out
    assert any(line.startswith("table size: first sample ") and " peak [" in line
               for line in lines), out
    assert lines[-1] == "OK", out
