"""`tableq worker` as a real process, on every backend: kill -9 mid-batch loses nothing;
SIGTERM releases prefetched messages with their attempts unchanged; a second signal exits
at once; --processes N drains with several children. Handler starts and finished work are
lines in files written with O_APPEND, so a kill cannot erase them; a message counts as
processed only when its work is done, never because its handler started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from workerhelpers import start_worker_process

import tableq
from tableq.testing import wait_until

pytestmark = pytest.mark.slow


def effects(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line]


def stop(proc: subprocess.Popen[bytes], log: Path, *, signal_first: bool = True,
         timeout: float = 20) -> tuple[int, str]:
    """SIGTERM (unless already sent) and wait; returns the exit code and the output."""
    if signal_first and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout)
    return proc.returncode, log.read_text(errors="replace")


@pytest.fixture
def queue(db_url):
    q = tableq.connect(db_url, migrate=True)
    yield q
    q.close()


def test_kill_9_mid_batch_loses_nothing(db_url, queue, tmp_path):
    # F1 in small: three kill -9 cycles while the worker is mid-batch, then a clean drain.
    n, kills = 400, 3
    fx = tmp_path / "effects.txt"
    queue.send_many("work", [{"n": i} for i in range(n)])
    ids = {m.id for m in queue.peek("work", n)}
    env = {"EFFECTS": str(fx), "WORK_SLEEP_S": "0.02", "VT_S": "1"}
    log = tmp_path / "worker.log"
    held_at_kills = []
    for cycle in range(kills):
        proc = start_worker_process(db_url, "effects_app:app", "--topic", "work",
                                    "--prefetch", "4", log=log, **env)
        try:
            target = len(effects(fx)) + 40
            wait_until(lambda t=target: len(effects(fx)) >= t, timeout=30)
            held_at_kills.append(queue.stats("work")[0].in_flight)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL, f"cycle {cycle}"
    final = start_worker_process(db_url, "effects_app:app", "--topic", "work", log=log, **env)
    try:
        wait_until(lambda: queue.stats("work")[0].live == 0, timeout=60)
    finally:
        code, out = stop(final, log)
    assert code == 0, out
    done = Counter(i for i, _ in effects(fx.with_name(fx.name + ".done")))
    started = Counter(i for i, _ in effects(fx))
    lost = ids - set(done)
    redelivered = sum(c - 1 for c in started.values())
    assert not lost, f"lost {len(lost)} of {n}"
    assert set(done) <= ids  # nothing unexpected
    # Redelivered at most what the killed workers held.
    assert redelivered <= sum(held_at_kills), (redelivered, held_at_kills)
    assert queue.stats("work")[0].dead == 0
    print(f"kill-9 {queue.dialect}: N={n} kills={kills} lost=0 redelivered={redelivered} "
          f"held_at_kills={held_at_kills}")


def test_sigterm_releases_prefetched_with_attempts_unchanged(db_url, queue, tmp_path):
    fx = tmp_path / "effects.txt"
    queue.send_many("work", [{"n": i} for i in range(10)])
    env = {"EFFECTS": str(fx), "WORK_SLEEP_S": "1.0", "VT_S": "5"}
    log = tmp_path / "worker.log"
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "work",
                                "--concurrency", "1", "--prefetch", "5", log=log, **env)
    try:
        # One running, five fetched and waiting for the only thread.
        wait_until(lambda: len(effects(fx)) == 1 and queue.stats("work")[0].in_flight == 6,
                   timeout=20)
        started = time.monotonic()
        code, out = stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out
    assert time.monotonic() - started < 5  # within the grace period, not after a lease
    assert "released" in out and "worker_stopped" in out
    (ran,) = effects(fx)
    left = queue.peek("work", 20)
    assert len(left) == 9 and ran[0] not in {m.id for m in left}
    assert [m.attempts for m in left] == [0] * 9  # released, not charged
    assert queue.stats("work")[0].in_flight == 0


def test_second_signal_exits_at_once(db_url, queue, tmp_path):
    fx = tmp_path / "effects.txt"
    queue.send("work", {})
    env = {"EFFECTS": str(fx), "WORK_SLEEP_S": "60", "VT_S": "2", "GRACE_S": "60"}
    log = tmp_path / "worker.log"
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "work", log=log, **env)
    try:
        wait_until(lambda: len(effects(fx)) == 1, timeout=20)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "worker_stopping" in log.read_text(), timeout=10)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert time.monotonic() - started < 5
    # The message was not lost: it comes back after its lease.
    wait_until(lambda: queue.stats("work")[0].ready == 1, timeout=10)


def test_processes_mode_drains_in_burst(db_url, queue, tmp_path):
    fx = tmp_path / "effects.txt"
    queue.send_many("work", list(range(40)))
    log = tmp_path / "worker.log"
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "work",
                                "--processes", "2", "--burst", log=log, EFFECTS=str(fx),
                                WORK_SLEEP_S="0.01")
    code, out = stop(proc, log, signal_first=False, timeout=60)
    assert code == 0, out
    assert len({i for i, _ in effects(fx)}) == 40
    assert queue.stats("work")[0].live == 0
    assert out.count("worker_started") == 2


def test_process_mode_replaces_a_worker_whose_handler_timed_out(db_url, queue, tmp_path):
    fx = tmp_path / "effects.txt"
    queue.send("stuck", {})
    log = tmp_path / "worker.log"
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "stuck",
                                "--processes", "2", log=log, EFFECTS=str(fx))
    try:
        wait_until(lambda: [a for _, a in effects(fx)] == [1, 2], timeout=30)
        wait_until(lambda: queue.stats("stuck")[0].live == 0, timeout=10)
        wait_until(lambda: log.read_text().count("worker_started") >= 3, timeout=20)
    finally:
        code, out = stop(proc, log)
    assert code == 0, out
    assert "timed_out" in out and "restart=True" in out
    assert queue.stats("stuck")[0].dead == 0


def test_ctrl_c_in_process_mode_is_one_graceful_stop(db_url, queue, tmp_path):
    # A terminal's Ctrl-C signals the whole foreground process group: the children must not
    # see it twice (once from the terminal, once forwarded), which would exit them at once.
    fx = tmp_path / "effects.txt"
    queue.send_many("work", list(range(4)))
    log = tmp_path / "worker.log"
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "work", "--processes",
                                "2", "--concurrency", "1", log=log, new_session=True,
                                EFFECTS=str(fx), WORK_SLEEP_S="1.0")
    try:
        wait_until(lambda: log.read_text().count("worker_started") == 2, timeout=20)
        wait_until(lambda: len(effects(fx)) >= 2, timeout=20)
        os.killpg(proc.pid, signal.SIGINT)
        code, out = stop(proc, log, signal_first=False, timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0, out
    assert "exit now" not in out
    assert out.count("worker_stopped") == 2
    assert queue.stats("work")[0].in_flight == 0  # finished or released, none left leased


def test_run_worker_processes_from_python(db_url, queue, tmp_path):
    import sys

    from workerhelpers import APPS_DIR, cli_env

    fx = tmp_path / "effects.txt"
    queue.send_many("work", list(range(30)))
    code = ("import effects_app, sys; "
            "sys.exit(effects_app.app.run_worker(['work'], processes=2, burst=True))")
    r = subprocess.run([sys.executable, "-c", code], env=cli_env(db_url, EFFECTS=str(fx)),
                       cwd=str(APPS_DIR), capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert len({i for i, _ in effects(fx)}) == 30
    assert queue.stats("work")[0].live == 0


def test_processes_mode_refuses_a_topic_without_a_handler_at_once(db_url, queue, tmp_path):
    """One clear error from the supervisor, not N children failing one after the other
    until it gives up (which took about 18 s and exited 15, a sibling's SIGTERM)."""
    log = tmp_path / "worker.log"
    started = time.monotonic()
    proc = start_worker_process(db_url, "effects_app:app", "--topic", "nosuch",
                                "--processes", "2", log=log, EFFECTS=str(tmp_path / "fx"))
    code = proc.wait(timeout=60)
    out = log.read_text()
    assert code == 1, out
    assert "no handler for topic(s) ['nosuch']" in out and "worker_started" not in out
    assert time.monotonic() - started < 10


def test_a_child_stopped_by_the_supervisors_sigterm_ended_as_asked():
    from tableq.worker.supervisor import exit_status

    assert exit_status(-signal.SIGTERM, stopped=True) == 0
    assert exit_status(-signal.SIGTERM, stopped=False) == 128 + signal.SIGTERM
    assert exit_status(-signal.SIGKILL, stopped=True) == 137
    assert (exit_status(0, stopped=True), exit_status(3, stopped=False)) == (0, 3)
