"""The report pipeline: per topic, throughput over time, latency percentiles (available ->
received, received -> acked), the attempts distribution and failure / dead-letter rates, from
the done archive (retention=True) and the dead-letter store, optionally with archived Parquet.
Prints a table and writes a self-contained HTML page in tableq's one look (tableq.look: summary
figures, real tables, the top dead-letter errors, SVG charts with a scale per series). No SQL
on the queue here.

Definitions (per topic, over finished messages = done + dead):
- wait_s = received_at - first_available_at of a done message (its last delivery);
- work_s = done_at - received_at of a done message;
- failure_rate = (done with attempts > 1 + dead) / finished;
- dead_rate = dead / finished;
- throughput: done messages per time bucket of done_at; rate_per_s = done / (last done_at -
  first done_at)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

log = logging.getLogger("tableq.spark")
PERCENTILES = (0.5, 0.9, 0.99)
TOP_ERRORS = 10


@dataclass
class Report:
    summary: Any  # pandas DataFrame, one row per topic
    attempts: Any  # pandas DataFrame: topic, attempts, messages
    throughput: Any  # pandas DataFrame: topic, bucket, done
    errors: Any = None  # pandas DataFrame: topic, error, messages (most frequent first)
    html_path: str | None = None

    def table(self) -> str:
        cols = ["topic", "done", "dead", "failure_rate", "dead_rate", "rate_per_s",
                "wait_p50_s", "wait_p90_s", "wait_p99_s", "work_p50_s", "work_p90_s",
                "work_p99_s"]
        text: str = self.summary[cols].to_string(index=False,
                                                 float_format=lambda v: f"{v:.3f}")
        return text


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
    errors = None
    if "error" in dead.columns:
        # The last line of an error (a traceback ends with the exception) groups alike ones.
        last = F.trim(F.element_at(F.split(F.trim(F.coalesce(F.col("error"), F.lit(""))),
                                           "\n"), -1))
        errors = (dead.select("topic", last.alias("error")).groupBy("topic", "error")
                  .agg(F.count(F.lit(1)).alias("messages"))
                  .orderBy(F.desc("messages"), "topic", "error").limit(TOP_ERRORS).toPandas())
    return Report(s.toPandas(), attempts.toPandas(), throughput.toPandas(), errors)


def report(spark: Any, url: str, *, html_path: str | None = None,
           archive_path: str | None = None, bucket: str = "1 minute",
           topic: str | None = None) -> Report:
    """The report for the queue at `url` (and its Parquet archive, if given); writes the
    HTML page when html_path is set."""
    def read(source: str) -> DataFrame:
        r = spark.read.format("tableq").option("url", url).option("source", source)
        if topic is not None:
            r = r.option("topic", topic)
        df: DataFrame = r.load()
        return df

    done, dead = read("archive"), read("dead")
    if archive_path is not None:
        done, dead = _with_archive(spark, done, dead, archive_path, topic)
    rep = compute(done, dead, bucket=bucket)
    if html_path is not None:
        rep.html_path = write_html(rep, html_path, archive=archive_path is not None)
    return rep


def _with_archive(spark: Any, done: DataFrame, dead: DataFrame, path: str,
                  topic: str | None) -> tuple[DataFrame, DataFrame]:
    def add(df: DataFrame, sub: str) -> DataFrame:
        # The partition columns as text: left to Spark, topic=007 and topic=7 both read as
        # the number 7 (and a topic that is not a number beside them failed the cast).
        schema = StructType([*df.schema.fields, StructField("date", StringType()),
                             StructField("run", StringType())])
        try:
            arch = spark.read.schema(schema).parquet(f"{path.rstrip('/')}/{sub}")
        except Exception as exc:
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return df
            raise
        if topic is not None:
            arch = arch.where(F.col("topic") == topic)
        # A run written and not yet purged (running, or cut short by a crash) has its rows
        # in both places: counted once, from the database.
        # (A dead letter requeued and dead again keeps its id: its deaths differ by time.)
        when = "dead_at" if sub == "dead" else "done_at"
        arch = arch.join(df.select("id", when), ["id", when], "left_anti")
        return df.unionByName(arch.select(*df.columns))
    return add(done, "done"), add(dead, "dead")


def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def page(rep: Report, *, title: str = "tableq report", archive: bool = False) -> str:
    """The report as one self-contained HTML page (styles inlined, charts as SVG)."""
    from datetime import UTC, datetime

    from markupsafe import Markup

    from tableq.look import charts, environment, fmt_duration, fmt_number, fmt_pct, stylesheet

    summary = rep.summary
    rows_s = summary.to_dict("records") if len(summary) else []
    done = sum(int(r["done"] or 0) for r in rows_s)
    dead = sum(int(r["dead"] or 0) for r in rows_s)
    finished = done + dead
    rate = sum(_num(r["rate_per_s"]) or 0.0 for r in rows_s)
    figures = [("topics", fmt_number(len(rows_s)), None), ("done", fmt_number(done), None),
               ("dead", fmt_number(dead), None),
               ("dead rate", fmt_pct(dead / finished if finished else None), None),
               ("throughput", f"{rate:,.1f}/s", "sum of the topics' done rates")]
    columns = ["topic", "done", "dead", "failure rate", "dead rate", "done/s", "wait p50",
               "wait p99", "work p50", "work p99"]
    rows = [[r["topic"], fmt_number(r["done"]), fmt_number(r["dead"]), fmt_pct(r["failure_rate"]),
             fmt_pct(r["dead_rate"]),
             "–" if _num(r["rate_per_s"]) is None else f"{_num(r['rate_per_s']):,.1f}",
             fmt_duration(_num(r["wait_p50_s"])), fmt_duration(_num(r["wait_p99_s"])),
             fmt_duration(_num(r["work_p50_s"])), fmt_duration(_num(r["work_p99_s"]))]
            for r in rows_s]
    topics = [r["topic"] for r in rows_s]
    chart_list = []
    tp = rep.throughput
    series = []
    for topic in sorted(set(tp["topic"])) if len(tp) else []:
        part = tp[tp["topic"] == topic]
        series.append((topic, [(b.timestamp(), float(n)) for b, n in
                               zip(part["bucket"], part["done"], strict=True)]))
    chart_list.append(charts.line_chart("Throughput: messages done per bucket", series,
                                        unit="messages"))
    for name, label in (("wait", "Wait: available to received"),
                        ("work", "Work: received to acked")):
        cols = [f"{name}_p{p}_s" for p in (50, 90, 99)]
        values = [_num(r[c]) for r in rows_s for c in cols]
        unit, factor = charts.seconds_unit([v for v in values if v is not None])
        chart_list.append(charts.bar_chart(
            label, topics, [(c.split("_")[1], [(_num(r[c]) or 0.0) * factor for r in rows_s])
                            for c in cols], unit=unit))
    chart_list.append(charts.bar_chart(
        "Failure and dead-letter rates", topics,
        [("failure rate", [(_num(r["failure_rate"]) or 0.0) * 100 for r in rows_s]),
         ("dead rate", [(_num(r["dead_rate"]) or 0.0) * 100 for r in rows_s])], unit="%"))
    errors = ([[e["topic"], e["error"] or "(no error text)", fmt_number(e["messages"])]
               for e in rep.errors.to_dict("records")] if rep.errors is not None else [])
    attempts = [[a["topic"], fmt_number(a["attempts"]), fmt_number(a["messages"])]
                for a in rep.attempts.to_dict("records")] if len(rep.attempts) else []
    return environment().get_template("report.html").render(
        title=title, where="Spark report", css=Markup(stylesheet()),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), archive=archive,
        summary=figures, columns=columns, rows=rows,
        numeric=columns[1:], charts=chart_list, errors=errors, attempts=attempts)


def write_html(rep: Report, path: str, *, archive: bool = False) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(page(rep, archive=archive), encoding="utf-8")
    log.info("tableq.report_written path=%s", path)
    return str(path)
