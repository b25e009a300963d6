"""Batch writes through format("tableq"): columns to messages, all-or-nothing under task
retries and commit failures, planning-time errors, the janitor for dead drivers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import functions as F

import tableq
from tableq.bulk import Bulk
from tableq.testing import wait_until

from ._faults import injected


def _save(df, url: str, topic: str | None = "jobs", **options: str) -> None:  # type: ignore[no-untyped-def]
    w = df.write.format("tableq").option("url", url).mode("append")
    if topic is not None:
        w = w.option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def _all(q: tableq.Queue, topic: str) -> list[tableq.Message]:
    return q.peek(topic, limit=10_000)


def test_columns_become_messages(spark, any_url: str) -> None:
    q = tableq.connect(any_url, migrate=True)
    at = datetime(2030, 1, 1, tzinfo=UTC)
    df = spark.createDataFrame(
        [({"n": 1}, "k1", "greet", {"h": "1"}, 5, None, None, "a"),
         ({"n": 2}, None, None, None, 0, 3600.0, None, "b"),
         ({"n": 3}, "k3", None, None, None, None, at, None)],
        "payload map<string,int>, key string, kind string, headers map<string,string>, "
        "priority int, delay_s double, available_at timestamp, topic string",
    )
    with pytest.raises(AnalysisException, match="delay_s or available_at"):
        _save(df, any_url)
    _save(df.drop("available_at"), any_url)
    a, b, jobs = _all(q, "a"), q.peek("b"), _all(q, "jobs")
    assert [(m.payload, m.key, m.kind, m.headers, m.priority) for m in a] == [
        ({"n": 1}, "k1", "greet", {"h": "1"}, 5)]
    assert [m.payload for m in b] == [{"n": 2}]
    assert b[0].available_at - q.now() > timedelta(seconds=3000)  # delay_s = one hour
    assert q.stats("b")[0].scheduled == 1
    assert [m.payload for m in jobs] == [{"n": 3}]
    _save(df.drop("delay_s").where("topic IS NULL"), any_url)
    assert q.stats("jobs")[0].scheduled == 0  # key k3 is live already: ignored duplicate
    _save(df.drop("delay_s").where("topic IS NULL"), any_url, topic="later")
    assert q.stats("later")[0].scheduled == 1
    assert q.now() < at
    q.close()


def test_payload_kinds(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True)
    df = spark.createDataFrame([("plain", '{"a": [1, 2]}', bytearray(b"\x00\xff"))],
                               "s string, j string, b binary")
    _save(df.select(F.col("s").alias("payload")), url, topic="s")
    _save(df.select(F.col("j").alias("payload")), url, topic="j", payloadFormat="json")
    _save(df.select(F.col("b").alias("payload")), url, topic="b")
    _save(spark.range(3).select(F.struct("id", F.array(F.col("id"), F.lit(7)).alias("xs"))
                                .alias("payload")), url, topic="st")
    assert [m.payload for m in _all(q, "s")] == ["plain"]
    assert [m.payload for m in _all(q, "j")] == [{"a": [1, 2]}]
    assert [m.payload for m in _all(q, "b")] == [b"\x00\xff"]
    got = sorted((m.payload for m in _all(q, "st")), key=lambda p: p["id"])
    assert got == [{"id": i, "xs": [i, 7]} for i in range(3)]
    q.close()


def _failing_once(marker: Path):  # type: ignore[no-untyped-def]
    """A UDF that fails partition 1's first attempt at row 900, after earlier Arrow batches
    of that task were staged; the retry (local[2,2]) succeeds."""
    path = str(marker)

    @F.udf("long")
    def check(n):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if n == 900 and ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
            open(path, "w").write(str(ctx.taskAttemptId()))
            raise RuntimeError("injected task failure")
        return n

    return check


def test_task_retry_publishes_each_row_once(spark, any_url: str, tmp_path: Path) -> None:
    q = tableq.connect(any_url, migrate=True)
    marker = tmp_path / "failed-once"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = (spark.range(0, 1000, 1, 2)
              .select(_failing_once(marker)("id").alias("n"))
              .select(F.struct("n").alias("payload")))
        _save(df, any_url, jobId="retry-job")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.exists(), "the injected failure never happened, so no retry was tested"
    got = sorted(m.payload["n"] for m in _all(q, "jobs"))
    assert got == list(range(1000))
    assert Bulk(q).staged_job_state("retry-job") == "committed"
    q.close()


def test_task_failing_after_staging_is_retried_and_published_once(spark, any_url: str) -> None:
    q = tableq.connect(any_url, migrate=True)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.range(0, 1000, 1, 2).select(F.struct(F.col("id").alias("n")).alias("payload"))
        with injected("task"):
            _save(df, any_url, jobId="fault-task")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # Attempt 0 of partition 1 staged 100 rows and failed; only attempt 1 was published.
    got = sorted(m.payload["n"] for m in _all(q, "jobs"))
    assert got == list(range(1000))
    q.close()


def test_every_attempt_failing_leaves_nothing(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True)

    @F.udf("long")
    def always(n):  # type: ignore[no-untyped-def]
        if n == 990:
            raise RuntimeError("injected permanent failure")
        return n

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.range(0, 1000, 1, 2).select(F.struct(always("id").alias("n")).alias("payload"))
        with pytest.raises(PythonException, match="injected permanent failure"):
            _save(df, url, jobId="doomed")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert not q.stats("jobs") or q.stats("jobs")[0].live == 0
    # The other partition's task may still be staging after Spark's abort: it reopens the
    # load (its rows stay invisible), and the janitor drops it once it is stale.
    assert Bulk(q).staged_job_state("doomed") in ("aborted", "open")

    def janitor_left_nothing() -> bool:
        Bulk(q).cleanup_staged(older_than=0)
        return Bulk(q).staged_job_state("doomed") == "aborted"

    wait_until(janitor_left_nothing, timeout=30)
    assert not q.stats("jobs") or q.stats("jobs")[0].live == 0
    q.close()


def test_commit_failure_aborts(spark, any_url: str) -> None:
    q = tableq.connect(any_url, migrate=True)
    df = spark.range(0, 500, 1, 2).select(F.struct("id").alias("payload"))
    with pytest.raises(AnalysisException, match="fault injected into commit"):
        with injected("commit"):
            _save(df, any_url, jobId="bad-commit")
    assert q.stats("jobs")[0].ready == 0
    assert Bulk(q).staged_job_state("bad-commit") == "aborted"
    # The same job id, run again without the fault, publishes once; a third run is a no-op.
    _save(df, any_url, jobId="bad-commit")
    _save(df, any_url, jobId="bad-commit")
    assert q.stats("jobs")[0].ready == 500
    q.close()


def test_dead_driver_staging_is_cleaned_by_the_next_load(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True)
    Bulk(q).stage_many("driver-died", 7, "jobs", [{"x": 1}, {"x": 2}])
    assert Bulk(q).staged_job_state("driver-died") == "open"
    _save(spark.range(2).select(F.struct("id").alias("payload")), url, staleJobSeconds="0")
    assert Bulk(q).staged_job_state("driver-died") == "aborted"
    assert Bulk(q).publish_staged("driver-died", [7]) == 0  # its rows are gone
    assert q.stats("jobs")[0].ready == 2
    q.close()


def test_a_rerun_of_a_job_whose_driver_died_publishes_its_own_rows(spark, any_url: str) -> None:
    """Rerunning a load with its jobId after its driver died (what jobId is for): the dead
    run's tasks left rows staged under parts 0 and 1, the numbers the new application's task
    attempts start from again. They staged onto the dead run's parts, and the publish found
    more rows than its tasks reported (LoadIncomplete, blaming a database crash; found by
    review). A writer run's parts are its own now; the dead run's rows are dropped."""
    q = tableq.connect(any_url, migrate=True)
    for part in (0, 1):
        Bulk(q).stage_many("daily-load", part, "daily", [{"dead": part, "i": i} for i in range(30)])
    rows = spark.range(0, 100, 1, 2).select(F.struct("id").alias("payload"))
    _save(rows, any_url, topic="daily", jobId="daily-load")
    got = q.peek("daily", limit=1000)
    assert sorted(m.payload["id"] for m in got) == list(range(100))
    assert Bulk(q).staged_job_state("daily-load") == "committed"
    q.close()


def test_an_empty_topic_column_is_refused_not_sent_to_the_option(spark, url: str) -> None:
    """Only a null `topic` falls back to the 'topic' option; "" was sent there (review)."""
    q = tableq.connect(url, migrate=True)
    rows = spark.createDataFrame([({"a": 1}, ""), ({"a": 2}, None)],
                                 "payload map<string,int>, topic string")
    with pytest.raises(Exception, match="topic"):
        _save(rows, url, topic="dflt")
    assert q.peek("dflt") == []
    q.close()


@pytest.mark.parametrize(
    ("build", "options", "error"),
    [
        (lambda s: s.range(1).select(F.struct("id").alias("payload")), {"url": None},
         "option 'url': is required"),
        (lambda s: s.range(1).select(F.struct("id").alias("payload")), {"topic": None},
         "option 'topic': is required"),
        (lambda s: s.range(1).select(F.struct("id").alias("payload"), F.lit(1).alias("prio")),
         {}, "column 'prio': unknown column"),
        (lambda s: s.range(1).select(F.struct("id").alias("payload"),
                                     F.lit("high").alias("priority")),
         {}, "column 'priority': has type string, must be an integer type"),
        (lambda s: s.range(1).select(F.col("id").alias("n")), {}, "column 'payload': is required"),
        (lambda s: s.range(1).select(F.struct("id").alias("payload")), {"onDuplicate": "merge"},
         "option 'onDuplicate': must be one of"),
    ],
)
def test_bad_options_fail_at_planning(spark, tmp_path: Path, build, options, error) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/never-created.db"
    opts = {"url": url, "topic": "jobs", **options}
    w = build(spark).write.format("tableq").mode("append")
    for k, v in opts.items():
        if v is not None:
            w = w.option(k, v)
    with pytest.raises(AnalysisException, match="Failed to initialize Python data source") as e:
        w.save()
    assert error in str(e.value)
    assert not (tmp_path / "never-created.db").exists(), "nothing may run before planning fails"


def test_overwrite_is_refused(spark, tmp_path: Path) -> None:
    df = spark.range(1).select(F.struct("id").alias("payload"))
    with pytest.raises(AnalysisException, match="overwrite is not supported"):
        (df.write.format("tableq").option("url", f"sqlite:///{tmp_path}/x.db")
         .option("topic", "t").mode("overwrite").save())


def test_due_times_follow_delay(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True)
    df = spark.createDataFrame([({"a": 1}, 0.0), ({"a": 2}, 7200.0)],
                               "payload map<string,int>, delay_s double")
    _save(df, url)
    s = q.stats("jobs")[0]
    assert (s.ready, s.scheduled) == (1, 1)
    got = q.receive("jobs", max=10)
    assert [m.payload for m in got] == [{"a": 1}]
    assert got[0].available_at - q.now() < timedelta(seconds=60)
    q.close()


@pytest.mark.slow
def test_a_killed_driver_leaves_nothing_visible_and_the_janitor_cleans_up(
        spark, url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tableq.testing import wait_until

    from .conftest import HERE, child_env, kill_driver

    q = tableq.connect(url, migrate=True)
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, str(HERE / "_write_child.py"), url, "killed"],
                                 stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                 start_new_session=True)
    try:
        wait_until(lambda: Bulk(q).staged_job_state("killed") == "open" or child.poll() is not None,
                   timeout=120, interval=0.05)
        assert child.poll() is None, log.read_text()[-3000:]
    finally:
        kill_driver(child)
    assert q.stats("jobs")[0].ready == 0  # staged, never published
    assert Bulk(q).staged_job_state("killed") == "open"
    _save(spark.range(3).select(F.struct("id").alias("payload")), url, staleJobSeconds="0")
    assert Bulk(q).staged_job_state("killed") == "aborted"
    assert q.stats("jobs")[0].ready == 3
    q.close()


def test_struct_payloads_made_column_wise_equal_the_general_path() -> None:
    """The column-wise JSON of plain structs (the fast path) must give the payloads the
    per-row path gives, nulls and awkward strings included; NaN falls back and is refused."""
    import json

    import pyarrow as pa
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    from tableq.codecs import JsonText, encode_payload
    from tableq.spark.sink import _jsonable, _struct_json

    inner = StructType([StructField("b", BooleanType()), StructField("s%d", StringType())])
    dt = StructType([StructField("n", LongType()), StructField("i", IntegerType()),
                     StructField("x", DoubleType()), StructField('q"é', StringType()),
                     StructField("in", inner)])
    rows = [
        {"n": 1, "i": None, "x": 0.1, 'q"é': 'a"b\\c\n\u2028é%s', "in": {"b": True, "s%d": "%"}},
        {"n": None, "i": -2, "x": None, 'q"é': None, "in": None},
        None,
        {"n": 2**62, "i": 0, "x": 1e300, 'q"é': "", "in": {"b": None, "s%d": None}},
    ]
    arrow_type = pa.struct([("n", pa.int64()), ("i", pa.int32()), ("x", pa.float64()),
                            ('q"é', pa.string()),
                            ("in", pa.struct([("b", pa.bool_()), ("s%d", pa.string())]))])
    arr = pa.array(rows, type=arrow_type)
    texts = _struct_json(arr, dt)
    assert texts is not None
    general = [_jsonable(dt)(v) for v in arr.to_pylist()]
    assert [json.loads(t) for t in texts] == general
    assert [encode_payload(JsonText(t), 1 << 20).json_text for t in texts] == texts
    nan = pa.array([{"x": float("nan")}], type=pa.struct([("x", pa.float64())]))
    assert _struct_json(nan, StructType([StructField("x", DoubleType())])) is None
