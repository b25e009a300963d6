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
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import functions as F

from tableq.errors import ArchiveBusy, InvalidArgument, LeaseLost, TableqError
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


def _manifest_dir(out: str) -> str:
    return out.rstrip("/") + "/_tableq_archive"


MANIFEST = re.compile(r"manifest-(\d{8})\.json")


def _fs(spark: Any, path: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem for `path` (local disk, HDFS, S3...) and the path, as Spark's
    own writes reach it."""
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()), jpath


def _manifests(spark: Any, out: str) -> list[tuple[int, Any]]:
    fs, folder = _fs(spark, _manifest_dir(out))
    if not fs.exists(folder):
        return []
    found = [(MANIFEST.fullmatch(st.getPath().getName()), st.getPath())
             for st in fs.listStatus(folder)]
    return sorted((int(m.group(1)), path) for m, path in found if m)


def _read_manifest(spark: Any, out: str) -> dict[str, Any] | None:
    """The run's latest manifest, or None when no run is pending. Each manifest is a new file
    (manifest-<n>.json, written then renamed into place): none is ever deleted or rewritten
    while its run is open, so a crash at any moment leaves the last whole one to resume from.
    (It was one file overwritten in place; a crash in the overwrite left none, and the rerun
    started a new run that archived the same rows again.)"""
    fs, _ = _fs(spark, _manifest_dir(out))
    for _, path in reversed(_manifests(spark, out)):
        stream = fs.open(path)
        try:
            text = bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()
        try:
            value = json.loads(text.decode("utf-8"))
        except ValueError:
            continue  # cut short by a crash: the one before it holds
        return value if value.get("state") != "finished" else None
    return _read_old_manifest(spark, out)


def _read_old_manifest(spark: Any, out: str) -> dict[str, Any] | None:
    """A run left pending by a tableq that kept one manifest at _tableq_archive/pending."""
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
    """The next numbered manifest, whole or not at all (written aside, then renamed). Once a
    run has finished, the manifests before its last are removed."""
    fs, folder = _fs(spark, _manifest_dir(out))
    existing = _manifests(spark, out)
    seq = existing[-1][0] + 1 if existing else 1
    jvm = spark._jvm
    final = jvm.org.apache.hadoop.fs.Path(folder, f"manifest-{seq:08d}.json")
    aside = jvm.org.apache.hadoop.fs.Path(folder, f".manifest-{seq:08d}.json.tmp")
    stream = fs.create(aside, True)
    try:
        stream.write(bytearray(json.dumps(manifest, sort_keys=True).encode("utf-8")))
    finally:
        stream.close()
    if not fs.rename(aside, final):
        raise RuntimeError(f"could not rename the archive manifest into {final.toString()}")
    if manifest.get("state") == "finished":
        for _, path in existing:
            fs.delete(path, False)
        old = jvm.org.apache.hadoop.fs.Path(_manifest_path(out))
        if fs.exists(old):
            fs.delete(old, True)


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
    age = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    if isinstance(age, bool) or not isinstance(age, (int, float)) or not 0 <= age < 1e10:
        # A cut-off in the future would purge rows that died after the Parquet was written.
        raise InvalidArgument(f"older_than must be 0 seconds or more, not {older_than!r}")
    if isinstance(purge_batch, bool) or not isinstance(purge_batch, int) or purge_batch < 1:
        raise InvalidArgument(f"purge_batch must be a whole number of 1 or more, not "
                              f"{purge_batch!r}")
    q = bulk_for(url)
    with RunLock(q.queue) as lock:
        return _run(spark, url, out, q, lock, age, sources, purge_batch)


def _run(spark: Any, url: str, out: str, q: Any, lock: RunLock, age: float,
         sources: tuple[str, ...], purge_batch: int) -> ArchiveResult:
    manifest = _read_manifest(spark, out)
    resumed = manifest is not None
    if manifest is None:
        manifest = _new_run(q, q.queue.now() - timedelta(seconds=float(age)), sources)
        _write_manifest(spark, out, manifest)
    run, cutoff = manifest["run"], datetime.fromisoformat(manifest["cutoff"])
    result = ArchiveResult(run, cutoff, resumed=resumed, path=out)
    log.info("tableq.archive_run run=%s cutoff=%s resumed=%s", run, cutoff, resumed)
    for src, step in manifest["sources"].items():
        if step["state"] == "new":
            step["rows"] = _write_parquet(spark, url, out, src, step, run, cutoff)
            step["state"] = "written"
            lock.check()
            _write_manifest(spark, out, manifest)
            point("archive.written", run=run, source=src)  # tests crash the run here
        if step["state"] == "written":
            step["purged"] = step.get("purged", 0) + _purge(q, src, step, cutoff, purge_batch,
                                                            lock)
            step["state"] = "purged"
            lock.check()
            _write_manifest(spark, out, manifest)
        result.written[src] = int(step.get("rows", 0))
        result.purged[src] = int(step.get("purged", 0))
    manifest["state"] = "finished"
    _write_manifest(spark, out, manifest)
    log.info("tableq.archive_done run=%s written=%s purged=%s", run, result.written,
             result.purged)
    return result


LOCK_TOPIC = "tableq.archive-lock"
LOCK_LEASE_S = 120.0


class RunLock:
    """One archive run at a time on a queue database: the run holds the lease of the one
    message of topic tableq.archive-lock (sent by the run, deleted when it ends), extended
    every 30 s while the run goes on. Two runs at once selected the same rows and
    overwrote each other's Parquet partitions with whatever the other had not purged yet, so
    rows were lost, or archived twice. A run whose driver died lets go when the lease ends
    (2 minutes); a run whose lease was lost stops before its next purge or manifest."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.msg: Any = None
        self.lost: Exception | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> RunLock:
        self.queue.send(LOCK_TOPIC, {"lock": "archive"}, key="archive")
        held = self.queue.receive(LOCK_TOPIC, visibility_timeout=LOCK_LEASE_S,
                                  max_attempts=2**31 - 1)  # a crashed run is not a failure
        if not held:
            raise ArchiveBusy(LOCK_TOPIC, LOCK_LEASE_S)
        self.msg = held[0]
        self._beat = threading.Thread(target=self._beats, name="tableq-archive-lock",
                                      daemon=True)
        self._beat.start()
        return self

    def _beats(self) -> None:
        while not self._stop.wait(LOCK_LEASE_S / 4):
            try:
                self.msg = self.queue.heartbeat(self.msg, extend=LOCK_LEASE_S)
            except LeaseLost as exc:
                self.lost = exc
                return
            except TableqError as exc:  # an outage: the next beat tries again in time
                log.warning("tableq.archive_lock_beat_failed error=%s", exc)

    def check(self) -> None:
        """Raises if the lease was lost (another run may hold the lock now)."""
        if self.lost is not None:
            raise ArchiveBusy(LOCK_TOPIC, LOCK_LEASE_S, lost=True)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self.lost is None:
            try:
                # Still ours (a heartbeat says so), then gone: the topic lists nothing between
                # runs. A run that found it leased meanwhile stopped, so none holds it.
                self.queue.heartbeat(self.msg, extend=LOCK_LEASE_S)
                self.queue.purge(LOCK_TOPIC)
            except TableqError as error:  # then the lease ends by itself
                log.warning("tableq.archive_lock_not_released error=%s", error)


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
        # The partition columns as written (text), not as Spark would guess them.
        written = (spark.read.schema(df.schema).parquet(target).where(F.col("run") == run)
                   .count())
    except Exception as exc:
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return 0
        raise
    log.info("tableq.archive_written source=%s run=%s rows=%d", src, run, written)
    return int(written)


def _purge(q: Any, src: str, step: dict[str, Any], cutoff: datetime, batch: int,
           lock: RunLock) -> int:
    """Deletes exactly the rows the run selected (id range and older than the cut-off), a
    bounded id window at a time, so no transaction holds many rows."""
    purged, lo, hi = 0, int(step["lo"]), int(step["hi"])
    while lo <= hi:
        top = min(hi, lo + batch - 1)
        ids = [r["id"] for r in q.history(src, None, lo, top, before=cutoff)]
        if ids:
            lock.check()
            purged += q.delete_history(src, ids, before=cutoff)
        lo = top + 1
    log.info("tableq.archive_purged source=%s rows=%d", src, purged)
    return purged
