"""`tableq pipeline load` and `report` in a subprocess, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tableq

from .conftest import child_env, require_java


@pytest.mark.slow
def test_load_then_report_from_the_command_line(tmp_path: Path) -> None:
    require_java()
    url = f"sqlite:///{tmp_path}/cli.db"
    q = tableq.connect(url, migrate=True, retention=True)
    (tmp_path / "in.jsonl").write_text("".join(f'{{"n": {i}, "who": "w{i}"}}\n'
                                               for i in range(25)))
    tq = [sys.executable, "-m", "tableq.cli"]
    load = subprocess.run([*tq, "pipeline", "load", "--url", url, "--master", "local[2]",
                           "--topic", "jobs", "--key", "who", str(tmp_path / "in.jsonl")],
                          capture_output=True, text=True, env=child_env(), timeout=180)
    assert load.returncode == 0, load.stderr[-2000:]
    assert "loaded 25 rows into 'jobs'" in load.stdout
    for m in q.receive("jobs", max=25):
        q.ack(m)
    rep = subprocess.run([*tq, "pipeline", "report", "--url", url, "--master", "local[2]",
                          "--html", str(tmp_path / "r.html")],
                         capture_output=True, text=True, env=child_env(), timeout=180)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "jobs" in rep.stdout and "25" in rep.stdout
    page = (tmp_path / "r.html").read_text()
    assert "Queue report" in page and "<svg class=\"plot\"" in page and "jobs" in page
    q.close()
