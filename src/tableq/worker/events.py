"""Structured log lines for the worker: one line per state change, with a stable event name
and key=value fields (also attached to the record as `event` and `fields`). No I/O besides
logging."""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger("tableq.worker")

# The stable event names: tests, dashboards and log queries may rely on them.
RECEIVED = "received"
ACKED = "acked"
RETRIED = "retried"
DEAD_LETTERED = "dead_lettered"
LEASE_LOST = "lease_lost"
RELEASED = "released"
TIMED_OUT = "timed_out"
FAILED = "failed"  # at_most_once: the message is gone, only the error is logged
ENQUEUED = "periodic_enqueued"
STARTED = "worker_started"
STOPPING = "worker_stopping"
STOPPED = "worker_stopped"
IDLE = "idle"  # DEBUG only


# Control characters (ESC sequences, C1, bidi overrides) in a field, say an error text that
# quotes a payload, must not reach the terminal or the log viewer that shows these lines.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _fmt(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text) or _CONTROL.search(text):
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return '"' + _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + '"'
    return text


def emit(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Logs `event key=value ...` (None values are left out)."""
    if not logger.isEnabledFor(level):
        return
    shown = {k: v for k, v in fields.items() if v is not None}
    text = " ".join([event, *(f"{k}={_fmt(v)}" for k, v in shown.items())])
    logger.log(level, text, extra={"event": event, "fields": shown})
