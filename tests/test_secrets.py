"""A database password never shows (issue 13, point 6): not in InvalidURL or connection error
messages, not in repr(DatabaseURL), repr(App), repr(Queue), the Spark option objects and
partitions, not in what the CLI prints or logs, and not on the command lines of the children
of `tableq worker --processes N`, where `ps` would show it to every user of the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dbhelpers import root_conftest

import tableq
from tableq.testing import wait_until
from tableq.url import parse_url, redact

SECRET = "Sw0rdf1sh-42"
APPS_DIR = Path(__file__).parent / "worker" / "apps"
SRC_DIR = Path(__file__).resolve().parents[1] / "src"


def _pg_with_password(schema: str) -> str:
    """The shared PostgreSQL (trust auth: any password is accepted) with SECRET in the URL."""
    u = parse_url(root_conftest().PG_URL)
    return (f"postgresql://{u.user or 'postgres'}:{SECRET}@{u.host}:{u.port or 5432}/"
            f"{u.database}?schema={schema}")


@pytest.mark.parametrize("url", [
    f"nosuch://u:{SECRET}@h/db",
    f"postgresql://u:{SECRET}@h:notaport/db",
    f"postgresql://u:pa/{SECRET}@h/db",  # an unencoded '/' in the password
    f"mysql://u:{SECRET}?x@h/db",
    f"postgresql://u:{SECRET}@h",  # no database
    f"postgresql://u:{SECRET}@[::1/db",  # an unclosed IPv6 bracket
    f"postgresql://h/db?password={SECRET}&schema=Bad-Name",  # a bad name after the password
])
def test_invalid_url_messages_hide_the_password(url: str) -> None:
    with pytest.raises(tableq.TableqError) as err:
        tableq.connect(url)
    for shown in (str(err.value), repr(err.value), getattr(err.value, "url", "")):
        assert SECRET not in shown
    assert SECRET not in redact(url)


def test_reprs_and_connection_errors_hide_the_password() -> None:
    url = f"postgresql://app:{SECRET}@127.0.0.1:1/db?schema=s1&connect_timeout=1"
    parsed = parse_url(url)
    assert parsed.password == SECRET  # still there for the driver
    assert SECRET not in repr(parsed) and "app:***@127.0.0.1:1/db" in repr(parsed)
    app = tableq.App(url)
    assert SECRET not in repr(app) and SECRET not in repr(app.queue)
    with pytest.raises(tableq.DatabaseUnavailable) as err:
        app.queue.stats()
    assert SECRET not in str(err.value) and "app:***@" in str(err.value)
    app.close()


def test_spark_options_and_partitions_hide_the_password() -> None:
    from tableq.spark.options import ReadOptions, StreamOptions, WriteOptions
    from tableq.spark.source import IdRange, LeasePart

    url = f"postgresql://app:{SECRET}@db/app"
    opts = {"url": url, "topic": "t"}
    for parsed in (WriteOptions.parse(opts), ReadOptions.parse(opts), StreamOptions.parse(opts)):
        assert SECRET not in repr(parsed) and SECRET not in str(parsed)
        assert parsed.url == url and parsed.where == "postgresql://app:***@db/app"
    for part in (IdRange(url, "live", "t", 1, 10, None, 100),
                 LeasePart(url, "t", "e:1", 0, 1, 30.0)):
        assert SECRET not in repr(part) and part.url == url  # the executors still connect


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    full["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(SRC_DIR)])
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "tableq.cli", *args], capture_output=True,
                          text=True, env=full, timeout=120, check=False, cwd=str(APPS_DIR))


def test_cli_errors_and_output_hide_the_password(tmp_path: Path) -> None:
    root_conftest().require("postgres")
    r = _cli("--url", f"mysql://nobody:{SECRET}@127.0.0.1:1/db", "stats")
    assert r.returncode == 1 and "cannot reach" in r.stderr
    r2 = _cli("stats", "--url", f"bogus://u:{SECRET}@h/db")
    assert r2.returncode == 1 and "cannot use database URL" in r2.stderr
    url = _pg_with_password("tq_secret_cli")
    try:
        r3 = _cli("--url", url, "migrate")
        assert r3.returncode == 0 and "postgres:***@" in r3.stdout, r3.stderr
        r4 = _cli("demo", "--no-spark", "--jobs", "5", "--concurrency", "1", "--url", url,
                  "--out", str(tmp_path / "demo"))
        assert r4.returncode == 0 and "postgres:***@" in r4.stdout, r4.stderr
        r5 = _cli("doctor", "--url", url)
        assert "postgres:***@" in r5.stdout
        for done in (r, r2, r3, r4, r5):
            assert SECRET not in done.stdout + done.stderr
    finally:
        with tableq.connect(url) as q:
            q._backend._run(lambda cur: cur.execute('DROP SCHEMA IF EXISTS "tq_secret_cli" '
                                                   "CASCADE"))


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.slow
def test_worker_processes_keep_the_password_off_their_command_lines(tmp_path: Path) -> None:
    root_conftest().require("postgres")
    url = _pg_with_password("tq_secret_ps")
    fx, log = tmp_path / "effects.txt", tmp_path / "worker.log"
    with tableq.connect(url, migrate=True) as q:
        q.send_many("work", [{"n": i} for i in range(5)])
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env.update(PYTHONPATH=os.pathsep.join([str(APPS_DIR), str(SRC_DIR)]), EFFECTS=str(fx))
    with open(log, "wb") as out:  # the URL on the parent's command line, as the issue had it
        proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", "--url", url, "worker",
                                 "effects_app:app", "--topic", "work", "--processes", "2"],
                                cwd=str(APPS_DIR), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        children = wait_until(lambda: len(_children(proc.pid)) == 2 and _children(proc.pid),
                              timeout=60)
        # The children connected with the URL they got in their environment and did the work.
        wait_until(lambda: fx.exists() and len(fx.read_text().splitlines()) >= 5, timeout=60)
        wait_until(lambda: log.read_text(errors="replace").count("worker_started") == 2,
                   timeout=60)  # both are running, so SIGTERM below stops them gracefully
        for child in children:
            line = _cmdline(child)
            assert "worker effects_app:app" in line and SECRET not in line, line
            assert "--url" not in line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        with tableq.connect(url) as q:
            q._backend._run(lambda cur: cur.execute('DROP SCHEMA IF EXISTS "tq_secret_ps" '
                                                   "CASCADE"))
    assert proc.returncode == 0
    text = log.read_text(errors="replace")
    assert "worker_started" in text and SECRET not in text
