"""Helpers for tests, tableq's own and its users': wait for a condition instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
