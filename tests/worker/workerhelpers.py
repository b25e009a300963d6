"""Helpers for worker and CLI tests: run a Worker in a thread and stop it (re-raising its
errors), and start `tableq worker` in a subprocess with tests/worker/apps importable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tableq.testing import wait_until
from tableq.worker import Worker

APPS_DIR = Path(__file__).parent / "apps"
SRC_DIR = Path(__file__).resolve().parents[2] / "src"


@contextmanager
def running(worker: Worker, *, timeout: float = 20.0) -> Iterator[Worker]:
    """Runs the worker in a thread for the block, then stops it gracefully."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(lambda: worker.running.is_set() or errors or not thread.is_alive(), timeout=10)
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout)
        if thread.is_alive():
            raise AssertionError("worker did not stop within its timeout")
        if errors:
            raise errors[0]


def run_burst(worker: Worker, timeout: float = 60.0) -> None:
    """Runs a burst worker to completion in a thread (so a hang fails instead of blocking)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.stop()
        raise AssertionError(f"burst worker did not finish within {timeout} s")
    if errors:
        raise errors[0]


def cli_env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["TABLEQ_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def start_worker_process(url: str, spec: str, *args: str, log: Path, new_session: bool = False,
                         **env: str) -> subprocess.Popen[bytes]:
    """`tableq worker SPEC ARGS` in a subprocess, with tests/worker/apps importable; its
    output goes to the file `log` (read it while it runs without filling a pipe)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tableq.cli", "worker", spec, *args],
            env=cli_env(url, **env), cwd=str(APPS_DIR), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
