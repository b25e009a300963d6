"""The requeue pipeline: consume a topic in blocks, route each message to a topic chosen by a
SQL column expression, sort each block, and enqueue it again, exactly once (the tableq source
acknowledges a block only after the tableq sink has published it). No SQL on the queue here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

from tableq.errors import InvalidArgument
from tableq.spark.options import SINK_NAME_MAX
from tableq.spark.sink import stream_job

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
    by the batch sink under the job id '<sink>:<queryId>:<batchId>' (stream_job): a replayed
    block finds its job already committed and publishes nothing, and the source acknowledges
    a block only after Spark has recorded the batch as done. Exactly once, like the stream
    sink; a new checkpoint is a new query, whose jobs are its own.

    A moved message whose key is live in its target topic replaces that message (as
    on_duplicate='replace'): routed back to its own topic it is the live one itself, which
    keeps its id and goes back to ready, unleased, with its attempts reset."""
    sink = sink_name or "requeue"
    if not (1 <= len(sink) <= SINK_NAME_MAX and sink.isprintable()):
        raise InvalidArgument(f"sink_name must be 1-{SINK_NAME_MAX} printable characters")
    src = (spark.readStream.format("tableq").option("url", url).option("topic", topic)
           .option("maxRows", str(block_rows)).option("leaseSeconds", str(lease_seconds))
           .load())
    counted = _Counted()

    def write_block(block: Any, batch_id: int) -> None:
        query_id = block.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:  # then a new checkpoint's blocks would take the old one's jobs
            raise RuntimeError("requeue: Spark gave foreachBatch no sql.streaming.queryId")
        routed = route_block(block, route=route, order_by=order_by).cache()
        try:
            rows = routed.count()
            if rows:
                (routed.write.format("tableq").option("url", url)
                 .option("payloadFormat", "json").option("onDuplicate", "replace")
                 .option("jobId", stream_job(sink, query_id, batch_id)).mode("append").save())
        finally:
            routed.unpersist()
        counted.add(rows)

    writer = (src.writeStream.foreachBatch(write_block)
              .option("checkpointLocation", checkpoint))
    writer = (writer.trigger(processingTime="1 second") if follow
              else writer.trigger(availableNow=True))
    query = writer.start()
    query.awaitTermination()
    log.info("tableq.requeue_done topic=%s batches=%d rows=%d", topic, counted.batches,
             counted.rows)
    return RequeueResult(counted.batches, counted.rows)


class _Counted:
    """What the blocks moved, counted as they are written (Spark's recentProgress keeps only
    the last 100 batches)."""

    def __init__(self) -> None:
        self.batches = self.rows = 0

    def add(self, rows: int) -> None:
        if rows:
            self.batches += 1
            self.rows += rows
