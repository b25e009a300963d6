"""A consumer process for L1, M1 and C1 (at least once): receives batches, commits one effect
row per message (history.EffectTable, in the database under test, with the database's time
and the lease's expiry) before settling, then acks, or now and then nacks with a short delay
so the message comes back. Logs every delivery's database times (received_at, lease expiry,
first due time) and every exception that reached it. Stops when the stop file exists and a
receive comes back empty.

argv: url topic history stop vt_s nack_share"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from history import EffectTable, History, epoch

import tableq
from tableq.backends.base import transient_retries


def main(url: str, topic: str, path: str, stop: str, vt_s: str, nack_share: str) -> None:
    history = History(path)
    rng = random.Random()
    vt, nack = float(vt_s), float(nack_share)
    q = tableq.connect(url)
    table = EffectTable(url)
    history.write(op="ready")
    with table.connection() as conn:
        while True:
            try:
                msgs = q.receive(topic, max=rng.randint(1, 10), visibility_timeout=vt)
            except Exception as exc:  # reaching user code is what these tests count
                history.write(op="error", error=type(exc).__name__, text=str(exc)[:300])
                continue
            if not msgs:
                if Path(stop).exists():
                    break
                time.sleep(0.01)
                continue
            for m in msgs:
                history.deliver(m.payload["v"], lease=m.lease, received=epoch(m.received_at),
                                until=epoch(m.available_at), due=epoch(m.first_available_at))
                table.record(conn, m.payload["v"], lease=m.lease, until=epoch(m.available_at),
                             since=epoch(m.received_at))
            conn.commit()  # the effects commit before the messages are settled
            keep = [m for m in msgs if rng.random() >= nack]
            try:
                if keep:
                    q.ack_many(keep)
                for m in msgs:
                    if m not in keep:
                        before = epoch(q.now())
                        q.nack(m, delay=0.05)
                        table.released(conn, m.payload["v"], m.lease, before)
                        conn.commit()
                        history.write(op="nack", value=m.payload["v"])
            except Exception as exc:
                history.write(op="error", error=type(exc).__name__, text=str(exc)[:300])
    history.write(op="retries", n=transient_retries())
    q.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
