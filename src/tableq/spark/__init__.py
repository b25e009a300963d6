"""tableq on Apache Spark: the `tableq` data source and the pipelines built on it. Importing
this package imports pyspark; nothing else in tableq does."""

from __future__ import annotations

from typing import Any

from tableq.spark.source import TableqDataSource

__all__ = ["TableqDataSource", "register"]


def register(spark: Any) -> None:
    """Registers format("tableq") on the session."""
    spark.dataSource.register(TableqDataSource)
