"""Put on PYTHONPATH only for C1's processes, which run under libfaketime with the monotonic
clock left real (FAKETIME_DONT_FAKE_MONOTONIC=1). libfaketime 0.9.10 then fails Python's
time.sleep (clock_nanosleep on the monotonic clock with an absolute deadline) with EINVAL;
a select() timeout sleeps the same time without that call. Nothing else is changed."""

import os
import select
import time

if "faketime" in os.environ.get("LD_PRELOAD", ""):
    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        select.select([], [], [], seconds)

    time.sleep = _sleep
