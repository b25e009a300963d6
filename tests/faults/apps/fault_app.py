"""The worker app of the worker fault tests (run as `tableq worker fault_app:app`). Test code,
not library code: every fault hook lives here.

Two topics, one per delivery mode: "alo" (at_least_once: the handler commits its effect row in
its own transaction, then returns and the worker acks) and "eo" (exactly_once: the effect row
is written in the handler's transaction, which commits together with the ack). Every handler
start is appended to a per-process history file; effect rows are in the database under test.

Environment:
  FAULT_DIR          where history files go
  FAULT_VT_S         visibility timeout (default 5)
  FAULT_SLEEP_S      how long a handler works (default 0.005)
  FAULT_CONCURRENCY  threads per topic (default 4)
  FAULT_PREFETCH     App(prefetch=) (default 0)
  FAULT_MAX_ATTEMPTS max_attempts (default 5)
  FAULT_RETRY_S      the first retry's delay (default 1; doubling)
  FAULT_BUSY_TIMEOUT_S  SQLite only: the busy timeout
  FAULT_KILL         "point=v1,v2;point=v3": kill -9 this process at `point` of those values,
                     once per value (a marker file in FAULT_DIR says it happened; the attempt
                     count cannot: a message charged ahead and never started comes back with
                     attempts 2 on its first run). Points: received (first thing in the
                     handler), handler (mid-work), before_ack (effect committed, not yet
                     returned: at_least_once), after_write (effect written inside the
                     exactly-once transaction, not yet committed)
  FAULT_KILL_ALWAYS  values that kill the process at every run (a poison that crashes it)
  FAULT_POISON       values whose handler always raises (dead-lettered after max_attempts)
"""

import logging
import os
import signal
import threading
import time
from pathlib import Path

from history import EffectTable, History, epoch

from tableq.worker import App, Backoff

DIR = Path(os.environ.get("FAULT_DIR", "."))
VT_S = float(os.environ.get("FAULT_VT_S", "5"))
SLEEP_S = float(os.environ.get("FAULT_SLEEP_S", "0.005"))
CONCURRENCY = int(os.environ.get("FAULT_CONCURRENCY", "4"))
RETRY = Backoff(base=float(os.environ.get("FAULT_RETRY_S", "1")), jitter=False)


def _kill_plan() -> dict[str, str]:
    plan = {}
    for part in filter(None, os.environ.get("FAULT_KILL", "").split(";")):
        point, _, values = part.partition("=")
        plan.update((v, point) for v in values.split(",") if v)
    return plan


KILL_AT = _kill_plan()
KILL_ALWAYS = set(filter(None, os.environ.get("FAULT_KILL_ALWAYS", "").split(",")))
POISON = set(filter(None, os.environ.get("FAULT_POISON", "").split(",")))

_sqlite = {"busy_timeout_s": float(os.environ["FAULT_BUSY_TIMEOUT_S"])} if os.environ.get(
    "FAULT_BUSY_TIMEOUT_S") else {}
# Log lines carry the process id, so a test can tell which worker process is up.
for _handler in logging.getLogger().handlers:
    _handler.setFormatter(logging.Formatter(
        "%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"))
app = App(visibility_timeout=VT_S, poll_interval_max=0.2, grace_period=10,
          max_attempts=int(os.environ.get("FAULT_MAX_ATTEMPTS", "5")),
          prefetch=int(os.environ.get("FAULT_PREFETCH", "0")), **_sqlite)
history = History(DIR / f"deliver-{os.getpid()}.jsonl")
_effects: EffectTable | None = None
_local = threading.local()


def effects() -> EffectTable:
    global _effects
    if _effects is None:
        _effects = EffectTable(app.url)
    return _effects


# Held from a kill's marker file to the process's death: two handler threads reaching their
# kill points together must not both claim a marker while only one writes its kill record.
_killing = threading.Lock()


def maybe_kill(point: str, message) -> None:
    value = message.payload["v"]
    always = value in KILL_ALWAYS and point == "received"
    if not always and KILL_AT.get(value) != point:
        return
    with _killing:  # never released when it kills: the process dies inside
        if always or _first_kill(value):
            history.write(op="kill", value=value, point=point, attempts=message.attempts)
            os.kill(os.getpid(), signal.SIGKILL)


def _first_kill(value: str) -> bool:
    try:
        os.close(os.open(DIR / f"killed-{value}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def record_committed(value: str, message) -> None:
    """The at-least-once effect, committed in its own transaction before the handler returns.
    A robust handler: on a database error it reconnects and tries again until it is written,
    once per delivery (a retry whose first try committed after all writes nothing)."""
    while True:
        conn = getattr(_local, "conn", None)
        try:
            if conn is None:
                conn = _local.conn = effects().connect()
            effects().record_once(conn, value, lease=message.lease,
                                  until=epoch(message.lease_expires_at))
            conn.commit()
            return
        except Exception:  # noqa: BLE001 - any database failure: reconnect and retry
            _local.conn = None
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - it is broken either way
                pass
            time.sleep(0.2)


@app.handler("alo", concurrency=CONCURRENCY, retry=RETRY)
def alo(message) -> None:
    value = message.payload["v"]
    history.deliver(value, lease=message.lease, attempts=message.attempts, mode="alo")
    maybe_kill("received", message)
    time.sleep(SLEEP_S / 2)
    maybe_kill("handler", message)
    time.sleep(SLEEP_S / 2)
    if value in POISON:
        raise RuntimeError(f"poison {value} failed on attempt {message.attempts}")
    record_committed(value, message)
    maybe_kill("before_ack", message)


@app.handler("eo", mode="exactly_once", concurrency=CONCURRENCY, retry=RETRY)
def eo(message) -> None:
    value = message.payload["v"]
    history.deliver(value, lease=message.lease, attempts=message.attempts, mode="eo")
    maybe_kill("received", message)
    time.sleep(SLEEP_S)
    effects().record(message.transaction.connection, value, lease=message.lease,
                     until=epoch(message.lease_expires_at))
    maybe_kill("after_write", message)
    if value in POISON:
        raise RuntimeError(f"poison {value} failed on attempt {message.attempts}")

