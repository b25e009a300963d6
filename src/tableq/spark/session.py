"""The SparkSession helper the pipelines and the CLI use: local[*] by default, the master a
spark-submit launch chose otherwise, with tableq registered. No queue logic here."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER = "local[*]"
QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = off
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = off
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = off
logger.v2.name = org.apache.spark.sql.execution.datasources.v2
logger.v2.level = off
"""


def launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(master: str | None = None, *, app_name: str = "tableq",
                conf: Mapping[str, str] | None = None, quiet: bool = True) -> Any:
    """A SparkSession with the tableq source registered. master=None means local[*], or the
    master spark-submit was given when launched that way."""
    from pyspark.sql import SparkSession

    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Workers are started from the JVM's environment, which this process passes on.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if quiet:
            builder = builder.config("spark.driver.extraJavaOptions",
                                     f"-Dlog4j2.configurationFile=file://{_log4j_file()}")
    settings = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(conf or {}),
    }
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    from tableq.spark import register

    register(spark)
    return spark


def _log4j_file() -> str:
    import tempfile

    path = os.path.join(tempfile.gettempdir(), "tableq-log4j2-quiet.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(QUIET_LOG4J)
        os.replace(tmp, path)
    return path
