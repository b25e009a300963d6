"""The README's main job: a short end-to-end run of tableq on the embedded SQLite default that
prints what it did. Run it with `make demo` or `python -m tableq.demo [--url URL]`."""

from __future__ import annotations

import argparse
import os
import time

from rich.console import Console
from rich.table import Table

import tableq

console = Console()


def stats_table(q: tableq.Queue, title: str) -> Table:
    table = Table(title=title)
    for col in ("topic", "ready", "scheduled", "in flight", "dead", "done", "oldest ready"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for s in q.stats():
        age = "-" if s.oldest_ready_age is None else f"{s.oldest_ready_age:.2f}s"
        table.add_row(s.topic, str(s.ready), str(s.scheduled), str(s.in_flight), str(s.dead),
                      str(s.done), age)
    return table


def core_tour(q: tableq.Queue, jobs: int) -> None:
    console.rule("[bold]1. sending")
    t0 = time.perf_counter()
    items = [{"payload": {"job": i, "poison": i % 997 == 0}, "priority": i % 3}
             for i in range(jobs)]
    results = q.send_many("jobs", items)
    console.print(f"send_many: {len(results):,} jobs in {time.perf_counter() - t0:.2f}s "
                  f"(one transaction), ids {results[0].id}..{results[-1].id}")
    dup = q.send("jobs", {"job": "nightly-report"}, key="report:2026-11-23")
    again = q.send("jobs", {"job": "nightly-report"}, key="report:2026-11-23")
    console.print(f"dedup key: first send {dup.status} id={dup.id}, second {again.status} "
                  f"id={again.id}")
    later = q.send("jobs", {"job": "reminder"}, delay=3600)
    console.print(f"delayed send: id={later.id} due in an hour (database clock)")
    console.print(stats_table(q, "after sending"))

    console.rule("[bold]2. processing (at least once: lease, handle, ack)")
    done = failed = 0
    t0 = time.perf_counter()
    while True:
        batch = q.receive("jobs", max=100, visibility_timeout=30, max_attempts=3)
        if not batch:
            break
        good = []
        for m in batch:
            if m.payload.get("poison"):
                failed += 1
                m.nack(error=f"job {m.payload['job']} always fails")
            else:
                good.append(m)
        q.ack_many(good)
        done += len(good)
    elapsed = time.perf_counter() - t0
    console.print(f"acked {done:,} jobs in {elapsed:.2f}s ({done / elapsed:,.0f} jobs/s); "
                  f"{failed} failed deliveries, retried until max_attempts=3")
    dead = q.dead_letters("jobs")
    console.print(f"dead letters: {len(dead)} (" + ", ".join(
        f"#{d.id} after {d.attempts} attempts: {d.error}" for d in dead[:3]) + ")")

    console.rule("[bold]3. exactly once: the handler's writes and the ack commit together")
    q.send("payments", {"order": 42, "amount": 1999})
    try:
        with q.transaction() as tx:
            (m,) = tx.receive("payments")
            tx.send("receipts", {"order": m.payload["order"]})
            m.ack()
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    console.print(f"after a crash inside the transaction: payments ready="
                  f"{q.stats('payments')[0].ready}, receipts="
                  f"{q.stats('receipts')[0].live} (all rolled back)")
    with q.transaction() as tx:
        (m,) = tx.receive("payments")
        tx.send("receipts", {"order": m.payload["order"]})
        m.ack()
    console.print(f"after a clean run: payments={q.stats('payments')[0].live}, "
                  f"receipts={q.stats('receipts')[0].ready}")
    console.print(stats_table(q, "at the end"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=os.environ.get("TABLEQ_DEMO_URL",
                                                        "sqlite:///demo-out/tableq-demo.db"))
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.url.startswith("sqlite:///"):
        path = args.url[len("sqlite:///"):]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    console.print(f"[bold]tableq demo[/bold] on {args.url}")
    with tableq.connect(args.url, migrate=True, retention=True) as q:
        core_tour(q, args.jobs)


if __name__ == "__main__":
    main()
