"""The `tableq` command end to end, in a subprocess, on every backend: migrate, send (one and
bulk from stdin), stats, peek, receive, dead list/requeue/purge, purge, worker --burst, and
errors as one line without a traceback (unless --debug)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tableq
from tableq.testing import wait_until

APPS_DIR = Path(__file__).resolve().parents[1] / "worker" / "apps"
SRC_DIR = Path(__file__).resolve().parents[2] / "src"


def tq(url: str | None, *args: str, stdin: str | None = None, env: dict | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    full_env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR)])
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "tableq.cli", *(["--url", url] if url else []), *args]
    return subprocess.run(cmd, input=stdin, check=False, capture_output=True, text=True,
                          timeout=120, env=full_env, cwd=str(cwd) if cwd else None)


def jl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_send_stats_peek_receive_purge(db_url):
    r = tq(db_url, "migrate")
    assert r.returncode == 0 and "applied migrations" in r.stdout, r.stderr
    assert "up to date" in tq(db_url, "migrate").stdout

    r = tq(db_url, "send", "emails", '{"to": "a@example.com"}', "--key", "k1", "--priority", "5")
    assert r.returncode == 0 and r.stdout.startswith("sent id="), r.stderr
    r = tq(db_url, "send", "emails", '{"to": "other"}', "--key", "k1")
    assert r.stdout.startswith("duplicate id=")

    lines = "\n".join(json.dumps({"n": i}) for i in range(2500)) + "\n"
    lines += json.dumps({"payload": {"n": "keyed"}, "key": "bulk-1"}) + "\n"
    r = tq(db_url, "send", "emails", "-", stdin=lines)
    assert r.returncode == 0, r.stderr
    assert "sent 2501 messages to emails: 2501 new" in r.stdout

    r = tq(db_url, "send", "emails", "-", stdin='{"n": 1}\n{"n": 2}\nnot json\n')
    assert r.returncode == 1 and "line 3 of stdin is not JSON" in r.stderr
    assert "Traceback" not in r.stderr

    r = tq(db_url, "send", "later", '"x"', "--delay", "3600")
    assert r.returncode == 0

    stats = {s["topic"]: s for s in jl(tq(db_url, "stats", "--json").stdout)}
    assert stats["emails"]["ready"] == 2502 and stats["later"]["scheduled"] == 1
    exact = {s["topic"]: s for s in jl(tq(db_url, "stats", "--exact", "--json").stdout)}
    assert exact["emails"]["ready"] == 2502 and exact["emails"]["estimated"] is False
    assert "emails" in tq(db_url, "stats").stdout  # the rich table

    peeked = jl(tq(db_url, "peek", "emails", "--limit", "2", "--json").stdout)
    assert peeked[0]["payload"] == {"to": "a@example.com"} and peeked[0]["priority"] == 5
    assert len(peeked) == 2

    got = jl(tq(db_url, "receive", "emails", "--max", "3", "--ack", "--json").stdout)
    assert len(got) == 3 and got[0]["key"] == "k1"
    got = jl(tq(db_url, "receive", "emails", "--max", "2", "--json").stdout)
    assert len(got) == 2 and all(m["lease"] for m in got)
    stats = {s["topic"]: s for s in jl(tq(db_url, "stats", "--json").stdout)}
    assert stats["emails"]["ready"] == 2497 and stats["emails"]["in_flight"] == 2

    r = tq(db_url, "purge", "emails")
    assert r.returncode == 2 and "add --yes" in r.stderr  # no prompt without a terminal
    r = tq(db_url, "purge", "emails", "--yes")
    assert r.returncode == 0 and "purged 2499" in r.stdout


def test_dead_letters_list_requeue_purge(db_url):
    with tableq.connect(db_url, migrate=True, max_attempts=1) as q:
        ids = [q.send("jobs", {"n": i}).id for i in range(3)]
        for m in q.receive("jobs", max=3):
            q.dead_letter(m, f"broken {m.payload['n']}")
    listed = jl(tq(db_url, "dead", "list", "jobs", "--json").stdout)
    assert [d["id"] for d in listed] == ids and listed[0]["error"] == "broken 0"
    assert "broken 1" in tq(db_url, "dead", "list", "jobs").stdout
    r = tq(db_url, "dead", "requeue", "jobs", "--id", str(ids[0]))
    assert r.returncode == 0 and "requeued 1" in r.stdout
    # Already requeued: said why nothing was (it printed only "requeued 0").
    r = tq(db_url, "dead", "requeue", "jobs", "--id", str(ids[0]))
    assert r.returncode == 0 and "requeued 0" in r.stdout and "1 of the ids" in r.stderr
    r = tq(db_url, "dead", "purge", "jobs", "--id", str(ids[1]))
    assert "purged 1" in r.stdout
    r = tq(db_url, "dead", "purge", "jobs", "--yes")
    assert "purged 1" in r.stdout
    with tableq.connect(db_url) as q:
        (s,) = q.stats("jobs")
        assert (s.ready, s.dead) == (1, 0)
        assert q.peek("jobs")[0].id == ids[0]


def test_worker_burst_from_the_command_line(db_url, tmp_path):
    fx = tmp_path / "effects.txt"
    tq(db_url, "migrate")
    lines = "\n".join(str(i) for i in range(25)) + "\n"
    assert tq(db_url, "send", "work", "-", stdin=lines).returncode == 0
    r = tq(db_url, "worker", "effects_app:app", "--topic", "work", "--burst",
           "--concurrency", "2", env={"EFFECTS": str(fx)}, cwd=APPS_DIR)
    assert r.returncode == 0, r.stderr
    assert "worker_started" in r.stderr and "acked" in r.stderr
    assert len(fx.read_text().splitlines()) == 25
    assert jl(tq(db_url, "stats", "work", "--json").stdout)[0]["ready"] == 0


def test_url_from_environment(db_url):
    r = tq(None, "migrate", env={"TABLEQ_URL": db_url})
    assert r.returncode == 0, r.stderr
    r = tq(None, "send", "envtopic", "1", env={"TABLEQ_URL": db_url})
    assert r.returncode == 0
    with tableq.connect(db_url) as q:
        assert q.stats("envtopic")[0].ready == 1


@pytest.mark.parametrize("args, code, needle", [
    (("send", "t", "{not json"), 2, "PAYLOAD is not JSON"),
    (("send", "bad topic\x01", "1"), 1, "invalid topic"),
    (("receive", "t", "--max", "0"), 2, "--max"),
    (("worker", "no_such_module_xyz:app"), 2, "cannot import module"),
    (("worker", "effects_app:nothing"), 2, "has no attribute"),
    (("worker", "broken_app:app"), 1, "RuntimeError: this module is broken on purpose"),
    (("dead", "requeue", "t", "--id", "x"), 2, "--id"),
])
def test_user_errors_are_one_line_without_traceback(tmp_path, args, code, needle):
    url = f"sqlite:///{tmp_path}/e.db"
    tq(url, "migrate")
    r = tq(url, *args, env={"EFFECTS": str(tmp_path / "fx")}, cwd=APPS_DIR)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_url_and_unmigrated_database(tmp_path):
    r = tq("nosuch://x", "stats")
    assert r.returncode == 1 and r.stderr.startswith("error: cannot use database URL")
    assert len(r.stderr.strip().splitlines()) == 1
    r = tq(f"sqlite:///{tmp_path}/fresh.db", "stats")
    assert r.returncode == 1 and "tableq migrate" in r.stderr and "Traceback" not in r.stderr
    r = tq("postgresql://nobody@127.0.0.1:1/none", "stats")
    assert r.returncode == 1 and "cannot reach" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [
    ("stats",), ("peek", "t"), ("send", "t", "1"), ("receive", "t"), ("purge", "t", "--yes"),
    ("dead", "list", "t"), ("token", "list"), ("doctor",), ("worker", "effects_app:app"),
], ids=lambda a: "-".join(a[:2]))
def test_a_mistyped_sqlite_path_is_refused_not_created(tmp_path, args):
    """Opening a SQLite path with no file creates an empty database there: only migrate may
    (a command on a typo made a new queue, then advised migrating it)."""
    url = f"sqlite:///{tmp_path}/typo.db"
    r = tq(url, *args, env={"EFFECTS": str(tmp_path / "fx")}, cwd=APPS_DIR)
    assert r.returncode == 1 and "no SQLite database at" in r.stderr, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "tableq migrate" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "typo.db").exists()
    assert tq(url, "migrate").returncode == 0 and (tmp_path / "typo.db").exists()


@pytest.mark.parametrize("extra", [(), ("--processes", "2")])
def test_a_worker_whose_app_makes_or_holds_its_queue_is_not_refused(tmp_path, extra):
    """The missing-file refusal is for a queue the command would open on a typo: an
    App(migrate=True) creates its file, and an App built with queue= never opens the URL."""
    real = tmp_path / "real.db"
    (tmp_path / "selfmade.py").write_text(
        "from tableq.worker import App\n"
        "app = App(migrate=True)\n"
        "@app.handler('t')\ndef t(message):\n    pass\n")
    (tmp_path / "ownqueue.py").write_text(
        "import tableq\nfrom tableq.worker import App\n"
        f"app = App(queue=tableq.connect({f'sqlite:///{real}'!r}, migrate=True))\n"
        "@app.handler('t')\ndef t(message):\n    pass\n")
    r = tq(f"sqlite:///{tmp_path}/new.db", "worker", "selfmade:app", "--burst", *extra,
           cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "new.db").exists(), r.stderr
    r = tq(None, "worker", "ownqueue:app", "--burst", cwd=tmp_path,
           env={"TABLEQ_URL": f"sqlite:///{tmp_path}/elsewhere.db"})
    assert r.returncode == 0 and real.exists(), r.stderr
    assert not (tmp_path / "elsewhere.db").exists()


def test_debug_shows_the_traceback(tmp_path):
    r = tq("nosuch://x", "--debug", "stats")
    assert r.returncode == 1 and "Traceback" in r.stderr and "InvalidURL" in r.stderr


def test_help_lists_exactly_the_commands():
    r = tq(None, "--help")
    assert r.returncode == 0
    for name in ("migrate", "send", "receive", "stats", "peek", "dead", "purge", "worker",
                 "demo"):
        assert f"  {name}" in r.stdout


def test_stats_watch_refreshes_and_quits_on_ctrl_c(db_url, tmp_path):
    import signal

    from tableq.testing import wait_until

    tq(db_url, "migrate")
    tq(db_url, "send", "watched", "1")
    out = tmp_path / "watch.txt"
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    with open(out, "wb") as sink:
        # As from a terminal: a test run started in the background (as by `cmd &` in a
        # script) ignores SIGINT, and a child Python would inherit that and never see Ctrl-C.
        proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", db_url, "stats",
                                 "--watch", "--interval", "0.2"], stdout=sink,
                                stderr=subprocess.STDOUT, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Rates appear from the second sample on.
        wait_until(lambda: out.read_text().count("watched") >= 2, timeout=20)
        tq(db_url, "send", "watched", "2")
        wait_until(lambda: "+" in out.read_text().split("watched")[-1], timeout=20)
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "backlog Δ/s" in out.read_text()


@pytest.mark.parametrize("extra", [(), ("--processes", "2")])
def test_worker_on_unmigrated_database_fails_fast(tmp_path, extra):
    r = tq(f"sqlite:///{tmp_path}/none.db", "worker", "effects_app:app", *extra,
           env={"EFFECTS": str(tmp_path / "fx")}, cwd=APPS_DIR)
    assert r.returncode == 1 and "tableq migrate" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_demo_without_spark_processes_retries_and_dead_letters(tmp_path):
    # The demo poisons every 2000th job, so 2000 jobs is the fewest that show a dead letter.
    out = tmp_path / "demo"
    r = tq(None, "demo", "--no-spark", "--jobs", "2000", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "dead letter" in r.stdout and "done" in r.stdout
    assert "processed 1,999 jobs" in r.stdout
    assert (out / "tableq.db").exists()  # no --url: a fresh SQLite file under --out


def test_demo_uses_the_global_url(db_url, tmp_path):
    r = tq(db_url, "demo", "--no-spark", "--jobs", "300", "--concurrency", "4",
           "--out", str(tmp_path / "demo"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    assert not (tmp_path / "demo" / "tableq.db").exists()
    with tableq.connect(db_url) as q:
        s = q.stats("jobs")[0]
        assert (s.live, s.dead) == (0, 0)


def test_demo_never_purges_a_users_queue(db_url, tmp_path):
    """The demo purges topic jobs and archives every done and dead message: $TABLEQ_URL is
    never its database, and a --url that holds such messages is refused."""
    with tableq.connect(db_url, migrate=True) as q:
        q.send("jobs", {"mine": 1})
        q.send("other", 1)
        q.dead_letter(q.receive("other")[0], "kept")
    r = tq(None, "demo", "--no-spark", "--jobs", "20", "--url", db_url,
           "--out", str(tmp_path / "d1"), cwd=tmp_path)
    assert r.returncode == 2 and "refusing" in r.stderr and "'jobs'" in r.stderr, r.stderr
    r = tq(None, "demo", "--no-spark", "--jobs", "20", "--out", str(tmp_path / "d2"),
           env={"TABLEQ_URL": db_url}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d2" / "tableq.db").exists()  # a fresh SQLite file, not $TABLEQ_URL
    with tableq.connect(db_url) as q:
        assert (q.stats("jobs")[0].ready, q.stats("other")[0].dead) == (1, 1)


def test_demo_refuses_to_empty_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    r = tq(None, "demo", "--no-spark", "--jobs", "10", "--out", str(tmp_path))
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_a_pipeline_runs_on_the_url_given_not_on_tableq_url(monkeypatch, tmp_path):
    """`tableq --url X pipeline ...` runs on X although $TABLEQ_URL is set (the pipeline's
    own --url used to read $TABLEQ_URL and so always won). The Spark job itself is replaced
    by a recorder: what is checked is which URL the command hands it."""
    from click.testing import CliRunner

    import tableq.cli.pipeline as pipeline_cli
    import tableq.spark.pipelines.load as load_module
    from tableq.cli import cli

    seen: list[str] = []

    class Loaded:
        rows, seconds, job = 0, 1.0, "j"

    def record(spark, url, *args, **kwargs):
        seen.append(url)
        return Loaded()

    monkeypatch.setattr(pipeline_cli, "_session", lambda master, app: None)
    monkeypatch.setattr(load_module, "load_file", record)
    env = {"TABLEQ_URL": f"sqlite:///{tmp_path}/env.db"}
    given = f"sqlite:///{tmp_path}/given.db"
    for url in (env["TABLEQ_URL"], given):
        tableq.connect(url, migrate=True).close()
    runner = CliRunner()
    for args, expected in [
        (["--url", given, "pipeline", "load", "rows.jsonl", "--topic", "t"], given),
        (["pipeline", "load", "rows.jsonl", "--topic", "t", "--url", given], given),
        (["pipeline", "load", "rows.jsonl", "--topic", "t"], env["TABLEQ_URL"]),
    ]:
        r = runner.invoke(cli, args, env=env)
        assert r.exit_code == 0, r.output
        assert seen.pop() == expected, args


def test_pipelines_refuse_a_missing_sqlite_file_and_bad_sizes(tmp_path):
    """Found by review: with no --url, `tableq pipeline load` opened (and created) the default
    ./tableq.db, then failed inside Spark with a traceback on one line; a negative
    --older-than made archive purge dead letters it had not written, and --purge-batch 0
    looped forever. All refused before Spark starts."""
    (tmp_path / "in.csv").write_text("a,b\n1,2\n")
    r = tq(None, "pipeline", "load", "in.csv", "--topic", "x", cwd=tmp_path)
    assert r.returncode == 1 and "tableq.db" in r.stderr and "migrate" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "tableq.db").exists()
    url = f"sqlite:///{tmp_path}/q.db"
    tableq.connect(url, migrate=True).close()
    for args in (["--older-than", "-3600"], ["--purge-batch", "0"], ["--purge-batch", "-5"]):
        r = tq(url, "pipeline", "archive", "--out", str(tmp_path / "a"), *args)
        assert r.returncode == 2 and "Invalid value" in r.stderr, (args, r.stderr)
    r = tq(url, "pipeline", "requeue", "--topic", "t", "--route", "'u'", "--checkpoint",
           str(tmp_path / "ck"), "--block-rows", "0")
    assert r.returncode == 2 and "Invalid value" in r.stderr, r.stderr

    from tableq.spark.pipelines.archive import archive
    for bad in ({"older_than": -1}, {"purge_batch": 0}, {"older_than": float("nan")}):
        with pytest.raises(tableq.InvalidArgument):
            archive(None, url, str(tmp_path / "b"), **bad)


def test_a_spark_failure_is_one_line_naming_the_tableq_error_inside() -> None:
    import click

    from tableq.cli.pipeline import _spark_errors

    class StreamingQueryException(Exception):  # as pyspark raises it, traceback in its text
        __module__ = "pyspark.errors.exceptions.captured"

    text = ("[STREAM_FAILED] Query [id = 1] terminated with exception: ...\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "tableq.errors.LoadIncomplete: bulk load 'j' staged 5 rows but 7 are staged\n")
    with pytest.raises(click.ClickException) as inside, _spark_errors():
        raise StreamingQueryException(text)
    assert inside.value.message == "LoadIncomplete: bulk load 'j' staged 5 rows but 7 are staged"
    with pytest.raises(click.ClickException) as other, _spark_errors():
        raise StreamingQueryException("[CANNOT_PARSE] bad route\nmore")
    assert other.value.message.startswith("Spark failed: StreamingQueryException: "
                                          "[CANNOT_PARSE] bad route (rerun")
    sink = ("[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
            "Traceback (most recent call last):\n  File \"sink.py\", line 87\n"
            "tableq.spark.sink.ColumnError: tableq sink column 'key': has type int\n")
    with pytest.raises(click.ClickException) as column, _spark_errors():
        raise StreamingQueryException(sink)
    assert column.value.message == "ColumnError: tableq sink column 'key': has type int"
    with pytest.raises(click.ClickException) as bare, _spark_errors():
        raise StreamingQueryException("[X] failed: Traceback (most recent call last):\n"
                                      "  File \"a.py\"\nValueError: boom\n")
    assert bare.value.message.startswith("Spark failed: StreamingQueryException: [X] failed: (")
    with pytest.raises(KeyError), _spark_errors():
        raise KeyError("ours")  # not Spark's: left alone


def test_ctrl_c_during_a_bulk_send_says_how_many_were_sent(tmp_path) -> None:
    """It said only "Aborted." while 1,000 were in the queue (found by review): sending the
    file again would have sent those twice."""
    import signal

    url = f"sqlite:///{tmp_path}/c.db"
    tableq.connect(url, migrate=True).close()
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR)])
    proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", url, "send", "t",
                             "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(b"".join(b'{"n": %d}\n' % i for i in range(1200)))
    proc.stdin.flush()  # two batches of 500 go; the rest waits for more lines
    with tableq.connect(url) as q:
        wait_until(lambda: q.stats("t", exact=True)[0].ready == 1000, timeout=60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Interrupted: the first 1000 messages read were sent to t." in err.decode()


def test_stats_watch_json_prints_json_lines(tmp_path) -> None:
    """--json was ignored with --watch (rich tables; found by review)."""
    import signal

    url = f"sqlite:///{tmp_path}/w.db"
    with tableq.connect(url, migrate=True) as q:
        q.send("w", 1)
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR)])
    proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", url, "stats",
                             "--watch", "--json", "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None
    lines = [json.loads(proc.stdout.readline()) for _ in range(3)]
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert [(x["topic"], x["ready"]) for x in lines] == [("w", 1)] * 3
    assert len({x["at"] for x in lines}) == 3


def test_serve_on_a_port_in_use_is_one_line_and_exit_1(tmp_path) -> None:
    """It printed its banner, then uvicorn's error, and exited 3 (found by review)."""
    import socket

    url = f"sqlite:///{tmp_path}/s.db"
    tableq.connect(url, migrate=True).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = tq(url, "serve", "--port", str(port))
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}: "), r.stderr
    assert "serving" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_python_dash_m_tableq_is_the_command_line() -> None:
    r = subprocess.run([sys.executable, "-m", "tableq", "--version"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(SRC_DIR)})
    assert r.returncode == 0 and r.stdout.strip(), r


def test_a_group_without_a_command_shows_its_help_on_many_lines() -> None:
    r = tq(None, "dead")
    assert r.returncode == 2 and len(r.stderr.splitlines() + r.stdout.splitlines()) > 5, r


def test_no_at_a_confirmation_changes_nothing_and_exits_1(db_url):
    """Answered at a terminal (a pty here): "n" is not an interrupt (it exited 130)."""
    with tableq.connect(db_url, migrate=True) as q:
        q.send("kept", 1)
    leader, follower = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR)])
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", db_url, "purge",
                                 "kept"], stdin=follower, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True)
        os.write(leader, b"n\n")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert proc.returncode == 1 and "Nothing was changed" in err, (out, err)
    with tableq.connect(db_url) as q:
        assert q.stats("kept")[0].ready == 1
