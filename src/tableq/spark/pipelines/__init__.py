"""Pipelines built on the tableq data source: requeue (here), archive and report
(tableq.spark.archive, tableq.spark.report) and load (tableq.spark.load)."""
