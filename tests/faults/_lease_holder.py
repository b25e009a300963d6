"""A lease holder for F9, run as its own process: receives small batches and, for each
message, heartbeats, "works" for a moment and acks or nacks it, logging every settle
operation with its outcome to a JSON-lines history. The test pauses it with SIGSTOP while it
holds leases; after SIGCONT its late operations must all get LeaseLost.

argv: url topic history vt_s; SIGTERM ends it after the current message."""

from __future__ import annotations

import signal
import sys
import time

from history import History

import tableq

BATCH = 4
WORK_S = 0.2  # the job's own work, during which the test pauses the holder


def main(url: str, topic: str, path: str, vt_s: str) -> None:
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    history = History(path, proc="holder")
    q = tableq.connect(url)
    vt = float(vt_s)
    turn = 0
    while not stopping:
        msgs = q.receive(topic, max=BATCH, visibility_timeout=vt)
        if not msgs:
            time.sleep(0.02)
            continue
        for m in msgs:
            history.write(op="held", value=m.payload["v"], id=m.id, lease=m.lease)
        for m in msgs:
            turn += 1
            settle = "ack" if turn % 3 else "nack"
            for op in ("heartbeat", settle):
                started = time.time()
                try:
                    if op == "heartbeat":
                        q.heartbeat(m, extend=vt)
                    elif op == "ack":
                        q.ack(m)
                    else:
                        q.nack(m)
                    outcome = "ok"
                except tableq.LeaseLost:
                    outcome = "LeaseLost"
                history.write(op=op, value=m.payload["v"], id=m.id, lease=m.lease,
                              outcome=outcome, started=started)
                if op == "heartbeat":
                    # The test pauses the holder here, in the job's own work, where it holds
                    # leases but no database lock (a paused SQLite writer would hold the
                    # file's lock and stall every other process).
                    history.write(op="working", id=m.id)
                    time.sleep(WORK_S)
                    history.write(op="settling", id=m.id)
        history.write(op="batch_done", n=len(msgs))
    q.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
