"""Helpers for tests, tableq's own and its users': wait for a condition instead of sleeping,
and move a test clock instead of waiting for time to pass."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tableq.queue import Queue

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout: float = 10.0,
               interval: float = 0.02, message: str = "") -> T:
    """Calls `condition` until it returns something truthy and returns that; raises
    TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(message or f"condition still false after {timeout} s")
        time.sleep(interval)


def advance_clock(queue: Queue, seconds: float | timedelta) -> None:
    """Moves the database clock of a queue opened with `tableq.connect(url, test_clock=True,
    migrate=True)` forward by exactly `seconds`. Under a test clock the queue's time (every due
    time, lease and `queue.now()`) stands still until this moves it, on every backend."""
    from tableq.queue import backend_of
    from tableq.queue import seconds as as_seconds

    backend_of(queue).advance_clock(as_seconds("seconds", seconds, 0.0))
