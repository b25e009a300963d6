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
from pyspark.sql.types import StringType, StructField, StructType

from tableq.errors import InvalidArgument
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
    if key is not None and key not in df.columns:
        raise InvalidArgument(f"key column {key!r} is not in the file; its columns are "
                              f"{', '.join(df.columns)}")
    if "payload" in df.columns:
        if "topic" in df.columns:
            raise InvalidArgument("the file has a `topic` column, which would send rows to "
                                  "other topics than the one given; rename or drop it")
        if key is not None and key != "key":
            if "key" in df.columns:
                raise InvalidArgument(f"the file has a `key` column besides {key!r}: name "
                                      "one key column")
            df = df.withColumn("key", F.col(key).cast("string"))
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
              on_progress: Callable[[int, int], None] | None = None,
              infer_types: bool = True) -> LoadResult:
    """Bulk-enqueues the rows of a CSV (with a header), JSON-lines or Parquet file. A JSON
    line is sent as its own JSON (or its "payload" field's, with the line's options); a CSV
    or Parquet row becomes an object of its columns (or its `payload` column, as text, or
    as JSON with payload_format='json'). `infer_types=False` keeps a CSV's values as text."""
    kind = FORMATS.get((fmt or path.rsplit(".", 1)[-1]).lower())
    if kind is None:
        raise ValueError(f"cannot tell the format of {path!r}: pass fmt= one of "
                         f"{sorted(FORMATS)}")
    if kind == "json" and payload_columns is None:
        df, payload_format = _json_lines(spark, path, key), "json"
    else:
        df = to_queue_columns(_read(spark, kind, path, key, infer_types), key=key,
                              payload_columns=payload_columns)
    return write(df, url, topic, on_duplicate=on_duplicate, payload_format=payload_format,
                 on_progress=on_progress)


def _read(spark: Any, kind: str, path: str, key: str | None, infer_types: bool) -> DataFrame:
    """The file as a DataFrame. A CSV's column types are inferred (numbers, booleans,
    times) unless infer_types is False, but its key column (`key`, or the one named), `kind`
    and `payload` are read as text always: inferred as a number, "007" and "7" would become
    one key, and one of the two messages a duplicate."""
    reader = spark.read
    if kind == "csv":
        reader = reader.option("header", "true")
        if infer_types:
            schema = reader.option("inferSchema", "true").csv(path).schema
            text = {key or "key", "kind", "payload"}  # the sink takes these as text
            schema = StructType([StructField(f.name, StringType(), f.nullable)
                                 if f.name in text else f for f in schema.fields])
            reader = spark.read.option("header", "true").schema(schema)
    df: DataFrame = reader.format(kind).load(path)
    return df


_LINE = ("payload string, key string, kind string, headers map<string,string>, priority int, "
         "delay_s double, available_at string")


def _json_lines(spark: Any, path: str, key: str | None) -> DataFrame:
    """JSON lines as their text: a line with a "payload" field sends that field's JSON (with
    the line's key, kind, headers, priority, delay_s, available_at); any other line is the
    payload itself, as written. Read through Spark's JSON reader, one schema for all lines
    would add nulls for the fields a line lacks and change 1 into 1.0 beside a 2.5."""

    def parse(line: str) -> tuple[Any, ...]:
        import json

        value = json.loads(line)
        options = value if isinstance(value, dict) and "payload" in value else {}
        payload = json.dumps(value["payload"]) if options else line
        found = (value.get(key) if isinstance(value, dict) else None) if key else \
            options.get("key")
        headers = options.get("headers")
        return (payload, None if found is None else str(found), options.get("kind"),
                {str(k): str(v) for k, v in headers.items()} if headers else None,
                options.get("priority"), options.get("delay_s"), options.get("available_at"))

    parsed = F.udf(parse, _LINE)(F.col("value"))
    lines = spark.read.text(path).where(F.trim("value") != "")
    df: DataFrame = (lines.select(parsed.alias("m")).select("m.*")
                     .withColumn("available_at", F.col("available_at").cast("timestamp")))
    # The sink takes delay_s or available_at, not both: only those the lines use.
    used = df.select(*[F.max(F.col(c).isNotNull().cast("int")).alias(c)
                       for c in ("delay_s", "available_at")]).first()
    unused = [c for c in ("delay_s", "available_at") if used is None or not used[c]]
    return df.drop(*unused)


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
