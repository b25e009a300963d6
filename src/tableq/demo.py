"""The README's main job, end to end on the embedded SQLite default (or --url): a Spark job
bulk-loads jobs into the queue exactly once, a worker pool processes them (transient failures
retried with backoff, poison jobs dead-lettered), the archive pipeline moves finished and dead
messages to Parquet, and the report prints a table and writes an HTML page with charts.

    make demo        # or: python -m tableq.demo [--url URL] [--jobs N] [--master local[*]]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import tableq
from tableq.cli.output import clean
from tableq.url import redact

console = Console()
TOPIC = "jobs"
# What main() writes under --out; it empties --out first, so anything else there is not ours
# to delete.
OUTPUTS = frozenset({"tableq.db", "tableq.db-wal", "tableq.db-shm", "archive", "report.html"})


def out_dir_problem(out: str) -> str | None:
    """Why `out` must not be the demo's --out, or None: main() removes --out before it starts,
    so a file, or a directory holding files the demo did not write (such as '.' or a home
    directory), is refused by `tableq demo`."""
    path = Path(out)
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{out!r} is a file, not a directory"
    foreign = sorted(p.name for p in path.iterdir() if p.name not in OUTPUTS)
    if foreign:
        return (f"{out!r} holds files the demo did not write ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}) and the demo empties it first; pick a "
                "new or empty directory")
    return None


def stats_table(q: tableq.Queue, title: str) -> Table:
    table = Table(title=title)
    for col in ("topic", "ready", "scheduled", "in flight", "dead", "done", "oldest ready"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for s in q.stats():
        age = "-" if s.oldest_ready_age is None else f"{s.oldest_ready_age:.2f}s"
        table.add_row(Text(clean(s.topic)), f"{s.ready:,}", f"{s.scheduled:,}", f"{s.in_flight:,}",
                      f"{s.dead:,}", f"{s.done:,}", age)
    return table


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def start_spark(master: str | None) -> Any:
    """A Spark session, or None (with the reason printed) when pyspark or Java is missing."""
    try:
        from tableq.spark.session import get_session

        t0 = time.perf_counter()
        spark = get_session(master, app_name="tableq-demo")
    except Exception as exc:  # pyspark missing, or no Java: the story goes on without Spark
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        console.print(f"[yellow]Spark is not available ({escape(clean(reason))}); install "
                      "Java 17 and 'tableq[spark]' for the full story. Continuing without "
                      "Spark.")
        return None
    console.print(f"Spark session {spark.sparkContext.master} ready in "
                  f"{time.perf_counter() - t0:.1f}s")
    return spark


def load_with_spark(spark: Any, url: str, jobs: int) -> None:
    from tableq.spark.pipelines import load

    console.rule("[bold]1. Spark bulk-loads the jobs (staged, published in one commit)")
    with _progress() as bar:
        task = bar.add_task("load tasks", total=None)
        result = load.load_jobs(spark, url, TOPIC, jobs,
                                on_progress=lambda d, t: bar.update(task, completed=d, total=t))
        bar.update(task, completed=1, total=1)
    console.print(f"loaded {result.rows:,} jobs in {result.seconds:.1f}s "
                  f"({result.rows / result.seconds:,.0f} rows/s), job id {result.job}")


def load_without_spark(q: tableq.Queue, jobs: int) -> None:
    console.rule("[bold]1. bulk send (Spark unavailable: send_many instead)")
    t0 = time.perf_counter()
    for start in range(0, jobs, 1000):
        q.send_many(TOPIC, [{"payload": {"n": i, "fail_times": int(i % 10 == 9),
                                         "poison": i % 2000 == 1999}, "key": f"job-{i}"}
                            for i in range(start, min(jobs, start + 1000))])
    console.print(f"sent {jobs:,} jobs in {time.perf_counter() - t0:.1f}s")


def process(url: str, concurrency: int) -> None:
    console.rule("[bold]2. a worker pool processes them (at least once, leases, retries)")
    app = tableq.App(url, retention=True, poll_interval_max=0.2)
    failures = {"transient": 0, "poison": 0}

    @app.handler(TOPIC, max_attempts=3, visibility_timeout=30,
                 retry=tableq.Backoff(base=0.05, factor=2, max=0.5, jitter=True))
    def handle(msg: tableq.Message) -> None:
        job = msg.payload
        if job.get("poison"):
            failures["poison"] += 1
            raise ValueError(f"job {job['n']} can never succeed")
        if msg.attempts <= int(job.get("fail_times", 0)):
            failures["transient"] += 1
            raise ConnectionError(f"job {job['n']}: upstream timed out (attempt {msg.attempts})")

    q = app.queue
    total = q.stats(TOPIC)[0].live

    def run_until_settled() -> None:
        # A burst worker stops when nothing is due; retries scheduled a moment later still
        # count as work here, so run bursts until the topic has no live message left.
        while q.stats(TOPIC)[0].live:
            app.worker([TOPIC], concurrency=concurrency, burst=True).run()
            time.sleep(0.05)

    runner = threading.Thread(target=run_until_settled, name="demo-worker")
    t0 = time.perf_counter()
    runner.start()
    with _progress() as bar:
        task = bar.add_task(f"{concurrency} handler threads", total=total)
        while runner.is_alive():
            s = q.stats(TOPIC)[0]
            bar.update(task, completed=s.done + s.dead)
            runner.join(0.25)
        s = q.stats(TOPIC)[0]
        bar.update(task, completed=s.done + s.dead)
    took = time.perf_counter() - t0
    console.print(f"processed {s.done:,} jobs in {took:.1f}s ({s.done / took:,.0f} jobs/s); "
                  f"{failures['transient']:,} transient failures retried with backoff, "
                  f"{failures['poison']} failed deliveries of poison jobs")
    dead = q.dead_letters(TOPIC, limit=3)
    for d in dead:
        last_line = (d.error or "").strip().splitlines()[-1:] or [""]
        console.print(f"  dead letter #{d.id} after {d.attempts} attempts: "
                      f"{escape(clean(last_line[0]))}")
    console.print(stats_table(q, "the queue after the worker pool"))
    app.close()


def archive_and_report(spark: Any, url: str, out: str) -> None:
    from tableq.spark.pipelines.archive import archive
    from tableq.spark.pipelines.report import report

    console.rule("[bold]3. archive: done and dead messages to Parquet, then purged")
    t0 = time.perf_counter()
    result = archive(spark, url, os.path.join(out, "archive"), older_than=0)
    console.print(f"wrote {result.written} rows under {result.path}, purged {result.purged} "
                  f"in {time.perf_counter() - t0:.1f}s")
    console.rule("[bold]4. report: throughput, latency percentiles, failures")
    html = os.path.join(out, "report.html")
    # The demo runs for seconds, so throughput is bucketed per second rather than per minute.
    rep = report(spark, url, html_path=html, archive_path=os.path.join(out, "archive"),
                 bucket="1 second")
    console.print(rep.table())
    console.print(f"HTML report with charts: {os.path.abspath(rep.html_path or html)}")


def not_for_demo(q: tableq.Queue) -> str | None:
    """Why the database behind `q` must not run the demo, or None. The demo purges topic
    `jobs` and moves every done and dead message to Parquet: a database that holds any of
    those is someone's data, not the demo's."""
    held = [f"{s.topic!r} ({s.live:,} live, {s.dead:,} dead, {s.done:,} done)"
            for s in q.stats(exact=True)
            if (s.topic == TOPIC and s.live) or s.dead or s.done]
    if not held:
        return None
    return (f"refusing to run on {redact(q.where)}: the demo purges topic {TOPIC!r} and moves "
            f"every done and dead message to Parquet, and this database holds "
            f"{', '.join(held[:5])}{' ...' if len(held) > 5 else ''}. Point --url at an empty "
            "database or schema (on PostgreSQL e.g. ?schema=tableq_demo), or, if these are an "
            "earlier demo's, empty them (tableq purge jobs, tableq dead purge TOPIC)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="queue database (default: a fresh SQLite "
                        "file under --out)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark steps")
    args = parser.parse_args(argv)
    # The worker logs every state change; the demo shows progress bars and tables instead.
    logging.getLogger("tableq").setLevel(logging.CRITICAL)
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    url = args.url or f"sqlite:///{os.path.abspath(args.out)}/tableq.db"
    # Data in markup is escaped, and the URL shown without its password.
    console.print(f"[bold]tableq demo[/bold]: {args.jobs:,} jobs on {escape(redact(url))}")
    with tableq.connect(url, migrate=True, retention=True) as q:
        why = None if args.url is None else not_for_demo(q)
        if why is not None:
            parser.exit(2, f"tableq demo: {why}\n")
        q.purge(TOPIC)
        q.purge_dead(TOPIC)
        spark = None if args.no_spark else start_spark(args.master)
        if spark is not None:
            load_with_spark(spark, url, args.jobs)
        else:
            load_without_spark(q, args.jobs)
        console.print(stats_table(q, "the queue after loading"))
    process(url, args.concurrency)
    if spark is not None:
        archive_and_report(spark, url, args.out)
        spark.stop()
    console.rule("[bold green]done")


if __name__ == "__main__":
    main()
