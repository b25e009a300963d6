"""Streaming through the tableq source and sink: AvailableNow drains and stops; a query from
topic a to topic b killed with kill -9 at a random point, or whose driver dies right after a
claim or right after a publish (at a random batch), or whose database server crashed, loses
nothing and duplicates nothing once restarted on its checkpoint, on SQLite, PostgreSQL and
MariaDB. The killed driver is a subprocess; the restart drains in this process's session."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import tableq
from tableq.bulk import Bulk
from tableq.testing import wait_until

from ._faults import hook_env
from .conftest import HERE, child_env, kill_driver

N_STREAM = int(os.environ.get("TABLEQ_FAULT_SPARK_N", "180"))  # 12 micro-batches of 15
BATCH = 15


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


def test_a_sink_name_with_a_new_checkpoint_is_a_new_run(spark, url: str, tmp_path: Path) -> None:
    """docs/spark.md's a -> b stream, run again with a fresh checkpoint and the same sinkName
    (found by review): its batch ids start again at 0, and its jobs were '<sinkName>:<batch>',
    already committed by the first run: skipped as replays, their messages acked unpublished.
    Jobs now carry the query id too. Byte payloads travel in payload_bytes (the example's
    select of payload alone made them JSON null)."""
    q = tableq.connect(url, migrate=True)

    def run(ck: str) -> None:
        stream = spark.readStream.format("tableq").option("url", url).option("topic", "a").load()
        query = (stream.select("payload", "payload_bytes", "key").writeStream.format("tableq")
                 .option("url", url).option("topic", "b").option("payloadFormat", "json")
                 .option("sinkName", "a-to-b").option("checkpointLocation", ck)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert not query.isActive

    q.send_many("a", [{"run": 1, "i": i} for i in range(3)])
    q.send("a", b"\x01\x02binary")
    run(str(tmp_path / "ck1"))
    q.send_many("a", [{"run": 2, "i": i} for i in range(3)])
    run(str(tmp_path / "ck2"))
    got = [m.payload for m in q.peek("b", limit=100)]
    assert b"\x01\x02binary" in got
    assert sorted((p["run"], p["i"]) for p in got if isinstance(p, dict)) == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    s = q.stats("a", exact=True)[0]
    assert (s.ready, s.in_flight) == (0, 0)
    q.close()


@pytest.mark.parametrize("prefetch", ["true", "false"])
def test_a_batch_leased_ahead_is_taken_over_by_the_restarted_query(
        spark, any_url: str, tmp_path: Path, prefetch: str) -> None:
    """With prefetch (the default) the next batch is leased while Spark runs the current
    one. A query stopped with that batch leased is restarted on its checkpoint: it takes the
    batch over at once (leaseSeconds is an hour) and every message arrives exactly once."""
    q = tableq.connect(any_url, migrate=True)
    q.send_many("ahead", [{"i": i} for i in range(100)])

    def run(**trigger: Any) -> Any:  # type: ignore[no-untyped-def]
        return (spark.readStream.format("tableq").option("url", any_url)
                .option("topic", "ahead").option("maxRows", "10")
                .option("leaseSeconds", "3600").option("prefetch", prefetch).load()
                .select("payload", "key").writeStream.format("tableq")
                .option("url", any_url).option("topic", "out").option("payloadFormat", "json")
                .option("sinkName", "ahead").option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(**trigger).start())

    query = run(processingTime="10 minutes")  # one batch now, then a pause
    try:
        wait_until(lambda: q.stats("out")[0].ready == 10, timeout=120)
        leased = 20 if prefetch == "true" else 10  # the batch run (acked by the next) + ahead
        wait_until(lambda: q.stats("ahead")[0].in_flight == leased, timeout=30)
    finally:
        query.stop()
    again = run(availableNow=True)
    again.awaitTermination(timeout=120)
    assert not again.isActive, "the restarted query did not drain"
    assert sorted(m.payload["i"] for m in q.peek("out", limit=1000)) == list(range(100))
    s = q.stats("ahead")[0]
    assert (s.ready, s.in_flight) == (0, 0), s
    q.close()


def test_a_restart_gives_back_the_batch_leased_ahead_of_an_unlogged_one(any_url: str) -> None:
    """The driver side alone, deterministic: a reader leases batch 1 and, ahead, batch 2,
    then dies before Spark logged batch 1. The restarted reader (AvailableNow, from offset
    0) takes batch 1 over, gives batch 2 back (counting it in its budget) and drains the
    topic: every message in exactly one batch, nothing left leased."""
    from pyspark.sql.streaming.datasource import ReadMaxRows
    from pyspark.sql.types import StructType

    from tableq.spark.options import StreamOptions
    from tableq.spark.source import TableqStreamReader, _token

    q = tableq.connect(any_url, migrate=True)
    sent = [m.id for m in q.send_many("ga", list(range(30)))]
    opts = StreamOptions.parse({"url": any_url, "topic": "ga", "maxRows": "10"})
    dead = TableqStreamReader(opts, StructType())
    start = dead.initialOffset()
    lost = dead.latestOffset(start, ReadMaxRows(10))
    assert dead._ahead is not None
    dead._ahead.future.result()
    assert q.stats("ga")[0].in_flight == 20  # batch 1 and the batch ahead; then it dies

    reader = TableqStreamReader(opts, StructType())
    reader.prepareForTriggerAvailableNow()  # 10 ready
    batches: list[list[int]] = []
    offset = start
    while True:
        end = reader.latestOffset(offset, ReadMaxRows(10))
        if end == offset:
            break
        lease = _token(end["epoch"], end["seq"])
        batches.append([m.id for m in Bulk(q).leased_messages("ga", lease,
                                                               ids=(end["lo"], end["hi"]))])
        offset = end
    reader.stop()
    assert (batches[0][0], batches[0][-1]) == (lost["lo"], lost["hi"])  # taken over
    assert sorted(i for b in batches for i in b) == sorted(sent)
    s = q.stats("ga")[0]
    assert (s.ready, s.in_flight) == (0, 0), s
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
    with pytest.raises((AnalysisException, PySparkException), match="'prefetch': must be"):
        spark.readStream.format("tableq").option("url", url).option("topic", "a") \
            .option("prefetch", "sometimes").load()


def _child(url: str, checkpoint: Path, log: Path, fault: str = "") -> subprocess.Popen[bytes]:
    """A Spark driver running a -> b until it is killed (or dies at its fault point)."""
    fault_file = log.with_name("child-fault")
    fault_file.write_text(fault)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "_stream_child.py"), url, str(checkpoint), "run",
             str(BATCH)],
            stdout=out, stderr=subprocess.STDOUT, env={**child_env(), **hook_env(fault_file)},
            start_new_session=True)


def _restart_and_drain(spark, url: str, checkpoint: Path) -> None:  # type: ignore[no-untyped-def]
    """The same query as _stream_child.py, restarted on the checkpoint here, AvailableNow."""
    src = (spark.readStream.format("tableq").option("url", url).option("topic", "a")
           .option("maxRows", str(BATCH)).option("numPartitions", "2").load())
    query = (src.select("payload", "key").writeStream.format("tableq")
             .option("url", url).option("topic", "b").option("payloadFormat", "json")
             .option("sinkName", "a-to-b").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive, "the restarted query did not drain within 240 s"


def _check_exactly_once(q: tableq.Queue, n: int, what: str) -> None:
    got = [m.payload["i"] for m in q.peek("b", limit=10_000)]
    counts: dict[int, int] = {}
    for i in got:
        counts[i] = counts.get(i, 0) + 1
    lost = sorted(set(range(n)) - set(counts))
    dup = sum(c - 1 for c in counts.values())
    line = f"{what}: {len(lost)} lost / {dup} dup of N={n} in topic b"
    print("\n" + line)
    assert not lost and not dup, f"{line}; lost {lost[:10]}"
    a = q.stats("a")[0]
    assert (a.ready, a.in_flight, a.scheduled) == (0, 0, 0), a


def _seeded(name: str) -> random.Random:
    """A random source whose seed is printed (and can be set with TABLEQ_SPARK_SEED)."""
    seed = int(os.environ.get("TABLEQ_SPARK_SEED") or random.randrange(10**6))
    print(f"\n{name}: seed {seed} (TABLEQ_SPARK_SEED={seed} reruns it)")
    return random.Random(seed)


def _last_batch(checkpoint: Path, log: str = "offsets") -> int:
    """The highest batch id in Spark's offset (or commit) log, -1 before any."""
    names = [p.name for p in (checkpoint / log).glob("[0-9]*")]
    return max((int(n) for n in names if n.isdigit()), default=-1)


def _dies(child: subprocess.Popen[bytes], log: Path, fault: str) -> None:
    """Waits for a driver to die at its fault point (failing if it never gets there)."""
    try:
        code = child.wait(timeout=180)
    except subprocess.TimeoutExpired:
        kill_driver(child)
        raise AssertionError(f"{fault}: the driver never reached its fault point") from None
    assert code != 0, f"{fault}: the driver exited cleanly\n" + log.read_text()[-3000:]
    fired = log.with_name("child-fault.fired")  # written by _faults.hook as it strikes
    assert fired.exists(), f"{fault}: the driver died elsewhere\n" + log.read_text()[-3000:]
    fired.unlink()


@pytest.mark.slow
def test_killed_at_random_points_and_restarted_is_exactly_once(spark, any_url: str,
                                                               tmp_path: Path) -> None:
    """One query, four deaths, one checkpoint, then a restart that drains:
    1. kill -9 of the whole driver at a random moment (after a random number of published
       rows plus a random fraction of a batch, so it lands anywhere in planning, reading,
       staging or publishing);
    2. the restarted driver dies right after leasing a new batch, before Spark logged its
       offset: the next restart must take those leases over at once (leaseSeconds is 300,
       so waiting for them would fail the drain);
    3. the restarted driver dies right after leasing a batch ahead (option prefetch, on by
       default) while Spark runs the batch before it;
    4. the restarted driver dies right after the sink published a batch, before Spark
       logged its commit: the replay must publish nothing twice (the sink's job ledger).
    Then topic b holds every message of topic a exactly once."""
    url, n = any_url, N_STREAM
    rng = _seeded("random kills")
    q = tableq.connect(url, migrate=True)
    q.send_many("a", [{"i": i} for i in range(n)])
    ck, log = tmp_path / "ck", tmp_path / "child.log"
    after_rows, extra_s = rng.randint(1, 3 * BATCH), rng.uniform(0.0, 1.5)
    child = _child(url, ck, log)
    try:
        wait_until(lambda: q.stats("b")[0].ready >= after_rows or child.poll() is not None,
                   timeout=180, interval=0.05)
        assert child.poll() is None, log.read_text()[-3000:]
        # The fault's random timing, cut short while topic a still holds enough for the two
        # deaths that follow (each needs a batch that really comes: at most one more batch is
        # published before the kill lands, and at most one is leased and unpublished).
        until = time.monotonic() + extra_s
        while time.monotonic() < until and q.stats("b")[0].ready < n - 8 * BATCH:
            time.sleep(0.02)
    finally:
        kill_driver(child)
    moved = q.stats("b")[0].ready
    # Batch id B is leased under sequence B + 1 of the checkpoint's epoch. After the last
    # logged batch L (replayed if it was not committed, which leases nothing), the next fresh
    # lease is sequence L + 2: die there or one batch later.
    claim = f"exit-after-claim:{_last_batch(ck) + 1 + rng.randint(1, 2)}"
    # The fault (_faults.py) ends the Python process that runs the source, so the query fails
    # at that point as if its driver had died: nothing after it reaches Spark's logs.
    _dies(_child(url, ck, log, fault=claim), log, claim)
    orphaned = q.stats("a")[0].in_flight
    assert orphaned == BATCH, "the death should leave exactly the orphaned batch leased"
    # Restarted, it takes those leases over, and dies right after leasing a batch ahead (the
    # second or third it leases), while Spark runs the one before: the next restart must take
    # the batch ahead over or give it back at once, not wait for leaseSeconds.
    ahead = f"exit-after-prefetch:{_last_batch(ck) + 3 + rng.randint(0, 1)}"
    _dies(_child(url, ck, log, fault=ahead), log, ahead)
    a = q.stats("a")[0]
    assert a.in_flight == 2 * BATCH, f"{ahead}: expected a batch run and a batch ahead, {a}"
    # The next batch always exists (the orphaned leases are taken over); one batch later only
    # if topic a still holds two batches' worth, else the driver would never get there.
    a = q.stats("a")[0]
    later = rng.randint(0, 1) if a.ready + a.in_flight >= 2 * BATCH else 0
    publish_batch = _last_batch(ck, "commits") + 1 + later
    publish = f"exit-after-publish:{publish_batch}"
    _dies(_child(url, ck, log, fault=publish), log, publish)
    query_id = json.loads((ck / "metadata").read_text())["id"]  # kept across restarts
    assert Bulk(q).staged_job_state(f"a-to-b:{query_id}:{publish_batch}") == "committed"
    # Spark never logged that batch's commit, so the restart replays it (publishing nothing
    # twice), even when it was the last batch and topic b already holds every row.
    assert _last_batch(ck, "commits") < publish_batch, "Spark logged the commit: no replay"
    _restart_and_drain(spark, url, ck)
    _check_exactly_once(q, n, f"kill -9 after {moved} rows (+ up to {extra_s:.2f} s), then "
                              f"{claim} ({orphaned} left leased), then {ahead}, then {publish}")
    q.close()


@pytest.mark.slow
def test_restarted_after_the_database_server_crashed(spark, crash_server,
                                                      tmp_path: Path) -> None:
    """The server under a running query is crashed (PostgreSQL: immediate stop, no shutdown
    checkpoint; MariaDB: kill -9) at a random point; the query dies with it (or is killed if
    it is still waiting); the server comes back with crash recovery; the query restarted on
    its checkpoint loses and duplicates nothing. (SQLite has no server: the kill test above
    covers its restart.)"""
    url, n = crash_server.url("tq_" + uuid.uuid4().hex[:8]), N_STREAM
    rng = _seeded("server crash")
    q = tableq.connect(url, migrate=True)
    q.send_many("a", [{"i": i} for i in range(n)])
    ck, log = tmp_path / "ck", tmp_path / "child.log"
    after_rows = rng.randint(1, n - 3 * BATCH)
    child = _child(url, ck, log)
    try:
        wait_until(lambda: q.stats("b")[0].ready >= after_rows or child.poll() is not None,
                   timeout=180, interval=0.05)
        assert child.poll() is None, log.read_text()[-3000:]
        crash_server.crash()
        try:  # a driver that lost its database fails its query; one still retrying is killed
            ended = f"the driver exited with {child.wait(timeout=30)}"
        except subprocess.TimeoutExpired:
            ended = "the driver was still running after 30 s and was killed"
    finally:
        kill_driver(child)
        if not crash_server.is_running():
            crash_server.restart()
    moved = q.stats("b")[0].ready
    assert moved < n, "the query finished before the crash: nothing was tested"
    _restart_and_drain(spark, url, ck)
    _check_exactly_once(q, n, f"{crash_server.dialect} crashed after {moved} rows ({ended})")
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


