"""Run by test_silent_cut.py inside a network namespace of its own (`unshare -n`), where the
throwaway server and the clients share a loopback that can be taken down: every packet is
then dropped without a reset, as a network cut or a vanished host does. Prints one JSON line.

Two queues, one with tcp_keepalive_s=6 and one with 0 (the operating system's two hours),
each ack a message whose row another session holds locked, so both wait for a reply when the
loopback goes down. The first must fail with DatabaseUnavailable within seconds; the second
must still be waiting then (the cut is silent), and must finish once the network is back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from servers import ThrowawayMariaDB, ThrowawayPostgres

import tableq

KEEPALIVE_S = 6


def _ip_link(state: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", state], check=True)


def _lock_rows(server: Any, dialect: str, ids: list[int]) -> Any:
    """Another session's transaction holding both messages' rows."""
    conn = server.admin()
    marks = ", ".join(str(int(i)) for i in ids)
    if dialect == "postgres":
        conn.execute("BEGIN")
        conn.execute(f"SELECT id FROM tableq.message WHERE id IN ({marks}) FOR UPDATE")
    else:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"SELECT id FROM silent.tableq_message WHERE id IN ({marks}) FOR UPDATE")
    return conn


def main(dialect: str) -> dict[str, Any]:
    _ip_link("up")
    server = ThrowawayPostgres() if dialect == "postgres" else ThrowawayMariaDB()
    server.start()
    try:
        url = server.url("tableq") if dialect == "postgres" else server.url("silent")
        watched = tableq.connect(url, migrate=True, tcp_keepalive_s=KEEPALIVE_S)
        plain = tableq.connect(url, tcp_keepalive_s=0)
        watched.send_many("cut", [1, 2])
        m1, m2 = watched.receive("cut", max=2, visibility_timeout=600)
        locker = _lock_rows(server, dialect, [m1.id, m2.id])
        outcome: dict[str, Any] = {}

        def ack(name: str, q: tableq.Queue, msg: tableq.Message) -> None:
            t0 = time.monotonic()
            try:
                q.ack(msg)
                outcome[name] = ("acked", time.monotonic() - t0)
            except Exception as exc:  # reported to the test, which asserts on it
                outcome[name] = (type(exc).__name__, time.monotonic() - t0)

        threads = [threading.Thread(target=ack, args=("watched", watched, m1), daemon=True),
                   threading.Thread(target=ack, args=("plain", plain, m2), daemon=True)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both acks wait on the locked rows
        waiting_before_cut = sorted(outcome)
        _ip_link("down")
        cut_at = time.monotonic()
        threads[0].join(KEEPALIVE_S * 4)
        seen_after_s = time.monotonic() - cut_at
        plain_waiting = "plain" not in outcome
        _ip_link("up")  # the network is back: the locker's session never noticed the cut
        if dialect == "postgres":
            locker.execute("ROLLBACK")
        else:
            locker.rollback()
        locker.close()
        threads[1].join(60)
        # The watched queue works again on a fresh connection; its ack either ran on the
        # server after all (the lock went) or runs now.
        deadline = time.monotonic() + 30
        while True:
            try:
                left = watched.stats("cut", exact=True)[0]
                break
            except tableq.DatabaseUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if left.in_flight:
            try:
                watched.ack(m1)
            except tableq.LeaseLost:
                pass
            left = watched.stats("cut", exact=True)[0]
        watched.close()
        plain.close()
        return {"waiting_before_cut": waiting_before_cut, "outcome": outcome,
                "seen_after_s": seen_after_s, "plain_waiting_at_that_time": plain_waiting,
                "left": {"ready": left.ready, "in_flight": left.in_flight}}
    finally:
        server.destroy()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
