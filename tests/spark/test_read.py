"""Batch reads through spark.read.format("tableq"): live snapshot, dead letters and the archive
of done messages, partitioned by id range, with id and topic filters pushed down."""

from __future__ import annotations

import json

from pyspark.sql import functions as F

import tableq


def _read(spark, url: str, **options: str):  # type: ignore[no-untyped-def]
    r = spark.read.format("tableq").option("url", url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_write_then_read_round_trip(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True)
    df = spark.createDataFrame(
        [(i, f"k{i}", {"h": str(i)}, i % 3) for i in range(50)],
        "n long, key string, headers map<string,string>, priority int",
    ).select(F.struct("n").alias("payload"), "key", "headers", "priority")
    df.write.format("tableq").option("url", url).option("topic", "rt").mode("append").save()
    q.send("rt", b"\x01raw")
    got = _read(spark, url, topic="rt").orderBy("id").collect()
    assert len(got) == 51
    # Two write tasks: rows keep their order within a task, tasks publish in staging order.
    by_n = sorted(got[:50], key=lambda r: json.loads(r.payload)["n"])
    assert [json.loads(r.payload)["n"] for r in by_n] == list(range(50))
    assert [(r.key, r.headers, r.priority) for r in by_n[:3]] == [
        ("k0", {"h": "0"}, 0), ("k1", {"h": "1"}, 1), ("k2", {"h": "2"}, 2)]
    assert (got[50].payload, got[50].payload_bytes) == (None, b"\x01raw")
    assert all(r.topic == "rt" and r.attempts == 0 and r.lease is None for r in got)
    ids = [r.id for r in got]
    mid = ids[10]
    assert _read(spark, url, topic="rt").where(F.col("id") > mid).count() == 40
    q.close()


def test_dead_and_archive_sources(spark, url: str) -> None:
    q = tableq.connect(url, migrate=True, retention=True)
    q.send_many("a", [{"i": i} for i in range(30)])
    q.send_many("b", [{"i": i} for i in range(5)])
    for m in q.receive("a", max=30):
        if m.payload["i"] % 3 == 0:
            q.dead_letter(m, f"bad {m.payload['i']}")
        else:
            q.ack(m)
    for m in q.receive("b", max=5):
        q.ack(m)
    dead = _read(spark, url, source="dead", numPartitions="3")
    assert dead.rdd.getNumPartitions() == 3
    rows = dead.orderBy("id").collect()
    assert [json.loads(r.payload)["i"] for r in rows] == list(range(0, 30, 3))
    assert rows[0].error == "bad 0" and rows[0].dead_at is not None
    done = _read(spark, url, source="archive")
    assert done.count() == 25
    assert done.where("topic = 'b'").count() == 5
    assert _read(spark, url, source="archive", topic="a").count() == 20
    per = {r.topic: r["count"] for r in done.groupBy("topic").count().collect()}
    assert per == {"a": 20, "b": 5}
    ids = sorted(r.id for r in done.select("id").collect())
    assert done.where(F.col("id") <= ids[4]).count() == 5
    assert done.count() == 25  # the same DataFrame, unfiltered again
    assert _read(spark, url, source="archive", lowerId=str(ids[1]),
                 upperId=str(ids[3])).count() == 3
    assert set(done.columns) >= {"received_at", "done_at", "attempts", "first_available_at"}
    q.close()


def test_empty_sources(spark, url: str) -> None:
    tableq.connect(url, migrate=True).close()
    assert _read(spark, url, source="dead").count() == 0
    assert _read(spark, url, topic="nothing").count() == 0


def test_live_snapshot_is_partitioned_and_leases_nothing(spark, any_url: str) -> None:
    q = tableq.connect(any_url, migrate=True)
    q.send_many("big", [{"i": i} for i in range(25_000)])
    held = q.receive("big", max=3, visibility_timeout=600)
    df = _read(spark, any_url, topic="big", numPartitions="3")
    assert df.rdd.getNumPartitions() == 3
    assert df.count() == 25_000 and df.select("id").distinct().count() == 25_000
    leased = df.where("attempts = 1").collect()
    assert sorted(r.id for r in leased) == sorted(m.id for m in held)
    assert all(r.lease is None and r.received_at is not None for r in leased)
    s = q.stats("big")[0]
    assert (s.ready, s.in_flight) == (24_997, 3)  # reading leased nothing
    q.close()
