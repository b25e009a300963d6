"""The load pipeline: bulk-enqueue a file (CSV, JSON lines, Parquet) or generated jobs through
the tableq batch writer (exactly once as a whole), reporting task progress while it runs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tableq.spark.options import WRITE_COLUMNS, SinkOnDuplicate

log = logging.getLogger("tableq.spark")
FORMATS = {"csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json",
           "parquet": "parquet"}


@dataclass(frozen=True)
class LoadResult:
    topic: str
    rows: int
    seconds: float
    job: str


@contextmanager
def progress(spark: Any, report: Callable[[int, int], None] | None,
             every_s: float = 1.0) -> Iterator[None]:
    """Calls report(done_tasks, total_tasks) for the running Spark stages while the block
    runs (a polling thread over the status tracker)."""
    if report is None:
        yield
        return
    stop = threading.Event()
    tracker = spark.sparkContext.statusTracker()

    def poll() -> None:
        while not stop.wait(every_s):
            done = total = 0
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                report(done, total)

    t = threading.Thread(target=poll, name="tableq-load-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def to_queue_columns(df: DataFrame, *, key: str | None = None,
                     payload_columns: list[str] | None = None) -> DataFrame:
    """A file's rows as sink columns: a `payload` column is used as it is, together with the
    sink's other known columns; otherwise the chosen (default: all) columns become a struct
    payload, and `key` names the column holding the message key."""
    if "payload" in df.columns:
        return df.select(*[c for c in df.columns if c in WRITE_COLUMNS])
    cols = payload_columns or [c for c in df.columns if c != key]
    out = [F.struct(*cols).alias("payload")]
    if key is not None:
        out.append(F.col(key).cast("string").alias("key"))
    return df.select(*out)


def write(df: DataFrame, url: str, topic: str, *, job: str | None = None,
          on_duplicate: SinkOnDuplicate = "ignore", payload_format: str = "string",
          on_progress: Callable[[int, int], None] | None = None,
          count: bool = True) -> LoadResult:
    import uuid

    job = job or f"load-{uuid.uuid4().hex}"
    rows = df.count() if count else -1
    started = time.monotonic()
    with progress(df.sparkSession, on_progress):
        (df.write.format("tableq").option("url", url).option("topic", topic)
         .option("jobId", job).option("onDuplicate", on_duplicate)
         .option("payloadFormat", payload_format).mode("append").save())
    took = time.monotonic() - started
    log.info("tableq.load_done topic=%s rows=%d seconds=%.1f job=%s", topic, rows, took, job)
    return LoadResult(topic, rows, took, job)


def load_file(spark: Any, url: str, topic: str, path: str, *, fmt: str | None = None,
              key: str | None = None, payload_columns: list[str] | None = None,
              on_duplicate: SinkOnDuplicate = "ignore", payload_format: str = "string",
              on_progress: Callable[[int, int], None] | None = None) -> LoadResult:
    """Bulk-enqueues the rows of a CSV (with a header), JSON-lines or Parquet file."""
    kind = FORMATS.get((fmt or path.rsplit(".", 1)[-1]).lower())
    if kind is None:
        raise ValueError(f"cannot tell the format of {path!r}: pass fmt= one of "
                         f"{sorted(FORMATS)}")
    reader = spark.read
    if kind == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    df = to_queue_columns(reader.format(kind).load(path), key=key,
                          payload_columns=payload_columns)
    return write(df, url, topic, on_duplicate=on_duplicate, payload_format=payload_format,
                 on_progress=on_progress)


def load_jobs(spark: Any, url: str, topic: str, n: int, *, partitions: int | None = None,
              fail_every: int = 10, poison_every: int = 2000,
              on_progress: Callable[[int, int], None] | None = None) -> LoadResult:
    """The demo load: n generated jobs {"n": i, "fail_times": 1 on every fail_every-th job
    (fail once, then succeed), "poison": true on every poison_every-th (always fails, ends as a
    dead letter)} with key "job-<i>"."""
    df = spark.range(0, n, 1, partitions or spark.sparkContext.defaultParallelism)
    payload = F.struct(
        F.col("id").alias("n"),
        F.when(F.col("id") % fail_every == fail_every - 1, 1).otherwise(0).alias("fail_times"),
        (F.col("id") % poison_every == poison_every - 1).alias("poison"),
    )
    out = df.select(payload.alias("payload"),
                    F.concat(F.lit("job-"), F.col("id").cast("string")).alias("key"))
    result = write(out, url, topic, on_progress=on_progress, count=False)
    return LoadResult(result.topic, n, result.seconds, result.job)
