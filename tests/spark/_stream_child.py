"""A Spark driver for the crash tests: topic `a` -> Spark -> topic `b` through the tableq source
and sink. `run` streams until killed; `drain` finishes with Trigger.AvailableNow. Faults come
from the test's hook (_faults.py), through the environment the test starts this driver with."""

from __future__ import annotations

import sys
from pathlib import Path

from tableq.spark.session import get_session

HERE = Path(__file__).resolve().parent


def main(url: str, checkpoint: str, mode: str, max_rows: str) -> None:
    spark = get_session("local[2,2]", app_name=f"tableq-stream-child-{mode}", quiet=True, conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
        f"-Dlog4j2.configurationFile=file://{HERE / 'log4j2-quiet.properties'}",
    })
    src = (spark.readStream.format("tableq").option("url", url).option("topic", "a")
           .option("maxRows", max_rows).option("numPartitions", "2").load())
    writer = (src.select("payload", "key").writeStream.format("tableq")
              .option("url", url).option("topic", "b").option("payloadFormat", "json")
              .option("sinkName", "a-to-b").option("checkpointLocation", checkpoint))
    if mode == "drain":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="0 seconds").start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
