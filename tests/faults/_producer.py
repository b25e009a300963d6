"""A producer process for D1/D2 and L1: sends every key of a shared list, in its own random
order, singly or in small send_many batches, and logs each call's per-message result (or the
exception it raised) to a JSON-lines history. Waits at a barrier file so all producers start
together. Ends with one record of the internal retries this process made.

argv: url topic history barrier proc n_keys on_duplicate max_batch"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from history import History

import tableq
from tableq.backends.base import transient_retries


def main(url: str, topic: str, path: str, barrier: str, proc: str, n_keys: str,
         on_duplicate: str, max_batch: str) -> None:
    history = History(path, proc=proc)
    p, batch_max = int(proc), int(max_batch)
    keys = [f"k{i}" for i in range(int(n_keys))]
    random.Random(p).shuffle(keys)
    q = tableq.connect(url)
    q.now()  # connected before the start
    history.write(op="ready")
    while not Path(barrier).exists():
        time.sleep(0.005)
    rng = random.Random(1000 + p)
    i = 0
    while i < len(keys):
        chunk = keys[i : i + rng.randint(1, batch_max)]
        i += len(chunk)
        items = [{"payload": {"k": k, "proc": p}, "key": k, "priority": p} for k in chunk]
        try:
            if len(chunk) == 1:
                results = [q.send(topic, items[0]["payload"], key=chunk[0], priority=p,
                                  on_duplicate=on_duplicate)]
            else:
                results = q.send_many(topic, items, on_duplicate=on_duplicate)
        except Exception as exc:  # every exception is evidence: logged, then carry on
            for k in chunk:
                history.write(op="send", value=k, phase="fail", error=type(exc).__name__,
                              text=str(exc)[:300])
            continue
        for k, r in zip(chunk, results, strict=True):
            history.write(op="send", value=k, phase="ok", status=r.status, id=r.id)
    history.write(op="retries", n=transient_retries())
    q.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
