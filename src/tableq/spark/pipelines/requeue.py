"""The requeue pipeline: consume a topic in blocks, route each message to a topic chosen by a
SQL column expression, sort each block, and enqueue it again, exactly once (the tableq source
acknowledges a block only after the tableq sink has published it). No SQL on the queue here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

log = logging.getLogger("tableq.spark")

# What travels from the source to the sink unchanged; `topic` is the routing expression.
CARRIED = ("payload", "payload_bytes", "key", "kind", "headers", "priority")


@dataclass(frozen=True)
class RequeueResult:
    batches: int
    rows: int


def sort_column(spec: str) -> Any:
    """A sort column from SQL text such as "priority DESC" (F.expr would read DESC as an
    alias)."""
    text = spec.strip()
    head, _, last = text.rpartition(" ")
    if head and last.upper() in ("ASC", "DESC"):
        col = F.expr(head)
        return col.desc() if last.upper() == "DESC" else col.asc()
    return F.expr(text)


def route_block(block: Any, *, route: str, order_by: Sequence[str]) -> Any:
    """One block as the sink's columns: a `topic` from `route`, sorted by `order_by`, in one
    partition (rows are published in the order they are staged)."""
    order = [sort_column(o) for o in order_by]
    return (block.withColumn("_to", F.expr(route)).coalesce(1).sortWithinPartitions(*order)
            .select(F.col("_to").alias("topic"), *CARRIED))


def requeue(spark: Any, url: str, topic: str, *, route: str, checkpoint: str,
            order_by: Sequence[str] = ("priority DESC", "id"), block_rows: int = 1000,
            follow: bool = False, sink_name: str | None = None,
            lease_seconds: float = 300.0) -> RequeueResult:
    """Moves the messages of `topic` to the topics `route` names (a SQL expression over the
    source columns: id, key, kind, payload (JSON text), headers, priority, attempts, ...).
    Runs until the topic is drained (Trigger.AvailableNow), or forever with follow=True.
    Rerunning with the same checkpoint continues where the last run stopped.

    Spark refuses to sort a streaming DataFrame, so each block is written from foreachBatch
    by the batch sink under the job id '<sink>:<batchId>': a replayed block finds its job
    already committed and publishes nothing, and the source acknowledges a block only after
    Spark has recorded the batch as done. Exactly once, like the stream sink."""
    sink = sink_name or f"requeue:{topic}"
    src = (spark.readStream.format("tableq").option("url", url).option("topic", topic)
           .option("maxRows", str(block_rows)).option("leaseSeconds", str(lease_seconds))
           .load())

    def write_block(block: Any, batch_id: int) -> None:
        (route_block(block, route=route, order_by=order_by)
         .write.format("tableq").option("url", url).option("payloadFormat", "json")
         .option("jobId", f"{sink}:{batch_id}").mode("append").save())

    writer = (src.writeStream.foreachBatch(write_block)
              .option("checkpointLocation", checkpoint))
    writer = (writer.trigger(processingTime="1 second") if follow
              else writer.trigger(availableNow=True))
    query = writer.start()
    query.awaitTermination()
    progress = [n for n in (_input_rows(p) for p in query.recentProgress) if n]
    rows = sum(progress)
    log.info("tableq.requeue_done topic=%s batches=%d rows=%d", topic, len(progress), rows)
    return RequeueResult(len(progress), rows)


def _input_rows(progress: Any) -> int:
    value = getattr(progress, "numInputRows", None)
    if value is None and isinstance(progress, dict):
        value = progress.get("numInputRows")
    return int(value or 0)
