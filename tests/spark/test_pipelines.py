"""The pipelines: requeue routes and sorts, archive survives a crash between its write and its
purge, report matches a hand-computed case, load reads CSV, JSON lines and Parquet."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import tableq
from tableq.spark.pipelines.archive import archive
from tableq.spark.pipelines.load import load_file, load_jobs
from tableq.spark.pipelines.report import compute, report
from tableq.spark.pipelines.requeue import requeue

from ._faults import injected


def test_requeue_routes_and_sorts(spark, any_url: str, tmp_path: Path) -> None:
    url = any_url
    q = tableq.connect(url, migrate=True)
    items = [{"payload": {"region": "eu" if i % 3 else "us", "rank": (i * 7) % 20},
              "key": f"k{i}"} for i in range(20)]
    q.send_many("in", items)
    q.send("in", b"\x00bytes")  # routed to the default branch, bytes kept
    result = requeue(spark, url, "in", checkpoint=str(tmp_path / "ck"), block_rows=100,
                     route="CASE get_json_object(payload, '$.region') WHEN 'eu' THEN 'eu' "
                           "WHEN 'us' THEN 'us' ELSE 'other' END",
                     order_by=["CAST(get_json_object(payload, '$.rank') AS INT) DESC"])
    assert result.rows == 21
    eu, us = q.peek("eu", limit=100), q.peek("us", limit=100)
    assert {m.payload["region"] for m in eu} == {"eu"} and len(eu) == 13
    assert {m.payload["region"] for m in us} == {"us"} and len(us) == 7
    for got in (eu, us):  # delivery order is the sorted order of the block
        ranks = [m.payload["rank"] for m in got]
        assert ranks == sorted(ranks, reverse=True)
    assert sorted(m.key for m in eu + us) == sorted(f"k{i}" for i in range(20))
    assert [m.payload for m in q.peek("other")] == [b"\x00bytes"]
    s = q.stats("in")[0]
    assert (s.ready, s.in_flight) == (0, 0)
    q.close()


def test_requeue_moves_keyed_messages_and_each_checkpoint_is_its_own_run(
        spark, any_url: str, tmp_path: Path) -> None:
    """Found by review, each lost messages: a second requeue with a new checkpoint reused the
    first run's job ids ('requeue:<topic>:<batch>'), so its blocks were skipped as replays and
    acked unpublished; a keyed message routed back to its own topic, or into a topic where
    its key was live, was dropped as a duplicate and acked. Now a run's jobs carry its query
    id, and a moved message replaces the live one with its key."""
    q = tableq.connect(any_url, migrate=True)
    q.send_many("in", [{"payload": {"run": 1, "i": i}, "key": f"r1-{i}"} for i in range(3)])
    q.send("out", {"old": True}, key="r1-0")  # live in the target: the moved one replaces it
    first = requeue(spark, any_url, "in", route="'out'", checkpoint=str(tmp_path / "ck1"))
    q.send_many("in", [{"run": 2, "i": i} for i in range(3)])
    second = requeue(spark, any_url, "in", route="'out'", checkpoint=str(tmp_path / "ck2"))
    assert (first.rows, second.rows) == (3, 3)
    out = q.peek("out", limit=100)
    assert sorted((m.payload["run"], m.payload["i"]) for m in out) == [
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert sorted(m.key for m in out if m.key) == ["r1-0", "r1-1", "r1-2"]

    # Routed back to its own topic (a re-sort): the keyed ones stay, nothing is lost.
    q.send_many("same", [{"payload": {"n": n}, "key": f"s{n}"} for n in range(3)])
    q.send_many("same", [{"n": 3}, {"n": 4}])
    moved = requeue(spark, any_url, "same", route="'same'", order_by=["id DESC"],
                    checkpoint=str(tmp_path / "ck3"))
    assert moved.rows == 5
    left = q.peek("same", limit=100)
    assert sorted(m.payload["n"] for m in left) == [0, 1, 2, 3, 4]
    assert sorted(m.key for m in left if m.key) == ["s0", "s1", "s2"]
    s = q.stats("same", exact=True)[0]
    assert (s.ready, s.in_flight, s.dead) == (5, 0, 0)
    q.close()


def _history(url: str) -> tableq.Queue:
    q = tableq.connect(url, migrate=True, retention=True)
    q.send_many("a", [{"i": i} for i in range(40)])
    q.send_many("b", [{"i": i} for i in range(10)])
    for topic in ("a", "b"):
        for m in q.receive(topic, max=100):
            if m.payload["i"] % 4 == 0:
                q.dead_letter(m, "boom")
            else:
                q.ack(m)
    return q


def test_archive_is_idempotent_after_a_crash_between_write_and_purge(
        spark, any_url: str, tmp_path: Path) -> None:
    url = any_url
    q = _history(url)
    out = str(tmp_path / "archive")
    before = {s.topic: (s.done, s.dead) for s in q.stats()}
    assert before == {"a": (30, 10), "b": (7, 3)}
    with pytest.raises(RuntimeError, match="crash injected after writing done"), \
            injected("archive-crash-after-write"):
        archive(spark, url, out, older_than=0)
    # Crashed after the done rows were written, before they were purged.
    assert {s.topic: (s.done, s.dead) for s in q.stats()} == before
    q.send("a", {"i": "new"})
    for m in q.receive("a"):
        q.ack(m)  # done after the first run's cut-off: must stay for a later run
    res = archive(spark, url, out, older_than=0)
    assert res.resumed and res.written == {"done": 37, "dead": 13}
    assert res.purged == {"done": 37, "dead": 13}
    after = {s.topic: (s.done, s.dead) for s in q.stats()}
    assert after == {"a": (1, 0)}  # b has no rows left anywhere
    done = spark.read.parquet(f"{out}/done")
    dead = spark.read.parquet(f"{out}/dead")
    assert done.count() == 37 and done.select("id").distinct().count() == 37
    assert dead.count() == 13 and dead.select("id").distinct().count() == 13
    assert {r.topic: r["count"] for r in done.groupBy("topic").count().collect()} == {
        "a": 30, "b": 7}
    assert set(done.columns) >= {"topic", "date", "run", "payload", "done_at"}
    assert Path(out, "done", "topic=a").is_dir()
    # A third run archives only the new row, and a rerun with nothing pending is harmless.
    res3 = archive(spark, url, out, older_than=0)
    assert not res3.resumed and res3.written == {"done": 1, "dead": 0}
    assert spark.read.parquet(f"{out}/done").count() == 38
    assert archive(spark, url, out, older_than=0).written == {"done": 0, "dead": 0}
    q.close()


def test_archive_runs_one_at_a_time_and_resumes_past_a_manifest_cut_short(
        spark, url: str, tmp_path: Path) -> None:
    """Found by review: two runs at once lost rows (each overwrote the other's partitions
    with what was not purged yet) or archived them twice; a crash while the manifest was
    rewritten left none, and the rerun archived everything again. A run holds a lease-backed
    lock; manifests are numbered files, each whole or ignored."""
    from tableq.errors import ArchiveBusy
    from tableq.spark.pipelines.archive import LOCK_TOPIC, RunLock

    q = _history(url)
    out = str(tmp_path / "archive")
    with RunLock(q):  # another run is working
        with pytest.raises(ArchiveBusy, match="another archive run"):
            archive(spark, url, out, older_than=0)
    assert not Path(out).exists()
    with pytest.raises(RuntimeError, match="crash injected"), \
            injected("archive-crash-after-write"):
        archive(spark, url, out, older_than=0)
    folder = Path(out, "_tableq_archive")
    last = max(folder.glob("manifest-*.json"))
    number = int(last.stem.split("-")[1]) + 1
    (folder / f"manifest-{number:08d}.json").write_text('{"run": "cut sh')  # a torn write
    res = archive(spark, url, out, older_than=0)
    assert res.resumed and res.written == {"done": 37, "dead": 13}
    done = spark.read.parquet(f"{out}/done")
    assert done.count() == 37 and done.select("id").distinct().count() == 37
    kept = [p.name for p in folder.iterdir() if p.name.startswith("manifest")]
    assert len(kept) == 1 and kept[0] > f"manifest-{number:08d}.json"  # the finished one
    assert LOCK_TOPIC not in q.topics() + [s.topic for s in q.stats()]
    q.close()


def test_report_reads_archived_topics_as_text_and_counts_rows_once(
        spark, url: str, tmp_path: Path) -> None:
    """Topics "007" and "7" were both read back as the number 7 from the archive's
    partition names, and rows of a run written but not purged were counted twice."""
    q = tableq.connect(url, migrate=True, retention=True)
    for topic in ("007", "7", "007", "7", "007", "7"):
        q.send(topic, 1)
        q.ack(q.receive(topic)[0])
    out = str(tmp_path / "archive")
    archive(spark, url, out, older_than=0)
    q.send("007", 2)
    q.ack(q.receive("007")[0])
    with pytest.raises(RuntimeError, match="crash injected"), \
            injected("archive-crash-after-write"):
        archive(spark, url, out, older_than=0)  # "007"'s new row: written, not purged
    rep = report(spark, url, archive_path=out, html_path=None)
    counts = {r["topic"]: int(r["done"]) for r in rep.summary.to_dict("records")}
    assert counts == {"007": 4, "7": 3}
    # A dead letter archived, then requeued and dead again before the purge: the purge
    # keeps its second death (after the cut-off), and the report counts both deaths.
    q.send("twice", 1)
    q.dead_letter(q.receive("twice")[0], "first death")
    dead_out = str(tmp_path / "dead-archive")
    with pytest.raises(RuntimeError, match="crash injected"), \
            injected("archive-crash-after-write"):
        archive(spark, url, dead_out, older_than=0, sources=("dead",))
    q.requeue_dead("twice")
    q.dead_letter(q.receive("twice")[0], "second death")
    assert archive(spark, url, dead_out, older_than=0, sources=("dead",)).purged == {"dead": 0}
    assert [d.error for d in q.dead_letters("twice")] == ["second death"]
    rep = report(spark, url, archive_path=dead_out, html_path=None, topic="twice")
    assert [int(r["dead"]) for r in rep.summary.to_dict("records")] == [2]
    q.close()


def _t(s: float) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s)


def test_report_matches_a_hand_computed_case(spark, tmp_path: Path) -> None:
    done = spark.createDataFrame(
        [("t", 1, _t(0), _t(1), _t(3)), ("t", 2, _t(0), _t(4), _t(5)),
         ("t", 1, _t(10), _t(10), _t(14)), ("u", 1, _t(0), _t(0.5), _t(60.5))],
        "topic string, attempts int, first_available_at timestamp, received_at timestamp, "
        "done_at timestamp")
    dead = spark.createDataFrame([("t", 3)], "topic string, attempts int")
    rep = compute(done, dead, bucket="10 seconds")
    t = rep.summary.set_index("topic").loc["t"]
    assert (t.done, t.dead) == (3, 1)
    # wait = [1, 4, 0] and work = [2, 1, 4]; linear interpolation between order statistics.
    assert t.wait_p50_s == pytest.approx(1.0) and t.wait_p90_s == pytest.approx(3.4)
    assert t.work_p50_s == pytest.approx(2.0) and t.work_p90_s == pytest.approx(3.6)
    assert t.wait_p99_s == pytest.approx(3.94)
    assert t.failure_rate == pytest.approx(0.5)  # one retried done + one dead, of four
    assert t.dead_rate == pytest.approx(0.25)
    assert t.rate_per_s == pytest.approx(3 / 11)  # done_at from 3 s to 14 s
    u = rep.summary.set_index("topic").loc["u"]
    assert (u.done, u.dead, u.failure_rate, u.work_p50_s) == (1, 0, 0.0, 60.0)
    attempts = {(r.topic, r.attempts): r.messages for r in rep.attempts.itertuples()}
    assert attempts == {("t", 1): 2, ("t", 2): 1, ("t", 3): 1, ("u", 1): 1}
    tp = {(r.topic, r.bucket.to_pydatetime().replace(tzinfo=UTC)): r.done
          for r in rep.throughput.itertuples()}
    assert tp == {("t", _t(0)): 2, ("t", _t(10)): 1, ("u", _t(60)): 1}
    text = rep.table()
    assert "0.250" in text and "3.400" in text


def test_report_from_a_queue_writes_html(spark, url: str, tmp_path: Path) -> None:
    q = _history(url)
    rep = report(spark, url, html_path=str(tmp_path / "r.html"))
    s = rep.summary.set_index("topic")
    assert (s.loc["a"].done, s.loc["a"].dead, s.loc["b"].dead_rate) == (30, 10, 0.3)
    page = (tmp_path / "r.html").read_text()
    # One look with the dashboard: figures, real tables, the top errors, SVG charts (one
    # per scale, so wait seconds and work milliseconds each have their own axis).
    assert "<table class=\"data\"" in page and "Top dead-letter errors" in page
    assert page.count("<svg class=\"plot\"") == 4 and "plotly" not in page
    assert "Wait: available to received" in page and "Work: received to acked" in page
    assert (rep.errors is not None and int(rep.errors["messages"].sum())
            == int(rep.summary["dead"].sum()))
    assert "<script" not in page  # self-contained and inert
    q.close()


def test_load_files(spark, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/load.db"
    q = tableq.connect(url, migrate=True)
    (tmp_path / "jobs.csv").write_text("id,name,score\n1,ann,3.5\n2,bob,4\n")
    (tmp_path / "jobs.jsonl").write_text(
        "\n".join(json.dumps({"payload": {"x": i}, "key": f"j{i}", "priority": i})
                  for i in range(3)) + "\n")
    spark.createDataFrame([(i, f"p{i}") for i in range(5)], "id long, v string") \
        .write.parquet(str(tmp_path / "jobs.parquet"))
    seen: list[tuple[int, int]] = []
    r = load_file(spark, url, "csv", str(tmp_path / "jobs.csv"), key="id",
                  on_progress=lambda d, t: seen.append((d, t)))
    assert r.rows == 2
    assert sorted((m.key, m.payload["name"], m.payload["score"]) for m in q.peek("csv")) == [
        ("1", "ann", 3.5), ("2", "bob", 4.0)]
    load_file(spark, url, "jl", str(tmp_path / "jobs.jsonl"))
    assert [(m.key, m.priority, m.payload) for m in q.peek("jl")] == [
        ("j2", 2, {"x": 2}), ("j1", 1, {"x": 1}), ("j0", 0, {"x": 0})]
    assert load_file(spark, url, "pq", str(tmp_path / "jobs.parquet")).rows == 5
    assert sorted(m.payload["v"] for m in q.peek("pq")) == [f"p{i}" for i in range(5)]
    assert load_jobs(spark, url, "demo", 1000, poison_every=500).rows == 1000
    demo = q.peek("demo", limit=1000)
    assert len(demo) == 1000 and sum(m.payload["poison"] for m in demo) == 2
    q.close()


def test_load_keeps_keys_and_payloads_as_written(spark, tmp_path: Path) -> None:
    """Found by review: a CSV's key column was inferred as a number, so keys "007" and "7"
    became one and a message was dropped as a duplicate; JSON lines went through one inferred
    schema, which added nulls for missing fields and made 1 into 1.0 (and objects into JSON
    strings beside a string payload); key= was ignored beside a `payload` column, and a
    `topic` column sent rows elsewhere than the topic given."""
    url = f"sqlite:///{tmp_path}/keys.db"
    q = tableq.connect(url, migrate=True)
    (tmp_path / "k.csv").write_text("id,zip,amount\n007,01234,1\n7,99999,2\n0042,00501,3\n")
    load_file(spark, url, "csv", str(tmp_path / "k.csv"), key="id")
    assert sorted(m.key for m in q.peek("csv")) == ["0042", "007", "7"]
    load_file(spark, url, "text", str(tmp_path / "k.csv"), key="id", infer_types=False)
    assert sorted(m.payload["zip"] for m in q.peek("text")) == ["00501", "01234", "99999"]

    (tmp_path / "own.csv").write_text("payload,key\nalpha,007\nbeta,7\n")  # its own key
    load_file(spark, url, "own", str(tmp_path / "own.csv"))
    assert sorted((m.key, m.payload) for m in q.peek("own")) == [("007", "alpha"),
                                                                  ("7", "beta")]

    lines = [{"payload": {"a": 1}, "order": "o1"}, {"payload": {"b": "x"}, "order": "o2"},
             {"payload": {"a": 2.5}}, {"payload": "just text", "priority": 3}, [1, 2],
             {"c": 1}]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    load_file(spark, url, "jl", str(tmp_path / "l.jsonl"), key="order")
    got = {json.dumps(m.payload): (m.key, m.priority) for m in q.peek("jl", limit=10)}
    assert got == {'{"a": 1}': ("o1", 0), '{"b": "x"}': ("o2", 0), '{"a": 2.5}': (None, 0),
                   '"just text"': (None, 3), "[1, 2]": (None, 0), '{"c": 1}': (None, 0)}

    pq = str(tmp_path / "p.parquet")
    spark.createDataFrame([('{"v": 1}', "o9", "elsewhere")],
                          "payload string, order_id string, topic string").write.parquet(pq)
    with pytest.raises(tableq.InvalidArgument, match="topic"):
        load_file(spark, url, "pq", pq, key="order_id", payload_format="json")
    spark.read.parquet(pq).drop("topic").write.parquet(pq.replace("p.", "p2."))
    load_file(spark, url, "pq", pq.replace("p.", "p2."), key="order_id", payload_format="json")
    assert [(m.key, m.payload) for m in q.peek("pq")] == [("o9", {"v": 1})]
    q.close()


def test_demo_steps_compose(spark, tmp_path: Path) -> None:
    """The demo's story (tableq.demo) through the pipelines: load, handle, archive, report."""
    url = f"sqlite:///{tmp_path}/demo.db"
    q = tableq.connect(url, migrate=True, retention=True, max_attempts=3)
    assert load_jobs(spark, url, "jobs", 2000, poison_every=500).rows == 2000
    while batch := q.receive("jobs", max=500, visibility_timeout=0):
        for m in batch:
            if m.payload["poison"] or m.attempts <= m.payload["fail_times"]:
                q.nack(m, error="handler failed")
            else:
                q.ack(m)
    s = q.stats("jobs")[0]
    assert (s.ready, s.done, s.dead) == (0, 1996, 4)
    res = archive(spark, url, str(tmp_path / "arch"), older_than=0.0)
    assert res.written == {"done": 1996, "dead": 4} == res.purged
    rep = report(spark, url, html_path=str(tmp_path / "r.html"),
                 archive_path=str(tmp_path / "arch"), bucket="10 seconds")
    row = rep.summary.set_index("topic").loc["jobs"]
    assert (row.done, row.dead) == (1996, 4)
    # 200 jobs failed once (fail_every=10) and 4 are poison: (200 - poison among them + 4)
    retried = sum(1 for i in range(2000) if i % 10 == 9 and i % 500 != 499)
    assert row.failure_rate == pytest.approx((retried + 4) / 2000)
    q.close()
