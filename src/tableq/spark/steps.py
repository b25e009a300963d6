"""One call per step of the README's main job (the `tableq demo` story), each making or reusing
a local Spark session: load N generated jobs, archive what the workers finished, report.
The worker pool in between is the caller's; it must connect with retention=True so that
acknowledged jobs are kept for archive and report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tableq.spark.archive import ArchiveResult, archive
from tableq.spark.load import LoadResult, load_jobs
from tableq.spark.report import Report, report
from tableq.spark.session import get_session


def spark_load_jobs(url: str, n: int = 100_000, *, topic: str = "jobs",
                    master: str | None = None, spark: Any = None, fail_every: int = 10,
                    poison_every: int = 2000,
                    on_progress: Callable[[int, int], None] | None = None) -> LoadResult:
    """Bulk-enqueues n jobs {"n", "fail_times", "poison"} with keys job-<n> in one Spark job
    (exactly once). A handler should fail a job while its attempt <= fail_times, and always
    when poison is true (those end as dead letters)."""
    spark = spark or get_session(master, app_name="tableq-demo")
    return load_jobs(spark, url, topic, n, fail_every=fail_every, poison_every=poison_every,
                     on_progress=on_progress)


def spark_archive(url: str, out: str, *, older_than: float = 0.0, master: str | None = None,
                  spark: Any = None) -> ArchiveResult:
    """Moves done and dead messages older than `older_than` seconds to Parquet under `out`
    (out/done, out/dead) and purges them from the database."""
    spark = spark or get_session(master, app_name="tableq-demo")
    return archive(spark, url, out, older_than=older_than)


def spark_report(url: str, html_path: str, *, archive_path: str | None = None,
                 master: str | None = None, spark: Any = None, bucket: str = "10 seconds"
                 ) -> Report:
    """The per-topic report (Report.table() for the terminal, the HTML page at html_path);
    pass archive_path to include what spark_archive moved out of the database."""
    spark = spark or get_session(master, app_name="tableq-demo")
    return report(spark, url, html_path=html_path, archive_path=archive_path, bucket=bucket)
