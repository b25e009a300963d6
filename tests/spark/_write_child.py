"""A Spark driver for the dead-driver test: a batch write with one task that stages its rows
and one that hangs, so the test can kill the driver between staging and commit."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from pyspark.sql import functions as F

from tableq.spark.session import get_session

HERE = Path(__file__).resolve().parent


def main(url: str, job: str) -> None:
    spark = get_session("local[2]", app_name="tableq-write-child", conf={
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100",
        "spark.driver.extraJavaOptions":
            f"-Dlog4j2.configurationFile=file://{HERE / 'log4j2-quiet.properties'}",
    })

    @F.udf("long")
    def hang_at_2500(n):  # type: ignore[no-untyped-def]
        if n == 2500:  # the first row of partition 1; partition 0 stages all its rows
            threading.Event().wait()  # never set: the task hangs until the driver is killed
        return n

    df = spark.range(0, 5000, 1, 2).select(F.struct(hang_at_2500("id").alias("n"))
                                           .alias("payload"))
    df.write.format("tableq").option("url", url).option("topic", "jobs") \
        .option("jobId", job).mode("append").save()


if __name__ == "__main__":
    main(*sys.argv[1:])
