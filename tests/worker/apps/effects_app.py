"""A worker app for process tests. Every handler start appends one line "id attempts" to the
file $EFFECTS (O_APPEND: one write per line, so lines survive kill -9 whole); the "work"
handler appends the same line to $EFFECTS.done when its work is done, just before it returns
(its committed effect: what a lost message would lack). $WORK_SLEEP_S sets how long a handler
takes."""

import os
import time

from tableq.worker import App

EFFECTS = os.environ["EFFECTS"]
SLEEP_S = float(os.environ.get("WORK_SLEEP_S", "0.01"))

app = App(visibility_timeout=float(os.environ.get("VT_S", "2")), poll_interval_max=0.2,
          grace_period=float(os.environ.get("GRACE_S", "10")))


def _effect(message, path: str = EFFECTS) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{message.id} {message.attempts}\n".encode())
    finally:
        os.close(fd)


@app.handler("work", concurrency=4)
def work(message) -> None:
    _effect(message)
    time.sleep(SLEEP_S)  # the job's own duration, part of the scenario
    _effect(message, EFFECTS + ".done")


@app.handler("tick")
def tick(message) -> None:
    _effect(message)


@app.handler("stuck", timeout=0.3, max_attempts=2)
def stuck(message) -> None:
    _effect(message)
    if message.attempts == 1:
        time.sleep(30)  # hangs past its timeout; only a new process gets rid of it
