"""Streaming through the tableq source and sink: AvailableNow drains and stops; a killed and
restarted query (same checkpoint) loses nothing and duplicates nothing from topic a to b."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import tableq
from tableq.testing import wait_until

from .conftest import HERE, child_env


def test_available_now_drains_and_stops(spark, any_url: str, tmp_path: Path) -> None:
    url = any_url
    q = tableq.connect(url, migrate=True, retention=True)
    q.send_many("a", [{"i": i} for i in range(95)])
    q.send("a", {"i": "later"}, delay=3600)  # not due: not part of this run
    src = (spark.readStream.format("tableq").option("url", url).option("topic", "a")
           .option("maxRows", "20").option("retention", "true").load())
    query = (src.select(F.get_json_object("payload", "$.i").cast("int").alias("i"), "lease")
             .writeStream.format("memory").queryName("drained")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(timeout=120)
    assert not query.isActive, "AvailableNow did not stop"
    rows = spark.table("drained").collect()
    assert sorted(r.i for r in rows) == list(range(95))
    assert len({r.lease for r in rows}) == 5  # 20+20+20+20+15, one lease per micro-batch
    s = q.stats("a")[0]
    assert (s.ready, s.in_flight, s.scheduled, s.done) == (0, 0, 1, 95)  # all acked, even the last
    q.close()


def test_max_rows_and_bad_stream_options(spark, tmp_path: Path) -> None:
    from pyspark.errors import AnalysisException, PySparkException

    url = f"sqlite:///{tmp_path}/s.db"
    tableq.connect(url, migrate=True).close()
    with pytest.raises((AnalysisException, PySparkException), match="'maxRows': must be"):
        spark.readStream.format("tableq").option("url", url).option("topic", "a") \
            .option("maxRows", "lots").load()
    with pytest.raises((AnalysisException, PySparkException), match="'topic': is required"):
        spark.readStream.format("tableq").option("url", url).load()


def _child(url: str, checkpoint: Path, mode: str, log: Path,
           fault: str = "") -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "_stream_child.py"), url, str(checkpoint), mode, "15",
             fault],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)


@pytest.mark.slow
def test_killed_and_restarted_query_is_exactly_once(any_url: str, tmp_path: Path) -> None:
    url = any_url
    n = 150
    q = tableq.connect(url, migrate=True)
    q.send_many("a", [{"i": i} for i in range(n)])
    ck, log = tmp_path / "ck", tmp_path / "child.log"
    child = _child(url, ck, "run", log)
    try:
        # Kill the driver (JVM, Python workers and all) once some batches have gone through.
        wait_until(lambda: q.stats("b")[0].ready >= 45 or child.poll() is not None,
                   timeout=180, interval=0.05)
        assert child.poll() is None, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)  # its own session: only what this test started
        child.wait()
    moved = q.stats("b")[0].ready
    assert moved < n, "the query finished before it was killed: nothing was tested"
    drain = _child(url, ck, "drain", log)
    assert drain.wait(timeout=240) == 0, log.read_text()[-3000:]
    b = q.peek("b", limit=10_000)
    got = [m.payload["i"] for m in b]
    assert len(got) == n, f"{len(got)} messages in b for {n} sent (killed at {moved})"
    assert sorted(got) == list(range(n)), "lost or duplicated messages"
    a = q.stats("a")[0]
    assert (a.ready, a.in_flight, a.scheduled) == (0, 0, 0)
    q.close()


def test_stream_sink_rejects_bad_columns_when_the_query_starts(spark, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    url = f"sqlite:///{tmp_path}/s.db"
    q = tableq.connect(url, migrate=True)
    q.send("a", {"i": 1})
    src = spark.readStream.format("tableq").option("url", url).option("topic", "a").load()
    query = (src.select("id", "payload").writeStream.format("tableq").option("url", url)
             .option("topic", "b").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException, match="column 'id': unknown column"):
        query.awaitTermination(60)
    assert q.stats("b")[0].ready == 0
    q.close()


@pytest.mark.slow
def test_a_batch_leased_but_never_logged_is_taken_over_on_restart(url: str,
                                                                  tmp_path: Path) -> None:
    """The driver dies after latestOffset leased batch 3 and before Spark wrote offsets/2 (batch
    ids count from 0): the restarted query must reuse those leases at once, not wait for them
    to expire (leaseSeconds is 300)."""
    n = 60
    q = tableq.connect(url, migrate=True)
    q.send_many("a", [{"i": i} for i in range(n)])
    ck, log = tmp_path / "ck", tmp_path / "child.log"
    crashed = _child(url, ck, "run", log, fault="exit-after-claim:3")
    assert crashed.wait(timeout=180) != 0, log.read_text()[-3000:]
    a = q.stats("a")[0]
    assert a.in_flight == 15, "the crash should leave exactly the orphaned batch leased"
    drain = _child(url, ck, "drain", log)
    assert drain.wait(timeout=240) == 0, log.read_text()[-3000:]
    got = [m.payload["i"] for m in q.peek("b", limit=10_000)]
    assert sorted(got) == list(range(n)), "lost or duplicated messages"
    a = q.stats("a")[0]
    assert (a.ready, a.in_flight) == (0, 0)
    q.close()


@pytest.mark.slow
def test_a_batch_published_but_not_logged_is_not_published_twice(tmp_path: Path) -> None:
    """The driver dies right after the sink published batch 1 and before Spark recorded it:
    the restarted query replays batch 1, and the sink's job ledger turns it into a no-op."""
    n = 45
    url = f"sqlite:///{tmp_path}/ledger.db"
    q = tableq.connect(url, migrate=True)
    q.send_many("a", [{"i": i} for i in range(n)])
    ck, log = tmp_path / "ck", tmp_path / "child.log"
    crashed = _child(url, ck, "run", log, fault="exit-after-publish:1")
    assert crashed.wait(timeout=180) != 0, log.read_text()[-3000:]
    assert q.stats("b")[0].ready == 30  # batches 0 and 1 were published
    assert q.staged_job_state("a-to-b:1") == "committed"
    drain = _child(url, ck, "drain", log)
    assert drain.wait(timeout=240) == 0, log.read_text()[-3000:]
    got = [m.payload["i"] for m in q.peek("b", limit=10_000)]
    assert sorted(got) == list(range(n)), "lost or duplicated messages"
    a = q.stats("a")[0]
    assert (a.ready, a.in_flight) == (0, 0)
    q.close()
