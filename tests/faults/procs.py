"""Starting the fault tests' helper processes (tests/faults/_*.py) with tests/faults and src
importable, their output in a log file, and a barrier that starts a group of them together."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from history import read_records

from tableq.testing import wait_until

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)]),
           "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def spawn(script: str, *args: object, log: Path, env: dict[str, str] | None = None,
          prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`python tests/faults/<script> ARGS`, optionally behind a command prefix (faketime)."""
    with open(log, "ab") as out:
        return subprocess.Popen([*prefix, sys.executable, str(HERE / script),
                                 *map(str, args)], env=env or child_env(), stdout=out,
                                stderr=subprocess.STDOUT)


def release_when_ready(procs: list[subprocess.Popen[bytes]], histories: Sequence[Path],
                       barrier: Path, log: Path, timeout: float = 60) -> None:
    """Waits until every process logged `ready`, then opens the barrier they wait at."""
    def ready() -> bool:
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, log.read_text(errors="replace")[-3000:]
        return sum(1 for r in read_records(histories) if r.get("op") == "ready") >= len(procs)
    wait_until(ready, timeout=timeout)
    barrier.touch()


def finish(procs: list[subprocess.Popen[bytes]], log: Path, timeout: float = 300) -> None:
    """Waits for every process to exit 0 (kills the rest if one hangs)."""
    try:
        for p in procs:
            p.wait(timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    codes = [p.returncode for p in procs]
    assert codes == [0] * len(procs), f"exit codes {codes}\n" + log.read_text(
        errors="replace")[-3000:]
