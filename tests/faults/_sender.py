"""A producer process for L1, M1 and C1: sends distinct values for a while or up to a count,
singly and in send_many batches, with a mix of priorities, delays and dedup keys (some keys
shared between producers, so sends collide on the dedup index), logging each value's outcome:
`ok` for a message stored as its own, `fail` for a send that certainly stored nothing of its
own (a duplicate key), `info` for an exception (which also counts as an error that reached
user code). Waits at a barrier file; ends with a record of its internal retries.

argv: url topic history barrier proc count seconds max_delay_s shared_keys delayed_share
(the share of messages sent with a random delay up to max_delay_s)"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from history import History

import tableq
from tableq.backends.base import transient_retries


def main(url: str, topic: str, path: str, barrier: str, proc: str, count: str, seconds: str,
         max_delay_s: str, shared_keys: str, delayed_share: str) -> None:
    history = History(path, proc=f"s{proc}")
    rng = random.Random(int(proc))
    n, until_s, shared = int(count), float(seconds), int(shared_keys)
    max_delay, delayed = float(max_delay_s), float(delayed_share)
    q = tableq.connect(url)
    q.now()
    history.write(op="ready")
    while not Path(barrier).exists():
        time.sleep(0.005)
    deadline = time.monotonic() + until_s
    i = 0
    while i < n and time.monotonic() < deadline:
        batch = []
        for _ in range(rng.choice([1, 1, 1, 5, 10])):
            value = f"{proc}-{i}"
            i += 1
            key = None
            if shared and rng.random() < 0.2:
                key = f"shared{rng.randrange(shared)}"
            elif rng.random() < 0.2:
                key = value
            delay = rng.uniform(0, max_delay) if rng.random() < delayed else 0.0
            batch.append({"payload": {"v": value}, "key": key, "priority": rng.randint(-1, 2),
                          "delay": delay})
        try:
            if len(batch) == 1:
                b = batch[0]
                results = [q.send(topic, b["payload"], key=b["key"], priority=b["priority"],
                                  delay=b["delay"])]
            else:
                results = q.send_many(topic, batch)
        except Exception as exc:  # reaching user code is what these tests count
            for b in batch:
                history.send(b["payload"]["v"], "info")
            history.write(op="error", error=type(exc).__name__, text=str(exc)[:300])
            continue
        for b, r in zip(batch, results, strict=True):
            history.send(b["payload"]["v"], "ok" if r.status == "sent" else "fail",
                         id=r.id, delay=b["delay"])
    history.write(op="retries", n=transient_retries())
    q.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
