"""The report pipeline: per topic, throughput over time, latency percentiles (available ->
received, received -> acked), the attempts distribution and failure / dead-letter rates, from
the done archive (retention=True) and the dead-letter store, optionally with archived Parquet.
Prints a table and writes an HTML page with plotly charts. No SQL on the queue here.

Definitions (per topic, over finished messages = done + dead):
- wait_s = received_at - first_available_at of a done message (its last delivery);
- work_s = done_at - received_at of a done message;
- failure_rate = (done with attempts > 1 + dead) / finished;
- dead_rate = dead / finished;
- throughput: done messages per time bucket of done_at; rate_per_s = done / (last done_at -
  first done_at)."""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

log = logging.getLogger("tableq.spark")
PERCENTILES = (0.5, 0.9, 0.99)


@dataclass
class Report:
    summary: Any  # pandas DataFrame, one row per topic
    attempts: Any  # pandas DataFrame: topic, attempts, messages
    throughput: Any  # pandas DataFrame: topic, bucket, done
    html_path: str | None = None

    def table(self) -> str:
        cols = ["topic", "done", "dead", "failure_rate", "dead_rate", "rate_per_s",
                "wait_p50_s", "wait_p90_s", "wait_p99_s", "work_p50_s", "work_p90_s",
                "work_p99_s"]
        return self.summary[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}")


def _seconds(a: str, b: str) -> Any:
    # Microsecond-exact differences of two timestamps, in seconds.
    return (F.unix_micros(F.col(b)) - F.unix_micros(F.col(a))) / 1e6


def compute(done: DataFrame, dead: DataFrame, *, bucket: str = "1 minute") -> Report:
    """The report from a done DataFrame (topic, attempts, first_available_at, received_at,
    done_at) and a dead one (topic, attempts)."""
    d = (done.select("topic", "attempts",
                     _seconds("first_available_at", "received_at").alias("wait_s"),
                     _seconds("received_at", "done_at").alias("work_s"), "done_at"))
    pct = []
    for name in ("wait_s", "work_s"):
        for p in PERCENTILES:
            label = f"{name[:-2]}_p{int(round(p * 100))}_s"
            pct.append(F.percentile(F.col(name), F.lit(p)).alias(label))
    per_done = d.groupBy("topic").agg(
        F.count(F.lit(1)).alias("done"),
        F.sum((F.col("attempts") > 1).cast("long")).alias("retried"),
        F.min("done_at").alias("first_done_at"), F.max("done_at").alias("last_done_at"),
        *pct)
    per_dead = dead.groupBy("topic").agg(F.count(F.lit(1)).alias("dead"))
    s = per_done.join(per_dead, "topic", "full_outer").fillna(0, ["done", "dead", "retried"])
    finished = F.col("done") + F.col("dead")
    span = _seconds("first_done_at", "last_done_at")
    s = (s.withColumn("failure_rate", (F.col("retried") + F.col("dead")) / finished)
         .withColumn("dead_rate", F.col("dead") / finished)
         .withColumn("rate_per_s", F.when(span > 0, F.col("done") / span))
         .orderBy("topic"))
    attempts = (done.select("topic", "attempts").unionByName(dead.select("topic", "attempts"))
                .groupBy("topic", "attempts").agg(F.count(F.lit(1)).alias("messages"))
                .orderBy("topic", "attempts"))
    throughput = (done.groupBy("topic", F.window("done_at", bucket).start.alias("bucket"))
                  .agg(F.count(F.lit(1)).alias("done")).orderBy("topic", "bucket"))
    return Report(s.toPandas(), attempts.toPandas(), throughput.toPandas())


def report(spark: Any, url: str, *, html_path: str | None = None,
           archive_path: str | None = None, bucket: str = "1 minute",
           topic: str | None = None) -> Report:
    """The report for the queue at `url` (and its Parquet archive, if given); writes the
    HTML page when html_path is set."""
    def read(source: str) -> DataFrame:
        r = spark.read.format("tableq").option("url", url).option("source", source)
        if topic is not None:
            r = r.option("topic", topic)
        return r.load()

    done, dead = read("archive"), read("dead")
    if archive_path is not None:
        done, dead = _with_archive(spark, done, dead, archive_path, topic)
    rep = compute(done, dead, bucket=bucket)
    if html_path is not None:
        rep.html_path = write_html(rep, html_path)
    return rep


def _with_archive(spark: Any, done: DataFrame, dead: DataFrame, path: str,
                  topic: str | None) -> tuple[DataFrame, DataFrame]:
    def add(df: DataFrame, sub: str) -> DataFrame:
        try:
            arch = spark.read.parquet(f"{path.rstrip('/')}/{sub}")
        except Exception as exc:
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return df
            raise
        if topic is not None:
            arch = arch.where(F.col("topic") == topic)
        return df.unionByName(arch.select(*df.columns))
    return add(done, "done"), add(dead, "dead")


def write_html(rep: Report, path: str) -> str:
    import plotly.express as px

    figs = []
    if len(rep.throughput):
        # Markers too: a short run may fill a single bucket, which a bare line cannot show.
        figs.append(px.line(rep.throughput, x="bucket", y="done", color="topic", markers=True,
                            title="Throughput: messages done per bucket"))
    if len(rep.attempts):
        figs.append(px.bar(rep.attempts, x="attempts", y="messages", color="topic",
                           barmode="group", title="Attempts per finished message"))
    if len(rep.summary):
        lat = rep.summary.melt(id_vars=["topic"], value_name="seconds", var_name="percentile",
                               value_vars=[c for c in rep.summary.columns
                                           if c.startswith(("wait_p", "work_p"))])
        figs.append(px.bar(lat, x="percentile", y="seconds", color="topic", barmode="group",
                           title="Latency percentiles (wait = available to received, "
                                 "work = received to acked)"))
        figs.append(px.bar(rep.summary, x="topic", y=["failure_rate", "dead_rate"],
                           barmode="group", title="Failure and dead-letter rates"))
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0))
             for i, fig in enumerate(figs)]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>tableq report</title>"
            "</head><body><h1>tableq report</h1>"
            f"<pre>{html.escape(rep.table())}</pre>" + "".join(parts) + "</body></html>")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(page, encoding="utf-8")
    log.info("tableq.report_written path=%s", path)
    return str(path)
