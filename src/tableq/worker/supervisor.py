"""Process-level control: runs a Worker in the foreground with signal handling (the first
SIGTERM/SIGINT stops gracefully, a second exits at once), and supervises N worker processes
(`--processes N`), forwarding signals and replacing children that die. No SQL."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self

from tableq.worker import events
from tableq.worker.runner import Worker

if TYPE_CHECKING:
    import subprocess
    from multiprocessing.process import BaseProcess

EXIT_AT_ONCE = 130  # what a second signal exits with (128 + SIGINT, by shell convention)
EXIT_RESTART = 75  # a child asks to be replaced (a handler thread timed out and still runs)
RESTART_DELAY_MAX_S = 10.0
GIVE_UP_AFTER_FAST_FAILS = 5  # a child that dies this often in a row, soon after starting
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Signals:
    """First signal calls `first`; a second one calls `second`. Restores handlers on exit."""

    def __init__(self, first: Callable[[int], None], second: Callable[[int], None]) -> None:
        self._first, self._second = first, second
        self._count = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        self._count += 1
        if self._count == 1:
            self._first(signum)
        else:
            self._second(signum)


PARENT_ENV = "TABLEQ_WORKER_PARENT"  # set in the children of a supervisor: its pid


def run_foreground(worker: Worker, *, install_signals: bool = True) -> None:
    """Runs the worker until it stops; with install_signals, SIGTERM/SIGINT stop it
    gracefully and a second signal ends the process at once (leases then run out and the
    messages come back to other workers). A supervised child also stops gracefully when
    its supervisor disappears."""
    error: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
            error.append(exc)

    def first(signum: int) -> None:
        events.emit("signal", signal=signal.Signals(signum).name, action="graceful stop")
        worker.stop()

    def second(signum: int) -> None:
        events.emit("signal", signal=signal.Signals(signum).name, action="exit now")
        os._exit(EXIT_AT_ONCE)

    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    thread = threading.Thread(target=target, name="tableq-worker")
    if install_signals:
        with _Signals(first, second):
            thread.start()
            # Join in slices: the main thread must stay free to run signal handlers.
            while thread.is_alive():
                thread.join(0.2)
                if parent and os.getppid() != parent and not worker.stopping:
                    events.emit("supervisor_gone", parent=parent, action="graceful stop")
                    worker.stop()
    else:
        thread.start()
        thread.join()
    if error:
        raise error[0]


class Child(Protocol):
    pid: int | None

    def exitcode(self) -> int | None: ...
    def signal(self, signum: int) -> None: ...


class PopenChild:
    def __init__(self, popen: subprocess.Popen[Any]) -> None:
        self._p = popen
        self.pid = popen.pid

    def exitcode(self) -> int | None:
        return self._p.poll()

    def signal(self, signum: int) -> None:
        if self._p.poll() is None:
            self._p.send_signal(signum)


class ProcessChild:
    def __init__(self, process: BaseProcess) -> None:
        self._p = process
        self.pid = process.pid

    def exitcode(self) -> int | None:
        return self._p.exitcode

    def signal(self, signum: int) -> None:
        if self._p.exitcode is None and self._p.pid is not None:
            try:
                os.kill(self._p.pid, signum)
            except ProcessLookupError:
                pass


def supervise(start: Callable[[int], Child], count: int, *, burst: bool = False,
              install_signals: bool = True) -> int:
    """Runs `count` children made by start(slot). A child that exits while we are not
    stopping is replaced (after a delay that grows if it keeps dying fast), except in burst
    mode, where a child that exits 0 is done. Returns 0 if every child ended cleanly."""
    children: list[Child | None] = [start(i) for i in range(count)]
    started = [time.monotonic()] * count
    fails = [0] * count
    restart_at: list[float | None] = [None] * count
    stopping = threading.Event()
    worst = 0

    def first(signum: int) -> None:
        events.emit("signal", signal=signal.Signals(signum).name, action="graceful stop",
                    children=count)
        stopping.set()
        for c in children:
            if c is not None:
                c.signal(signal.SIGTERM)

    def second(signum: int) -> None:
        events.emit("signal", signal=signal.Signals(signum).name, action="exit now")
        for c in children:
            if c is not None:
                c.signal(signal.SIGKILL)
        os._exit(EXIT_AT_ONCE)

    ctx = _Signals(first, second) if install_signals else _NoSignals()
    with ctx:
        while True:
            now = time.monotonic()
            for i, c in enumerate(children):
                if c is None:
                    due = restart_at[i]
                    if due is not None and now >= due and not stopping.is_set():
                        children[i], started[i], restart_at[i] = start(i), now, None
                    continue
                code = c.exitcode()
                if code is None:
                    continue
                children[i] = None
                if stopping.is_set() or (burst and code == 0):
                    worst = max(worst, exit_status(code, stopped=stopping.is_set()))
                    continue
                fast = now - started[i] < 5.0 and code != EXIT_RESTART
                fails[i] = fails[i] + 1 if fast else 0
                if fails[i] >= GIVE_UP_AFTER_FAST_FAILS:
                    events.emit("giving_up", logging.ERROR, pid=c.pid, code=code,
                                fast_failures=fails[i])
                    stopping.set()
                    for other in children:
                        if other is not None:
                            other.signal(signal.SIGTERM)
                    worst = max(worst, exit_status(code, stopped=False) or 1)
                    continue
                delay = min(RESTART_DELAY_MAX_S, 0.5 * 2 ** fails[i]) if fails[i] else 0.0
                events.emit("child_exited", 30, pid=c.pid, code=code, restart_in_s=delay)
                restart_at[i] = now + delay
            if all(c is None for c in children) and (
                    stopping.is_set() or all(r is None for r in restart_at)):
                return worst
            time.sleep(0.1)


def exit_status(code: int, *, stopped: bool) -> int:
    """A child's exit code as the supervisor's: a child ended by the SIGTERM of a stop
    (`stopped`) did as asked (0); one killed by another signal, as a shell says it
    (128 + the signal: 137 for a kill -9 or the OOM killer)."""
    if code < 0:
        return 0 if stopped and code == -signal.SIGTERM else 128 - code
    return code


class _NoSignals:
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def detach_from_terminal_signals() -> None:
    """In a child: leave the terminal's process group, so Ctrl-C reaches only the supervisor
    (which forwards one SIGTERM) instead of every child twice."""
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group leader: nothing to leave
        return


def child_command(argv: Sequence[str]) -> list[str]:
    """The command line of one child of `tableq worker --processes N`."""
    import sys

    return [sys.executable, "-m", "tableq.cli", *argv]
