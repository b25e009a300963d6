"""The archive pipeline: done messages (kept with retention=True) and dead letters older than a
cut-off go to Parquet, partitioned by topic and date, and only then are those exact rows purged
from the database, in bounded batches. A run is described by a manifest written before any
data, so a rerun after a crash resumes the same run (same rows, same files) instead of starting
a new one: the Parquet write overwrites only that run's partitions, the purge deletes only rows
the run selected. No SQL here: rows are read with the tableq source, deleted with
Bulk.delete_history."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import functions as F

from tableq.spark._queues import bulk_for
from tableq.spark._seam import point

log = logging.getLogger("tableq.spark")

SOURCES = {"done": ("archive", "done_at"), "dead": ("dead", "dead_at")}
PURGE_BATCH_DEFAULT = 5000


@dataclass
class ArchiveResult:
    run: str
    cutoff: datetime
    written: dict[str, int] = field(default_factory=dict)
    purged: dict[str, int] = field(default_factory=dict)
    resumed: bool = False
    path: str = ""


def _manifest_path(out: str) -> str:
    return out.rstrip("/") + "/_tableq_archive/pending"


def _read_manifest(spark: Any, out: str) -> dict[str, Any] | None:
    try:
        row = spark.read.text(_manifest_path(out)).first()
    except Exception as exc:  # a missing path is the normal "no pending run" case
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return None
        raise
    if row is None:
        return None
    value = json.loads(row[0])
    return value if value.get("state") != "finished" else None


def _write_manifest(spark: Any, out: str, manifest: dict[str, Any]) -> None:
    # Through Spark, so it works wherever the Parquet goes (local disk, HDFS, S3...).
    (spark.createDataFrame([(json.dumps(manifest, sort_keys=True),)], "value string")
     .coalesce(1).write.mode("overwrite").text(_manifest_path(out)))


def _new_run(q: Any, cutoff: datetime, sources: tuple[str, ...]) -> dict[str, Any]:
    run = cutoff.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    steps = {}
    for src in sources:
        bounds = q.history_bounds(src)
        steps[src] = ({"state": "empty"} if bounds is None else
                      {"state": "new", "lo": bounds[0], "hi": bounds[1]})
    return {"run": run, "cutoff": cutoff.isoformat(), "state": "open", "sources": steps}


def archive(spark: Any, url: str, out: str, *, older_than: float | timedelta = 86400.0,
            sources: tuple[str, ...] = ("done", "dead"),
            purge_batch: int = PURGE_BATCH_DEFAULT) -> ArchiveResult:
    """Moves done and dead messages older than `older_than` seconds (by done_at / dead_at)
    to Parquet under `out`/done and `out`/dead (partitioned by topic, date and run), then purges
    them. Safe to rerun after a crash at any point: an unfinished run is resumed first."""
    q = bulk_for(url)
    manifest = _read_manifest(spark, out)
    resumed = manifest is not None
    if manifest is None:
        age = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        manifest = _new_run(q, q.queue.now() - timedelta(seconds=float(age)), sources)
        _write_manifest(spark, out, manifest)
    run, cutoff = manifest["run"], datetime.fromisoformat(manifest["cutoff"])
    result = ArchiveResult(run, cutoff, resumed=resumed, path=out)
    log.info("tableq.archive_run run=%s cutoff=%s resumed=%s", run, cutoff, resumed)
    for src, step in manifest["sources"].items():
        if step["state"] == "new":
            step["rows"] = _write_parquet(spark, url, out, src, step, run, cutoff)
            step["state"] = "written"
            _write_manifest(spark, out, manifest)
            point("archive.written", run=run, source=src)  # tests crash the run here
        if step["state"] == "written":
            step["purged"] = step.get("purged", 0) + _purge(q, src, step, cutoff, purge_batch)
            step["state"] = "purged"
            _write_manifest(spark, out, manifest)
        result.written[src] = int(step.get("rows", 0))
        result.purged[src] = int(step.get("purged", 0))
    manifest["state"] = "finished"
    _write_manifest(spark, out, manifest)
    log.info("tableq.archive_done run=%s written=%s purged=%s", run, result.written,
             result.purged)
    return result


def _write_parquet(spark: Any, url: str, out: str, src: str, step: dict[str, Any], run: str,
                   cutoff: datetime) -> int:
    name, time_col = SOURCES[src]
    df = (spark.read.format("tableq").option("url", url).option("source", name)
          .option("lowerId", str(step["lo"])).option("upperId", str(step["hi"]))
          .option("before", cutoff.isoformat()).load()
          .withColumn("date", F.date_format(F.col(time_col), "yyyy-MM-dd"))
          .withColumn("run", F.lit(run)))
    target = f"{out.rstrip('/')}/{src}"
    # Dynamic overwrite replaces only the partitions this data has, all of which carry this
    # run's id: a rerun of the same run rewrites its own files and touches nothing else.
    (df.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy("topic", "date", "run").parquet(target))
    try:
        written = spark.read.parquet(target).where(F.col("run") == run).count()
    except Exception as exc:
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return 0
        raise
    log.info("tableq.archive_written source=%s run=%s rows=%d", src, run, written)
    return int(written)


def _purge(q: Any, src: str, step: dict[str, Any], cutoff: datetime, batch: int) -> int:
    """Deletes exactly the rows the run selected (id range and older than the cut-off), a
    bounded id window at a time, so no transaction holds many rows."""
    purged, lo, hi = 0, int(step["lo"]), int(step["hi"])
    while lo <= hi:
        top = min(hi, lo + batch - 1)
        ids = [r["id"] for r in q.history(src, None, lo, top, before=cutoff)]
        if ids:
            purged += q.delete_history(src, ids)
        lo = top + 1
    log.info("tableq.archive_purged source=%s rows=%d", src, purged)
    return purged
