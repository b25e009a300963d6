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


def requeue_stream(spark: Any, url: str, topic: str, *, route: str,
                   order_by: Sequence[str] = ("priority DESC", "id"), block_rows: int = 1000,
                   lease_seconds: float = 300.0) -> Any:
    """The streaming DataFrame the pipeline writes: one block per micro-batch, in one
    partition, sorted by `order_by`, with a `topic` column from `route`."""
    src = (spark.readStream.format("tableq").option("url", url).option("topic", topic)
           .option("maxRows", str(block_rows)).option("leaseSeconds", str(lease_seconds))
           .load())
    routed = src.withColumn("_to", F.expr(route))
    order = [F.expr(o) for o in order_by]
    # One partition per block: rows are published in the order they are staged.
    return (routed.coalesce(1).sortWithinPartitions(*order)
            .select(F.col("_to").alias("topic"), *CARRIED))


def requeue(spark: Any, url: str, topic: str, *, route: str, checkpoint: str,
            order_by: Sequence[str] = ("priority DESC", "id"), block_rows: int = 1000,
            follow: bool = False, sink_name: str | None = None,
            lease_seconds: float = 300.0) -> RequeueResult:
    """Moves the messages of `topic` to the topics `route` names (a SQL expression over the
    source columns: id, key, kind, payload (JSON text), headers, priority, attempts, ...).
    Runs until the topic is drained (Trigger.AvailableNow), or forever with follow=True.
    Rerunning with the same checkpoint continues where the last run stopped."""
    df = requeue_stream(spark, url, topic, route=route, order_by=order_by,
                        block_rows=block_rows, lease_seconds=lease_seconds)
    writer = (df.writeStream.format("tableq").option("url", url)
              .option("payloadFormat", "json").option("checkpointLocation", checkpoint)
              .option("sinkName", sink_name or f"requeue:{topic}")
              .queryName(f"tableq_requeue_{abs(hash((url, topic))) % 10**8}"))
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
