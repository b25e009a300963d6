"""Pipelines built on the tableq data source, one module each: load (files or generated jobs
into a topic), requeue (dead letters back to live), archive (done and dead messages to
Parquet) and report (throughput, latency, failures)."""
