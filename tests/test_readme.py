"""Every command the README shows runs (issue 13, point 6: the README once told people to run
`tableq demo --url ... --master ...`, which failed). The code blocks are read from README.md
itself, so an edited or added command is run as written, with only these substitutions:

- the example servers (postgresql://app@db/app, postgresql://user:password@db-host/...,
  mysql://user:password@db-host/..., and the `postgresql://...` placeholder) become a fresh
  database on the test servers, and commands without --url get it from $TABLEQ_URL;
- `[--option value]` (optional parts) are given;
- the reader's own functions and objects are stand-ins: `deliver` records what it was given,
  `TemporaryFailure` is an exception class, `my_connection` is a sqlite3 connection to the
  README's database, and for Spark `spark`, `df` and `url` (tests/spark/test_readme_spark.py);
- `make demo` and `make test` are dry runs (`make -n`): the demo's recipe then runs with a
  small --jobs and --no-spark here, and `make test` is this very suite; `make bench` is a
  dry run too (benchmarks are programs that take minutes);
- `tableq stats --watch` runs until its first table appears, then gets Ctrl-C (SIGINT);
- `tableq pipeline requeue|archive|report|load` is each of the four with --help (they need a
  Spark job's inputs); the Spark demo, `tableq demo --url postgresql://... --master
  spark://...`, runs in tests/spark/test_readme_spark.py with local[1] for the cluster.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbhelpers import root_conftest

import tableq
from tableq.testing import wait_until

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SRC_DIR = ROOT / "src"
EXAMPLE_SERVERS = {
    "postgres": re.compile(r"postgresql://(?:app@db/app|user:password@db-host:5432/appdb"
                           r"\?schema=tableq|\.\.\.)"),
    "mysql": re.compile(r"mysql://user:password@db-host:3306/appdb\?prefix=tableq_"),
}


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block of the README, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


def inline_commands() -> list[str]:
    """`tableq ...` and `make ...` commands quoted in the README's prose."""
    prose = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [c for c in re.findall(r"`([^`\n]+)`", prose) if c.startswith(("tableq ", "make "))]


def sh_commands(text: str) -> list[list[str]]:
    """The commands of a sh block: comments dropped, `;` and lines split, [optional] parts
    given."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():  # continued lines are one command
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token == ";":
                if words:
                    out.append(words)
                words = []
            else:  # "[--topic", "emails]" and "[--burst]" lose their brackets
                if token.startswith("["):
                    token = token[1:]
                if token.endswith("]") and "[" not in token:
                    token = token[:-1]
                words.append(token)
        assert not words
    return [c for c in out if c]


def substitute(text: str, urls: dict[str, str]) -> str:
    for dialect, pattern in EXAMPLE_SERVERS.items():
        if dialect in urls:
            text = pattern.sub(urls[dialect], text)
    return text.replace("spark://...", "local[1]")


def run(argv: list[str], cwd: Path, env: dict[str, str], *, timeout: float = 240
        ) -> subprocess.CompletedProcess[str]:
    if argv[0] == "tableq":  # this checkout's tableq, as `pip install -e .` would give it
        argv = [sys.executable, "-m", "tableq.cli", *argv[1:]]
    return subprocess.run(argv, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def cli_env(url: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    if url:
        env["TABLEQ_URL"] = url
    env.update(extra)
    return env


def make_dry_run(target: str, *variables: str) -> str:
    # Run from `make test` itself, a nested make would add "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "--no-print-directory", "-n", target, *variables],
                       cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    yield from root_conftest().make_url("postgres", tmp_path)


@pytest.fixture
def mysql_url(tmp_path: Path) -> Iterator[str]:
    yield from root_conftest().make_url("mysql", tmp_path)


def test_the_readme_shows_the_commands_this_test_runs() -> None:
    langs = [lang for lang, _ in blocks()]
    assert langs.count("sh") == 4 and langs.count("python") == 4, langs
    assert set(langs) == {"sh", "python"}  # a block in another language needs a runner here
    assert "tableq demo --url postgresql://... --master spark://..." in inline_commands()


def test_readme_make_commands(tmp_path: Path) -> None:
    sh = [c for lang, text in blocks() if lang == "sh" for c in sh_commands(text)
          if c[0] == "make"]
    inline = [c.split() for c in inline_commands() if c.startswith("make ")]
    assert {c[1] for c in sh + inline} == {"demo", "test", "bench", "bench-quick",
                                           "faults-suite", "faults-worker", "faults-worker-long",
                                           "faults-long"}
    for _, target, *variables in sh + inline:
        if target == "faults-long":  # the three long parts, one after another
            dry = make_dry_run(target, *variables)
            for part in ("-m pytest tests/faults/test_model.py",
                         "-m pytest tests/faults/test_worker_kills.py", "soak.py --minutes"):
                assert part in dry, dry
            continue
        recipe = make_dry_run(target, *variables).strip().splitlines()[-1]
        assert recipe.startswith(".venv/bin/python "), recipe
        if target == "test":
            assert recipe.endswith("-m pytest")  # this suite
        elif target.startswith("faults"):  # a part of this suite, with its own sizes
            assert " -m pytest tests/" in recipe, recipe
        elif target.startswith("bench"):  # what it would run exists (a script or a module)
            argv = shlex.split(recipe)[1:]
            if argv[0] == "-m":
                found = subprocess.run([sys.executable, "-c", "import importlib.util, sys; "
                                        f"sys.exit(importlib.util.find_spec({argv[1]!r}) "
                                        "is None)"], cwd=str(ROOT), check=False)
                assert found.returncode == 0, recipe
            else:
                assert (ROOT / argv[0]).is_file(), recipe
        else:  # the demo's own recipe, small and without Spark (Spark: the other test file)
            argv = shlex.split(recipe)
            r = run([str(ROOT / argv[0]), *argv[1:], "--no-spark", "--jobs", "200",
                     "--concurrency", "2", "--out", str(tmp_path / "demo-out")],
                    tmp_path, cli_env())
            assert r.returncode == 0, r.stderr[-3000:]
            assert "processed" in r.stdout and "done" in r.stdout


def test_readme_use_block(tmp_path: Path) -> None:
    (code,) = [text for lang, text in blocks() if lang == "python" and "q.transaction()"
               in text]
    db = tmp_path / "tableq.db"
    # The reader's database as the block expects it: a ledger table and one payment due.
    with tableq.connect(f"sqlite:///{db}", migrate=True) as q:
        q.send("payments", {"order": 42})
    with sqlite3.connect(db) as setup:
        setup.execute("CREATE TABLE ledger (order_id INTEGER)")
    delivered: list[object] = []
    my_connection = sqlite3.connect(db, timeout=30)
    stand_ins = {"deliver": delivered.append,
                 "TemporaryFailure": type("TemporaryFailure", (Exception,), {}),
                 "my_connection": my_connection}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the block opens sqlite:///tableq.db, relative to here
    try:
        exec(compile(code, "README.md (Use)", "exec"), stand_ins)
        my_connection.commit()  # the reader's own transaction, which the outbox send joined
    finally:
        os.chdir(cwd)
        my_connection.close()
        if "q" in stand_ins:
            stand_ins["q"].close()
    assert len(delivered) == 10 and all("to" in p for p in delivered)  # type: ignore[operator]
    with sqlite3.connect(db) as check:
        assert check.execute("SELECT order_id FROM ledger").fetchall() == [(42,)]
    with tableq.connect(f"sqlite:///{db}") as q:
        s = {t: q.stats(t)[0] for t in ("payments", "receipts", "events", "emails")}
        assert (s["payments"].live, s["receipts"].ready, s["events"].ready) == (0, 1, 1)
        # 1 delayed by 10 s, 1000 sent at once, 10 of them received and acked
        assert (s["emails"].scheduled, s["emails"].ready, s["emails"].in_flight) == (1, 990, 0)


def test_readme_pointing_at_servers_block(pg_url: str, mysql_url: str) -> None:
    (code,) = [text for lang, text in blocks() if lang == "python"
               and "db-host" in text]
    code = substitute(code, {"postgres": pg_url, "mysql": mysql_url})
    exec(compile(code, "README.md (servers)", "exec"), {"tableq": tableq})
    urls = re.findall(r'tableq\.connect\("([^"]+)"\)', code)
    assert urls == [pg_url, mysql_url]
    for url in urls:  # real servers: they connect, and the namespace parameter is used
        with tableq.connect(url, migrate=True) as q:
            q.send("t", 1)
            assert q.receive("t")[0].payload == 1


@pytest.mark.slow
def test_readme_worker_and_cli_commands(pg_url: str, tmp_path: Path) -> None:
    (jobs,) = [text for lang, text in blocks() if lang == "python" and "# jobs.py" in text]
    (cli_block,) = [text for lang, text in blocks() if lang == "sh" and "tableq migrate" in text]
    effects = tmp_path / "delivered.txt"
    (tmp_path / "jobs.py").write_text(
        "# a stand-in for the reader's own function\n"
        "def deliver(payload):\n"
        f"    with open({str(effects)!r}, 'a') as f:\n"
        "        f.write(repr(payload) + '\\n')\n\n" + substitute(jobs, {"postgres": pg_url}))
    env = cli_env(pg_url)
    commands = sh_commands(substitute(cli_block, {"postgres": pg_url}))
    inline = [shlex.split(substitute(c, {"postgres": pg_url})) for c in inline_commands()
              if c.startswith("tableq ") and " demo " not in f"{c} "
              and c not in SERVER_INLINE]
    seen = set()
    for argv in commands + inline:
        assert argv[0] == "tableq", argv
        seen.add(argv[1])
        if argv[1] == "worker":  # one due job, so the README's handler really runs
            with tableq.connect(pg_url) as q:
                q.send("emails", {"to": "grace@example.com"})
        if argv[1:3] == ["stats", "--watch"]:
            _watch(argv, tmp_path, env)
            continue
        if argv[1] == "pipeline" and "|" in argv[2]:
            for sub in argv[2].split("|"):
                r = run([*argv[:2], sub, "--help"], tmp_path, env)
                assert r.returncode == 0 and "Usage:" in r.stdout, (sub, r.stderr)
            continue
        r = run(argv, tmp_path, env)
        if argv[1] == "doctor":  # 1 means it found something risky on the shared server
            assert r.returncode in (0, 1) and "schema.migrations" in r.stdout, r.stderr
            continue
        assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-3000:])
    assert {"migrate", "worker", "send", "stats", "peek", "dead", "doctor",
            "pipeline"} <= seen
    assert effects.read_text().splitlines() == ["{'to': 'grace@example.com'}"]
    with tableq.connect(pg_url) as q:
        (s,) = q.stats("emails")
        assert (s.ready, s.scheduled, s.dead) == (0, 1, 0)  # --delay 60: still scheduled
        assert q.peek("emails")[0].key == "welcome:ada"


# Inline commands of the HTTP section, run by test_readme_server_block.
SERVER_INLINE = ("tableq serve", "tableq token create --sqs")


@pytest.mark.slow
def test_readme_server_block(pg_url: str, tmp_path: Path) -> None:
    """The "Over HTTP" block, as written, with two substitutions: `pip install
    'tableq[server]'` checks the extra is installed (this suite's environment installs it),
    and the server listens on a free port instead of 8080 (which another process may use)."""
    (block,) = [text for lang, text in blocks() if lang == "sh" and "tableq serve" in text]
    commands = sh_commands(block)
    assert [c[0] for c in commands] == ["pip", "tableq", "tableq", "curl"], commands
    assert commands[0] == ["pip", "install", "tableq[server]"]
    for module in ("fastapi", "uvicorn", "prometheus_client", "jinja2"):
        assert importlib.util.find_spec(module) is not None, module
    env = cli_env(pg_url)
    run([sys.executable, "-m", "tableq.cli", "migrate"], tmp_path, env)
    created = run(commands[1], tmp_path, env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]  # "the token is the last line"
    sqs = run(["tableq", "token", "create", "--role", "producer", "--sqs"], tmp_path, env)
    assert sqs.returncode == 0, sqs.stderr
    assert re.search(r"^AWS_ACCESS_KEY_ID=\S+$", sqs.stdout, re.MULTILINE)
    assert re.search(r"^AWS_SECRET_ACCESS_KEY=\S+$", sqs.stdout, re.MULTILINE)
    port = _free_port()
    assert commands[2] == ["tableq", "serve"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as sink:
        server = subprocess.Popen([sys.executable, "-m", "tableq.cli", "serve", "--port",
                                   str(port)], cwd=str(tmp_path), env=env, stdout=sink,
                                  stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _listening(port), timeout=60,
                   message=f"tableq serve did not listen: {log.read_text(errors='replace')}")
        # The shell would expand $TOKEN (the token printed above) in the double quotes.
        curl = [w.replace("8080", str(port)).replace("$TOKEN", token) for w in commands[3]]
        r = run(["curl", "-sS", "--fail-with-body", *curl[1:]], tmp_path, env)
        assert r.returncode == 0, (r.stdout, r.stderr)
    finally:
        server.terminate()
        server.wait(30)
    with tableq.connect(pg_url) as q:
        (msg,) = q.peek("orders.eu")
        assert msg.payload == {"order": 7}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _watch(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    out = cwd / f"watch-{uuid.uuid4().hex[:6]}.txt"
    with open(out, "wb") as sink:
        # Ctrl-C as from a terminal, even when this run inherited an ignored SIGINT.
        proc = subprocess.Popen([sys.executable, "-m", "tableq.cli", *argv[1:]],
                                cwd=str(cwd), env=env, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: "backlog" in out.read_text(errors="replace"), timeout=60)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.read_text(errors="replace")
