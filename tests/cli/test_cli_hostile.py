"""Hostile data through every `tableq` command, on every backend (issue 13, point 6): payloads,
keys, topics, headers and error texts full of rich markup (`[/]`, `[bold]`), emoji codes and
terminal control characters (ESC sequences, C1 controls, bidi overrides). Each command must
succeed, show the data as itself (control characters as visible escapes), never send a
control character to the terminal, give JSON that decodes to the exact values, and never
ack a message whose output could not be written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import APPS_DIR, SRC_DIR, jl, tq

import tableq

# What must never reach a terminal from data: C0 controls but the newlines of our own
# output, DEL, C1 controls, bidi overrides and isolates.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
TOPICS = ["t[/]", "[bold red]x[/]", ":smile: [link=https://e.invalid]t[/link]"]
KEY = "k[/]\x1b[2J\x9b31m\u202egnp.exe\n:smile:"
PAYLOAD = {"p": "[/] \x1b[31mred\x1b[0m \x9b2J \u202eevil :smile: [link=x]y[/link]\n\r\t\x07",
           "[/]": ["\x1b]0;title\x07", "\u2028"]}
ERROR = "boom [/] [bold]x \x1b]0;pwned\x07 \x1b[2J \x9b31m \u202eevil\nlast [/] line \x1b[31m"


def safe(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """The command's output holds no control character (nor markup it would have eaten)."""
    for name, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        bad = UNSAFE.search(text)
        assert bad is None, f"{name} has {bad.group()!r} at {bad.start()}: {text[:2000]!r}"
    assert "MarkupError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r


def ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return safe(r)


@pytest.fixture
def hostile_url(db_url: str, tmp_path: Path) -> str:
    """db_url, but on SQLite in a directory path that reads as markup: .../x[bold]y[/]z/."""
    if not db_url.startswith("sqlite"):
        return db_url
    folder = tmp_path / "x[bold]y[" / "]z"
    folder.mkdir(parents=True)
    return f"sqlite:///{folder}/q.db"


def test_hostile_data_through_every_command(hostile_url: str) -> None:
    url = hostile_url
    r = ok(tq(url, "migrate"))
    if url.startswith("sqlite"):
        assert "x[bold]y[/]z" in r.stdout  # the path shown as itself
    payload_json = json.dumps(PAYLOAD)

    # send: one message (the original report: stored, then a MarkupError made scripts retry)
    r = ok(tq(url, "send", TOPICS[0], payload_json, "--key", KEY))
    assert r.stdout.startswith("sent id=") and "topic=t[/]" in r.stdout
    assert "\\e[2J\\x9b31m\\u202egnp.exe\\n:smile:" in r.stdout  # the key, escaped
    assert ok(tq(url, "send", TOPICS[0], payload_json, "--key", KEY)).stdout.startswith(
        "duplicate id=")
    ok(tq(url, "send", "mk2[/]", "1"))
    # send: in bulk from stdin, with keys and headers
    lines = "".join(json.dumps({"payload": PAYLOAD, "key": f"{KEY}{i}",
                                "headers": {"h[/]": "\x1b[31m[/]"}}) + "\n" for i in range(3))
    assert "sent 3 messages to [bold red]x[/]" in ok(tq(url, "send", TOPICS[1], "-",
                                                        stdin=lines)).stdout
    ok(tq(url, "send", TOPICS[2], payload_json))

    # stats: the table and JSON
    r = ok(tq(url, "stats"))
    for topic in (*TOPICS, "mk2[/]"):
        assert topic in r.stdout
    stats = {s["topic"]: s for s in jl(ok(tq(url, "stats", "--json")).stdout)}
    assert {t: stats[t]["ready"] for t in (*TOPICS, "mk2[/]")} == {
        TOPICS[0]: 1, TOPICS[1]: 3, TOPICS[2]: 1, "mk2[/]": 1}  # sent once, not twice

    # peek: the table shows the data as itself; JSON gives it back exactly
    r = ok(tq(url, "peek", TOPICS[1]))
    # (payloads are shown as JSON text, whose own escapes cover C0 controls)
    assert '"[/] \\u001b[31mred' in r.stdout and "next 3 of [bold red]x[/]" in r.stdout
    peeked = jl(ok(tq(url, "peek", TOPICS[1], "--json")).stdout)
    assert [(m["payload"], m["key"], m["headers"]) for m in peeked] == [
        (PAYLOAD, f"{KEY}{i}", {"h[/]": "\x1b[31m[/]"}) for i in range(3)]

    # receive: leased (table), acked after printing (table), acked (JSON)
    r = ok(tq(url, "receive", TOPICS[1]))
    assert "1 message(s) from [bold red]x[/], leased" in r.stdout
    r = ok(tq(url, "receive", TOPICS[0], "--ack"))
    assert "acked 1 message(s)" in r.stdout and "\\u001b[31mred" in r.stdout
    got = jl(ok(tq(url, "receive", TOPICS[2], "--ack", "--json")).stdout)
    assert [m["payload"] for m in got] == [PAYLOAD]
    with tableq.connect(url) as q:
        assert [s.live for s in q.stats(TOPICS[0]) + q.stats(TOPICS[2])] == [0, 0]
        # dead letters whose error text is hostile
        (m,) = q.receive(TOPICS[1], max=1)
        q.dead_letter(m, ERROR)

    # dead list / requeue / purge
    r = ok(tq(url, "dead", "list", TOPICS[1]))
    assert "last [/] line \\e[31m" in r.stdout  # the error's last line, escaped
    (dead,) = jl(ok(tq(url, "dead", "list", TOPICS[1], "--json")).stdout)
    assert (dead["error"], dead["key"], dead["payload"]) == (ERROR, m.key, PAYLOAD)
    assert "requeued 1 dead letter(s) on [bold red]x[/]" in ok(
        tq(url, "dead", "requeue", TOPICS[1])).stdout
    assert "purged 0 dead letter(s)" in ok(tq(url, "dead", "purge", TOPICS[1], "--yes")).stdout

    # purge, doctor
    assert "purged 3 message(s) from [bold red]x[/]" in ok(
        tq(url, "purge", TOPICS[1], "--yes")).stdout
    r = safe(tq(url, "doctor"))
    assert r.returncode in (0, 1) and "schema.migrations" in r.stdout


def test_user_errors_quoting_hostile_text_are_escaped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    ok(tq(url, "migrate"))
    r = safe(tq(url, "\x1b[31mnosuch\x9b"))  # click quotes the unknown command
    assert r.returncode == 2 and "[31mnosuch" in r.stderr
    r = safe(tq(url, "send", "t", "1", "--priority", "\x1b[2J[/]"))
    assert r.returncode == 2 and "[2J[/]" in r.stderr
    r = safe(tq(url, "send", "t", '"x"', "--kind", "k\x1b[/]"))
    assert r.returncode == 1 and "invalid kind 'k\\x1b[/]'" in r.stderr, r.stderr
    r = ok(tq(url, "send", "t", '"x"', "--kind", "k[/]"))  # relayed, as by tableq serve
    r = safe(tq(url, "send", "t\x1b[31m", "1"))
    assert r.returncode == 1 and "invalid topic" in r.stderr
    r = safe(tq(url, "send", "t", '"x"', "--key", "k", "--on-duplicate", "error"))
    r = safe(tq(url, "send", "t", '"y"', "--key", "k", "--on-duplicate", "error"))
    assert r.returncode == 1 and "already exists" in r.stderr
    # A tableq error quoting the URL as given: a path with an ESC sequence in it.
    r = safe(tq(f"sqlite:///{tmp_path}/no\x1b[31mdir\u202e/q.db", "stats"))
    assert r.returncode == 1 and "no\\e[31mdir\\u202e/q.db" in r.stderr


def _receive_into(url: str, fd: int, *args: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "TABLEQ_URL"}
    env["PYTHONPATH"] = str(SRC_DIR)
    proc = subprocess.run([sys.executable, "-m", "tableq.cli", "--url", url, "receive",
                           "work[/]", "--max", "1", "--ack", *args], stdout=fd,
                          stderr=subprocess.PIPE, env=env, timeout=120, check=False)
    assert "Traceback" not in proc.stderr.decode()
    return proc.returncode


@pytest.mark.parametrize("as_json", [False, True])
def test_receive_ack_never_acks_what_could_not_be_shown(db_url: str, as_json: bool) -> None:
    with tableq.connect(db_url, migrate=True) as q:
        q.send_many("work[/]", [PAYLOAD, PAYLOAD])
    extra = ("--json",) if as_json else ()
    # A full disk: the write fails with ENOSPC.
    with open("/dev/full", "w") as full:
        assert _receive_into(db_url, full.fileno(), *extra) == 1
    # A reader that went away: the pipe is closed before anything is written (EPIPE).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        assert _receive_into(db_url, write_end, *extra) == 1
    finally:
        os.close(write_end)
    with tableq.connect(db_url) as q:
        (s,) = q.stats("work[/]")
        # Each receive leased one message and acked none: both come back after their lease.
        assert (s.live, s.in_flight) == (2, 2)


def test_worker_with_a_hostile_error_logs_and_dead_letters_it_safely(db_url: str) -> None:
    ok(tq(db_url, "migrate"))
    ok(tq(db_url, "send", "hostile[/]", json.dumps(PAYLOAD)))
    r = ok(tq(db_url, "worker", "hostile_app:app", "--burst", cwd=APPS_DIR))
    assert "dead_lettered" in r.stderr
    (dead,) = jl(ok(tq(db_url, "dead", "list", "hostile[/]", "--json")).stdout)
    assert "boom [/] [bold]x \x1b]0;pwned\x07" in dead["error"]
    r = ok(tq(db_url, "dead", "list", "hostile[/]"))
    assert "last [/] line \\e[31m" in r.stdout  # the error's last line, escaped


def test_url_is_accepted_after_every_subcommand(db_url: str, tmp_path: Path) -> None:
    from tableq.cli import cli

    def leaves(group, path=()):  # type: ignore[no-untyped-def]
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from leaves(cmd, (*path, name))
            else:
                yield (*path, name), cmd

    for path, cmd in leaves(cli):
        assert any("--url" in p.opts for p in cmd.params), " ".join(path)

    # The README's form, `tableq demo --url ...`, and the others, with no group --url at all.
    ok(tq(None, "migrate", "--url", db_url))
    ok(tq(None, "send", "after", "1", "--url", db_url))
    assert jl(ok(tq(None, "stats", "after", "--json", "--url", db_url)).stdout)[0]["ready"] == 1
    ok(tq(None, "peek", "after", "--url", db_url))
    ok(tq(None, "dead", "list", "after", "--url", db_url))
    r = ok(tq(None, "demo", "--no-spark", "--jobs", "20", "--concurrency", "2", "--url", db_url,
              "--out", str(tmp_path / "demo"), cwd=tmp_path))
    assert "done" in r.stdout and not (tmp_path / "demo" / "tableq.db").exists()
    assert ok(tq(None, "doctor", "--url", db_url, "--json")).stdout
    # The subcommand's --url wins over the group's and over $TABLEQ_URL.
    r = ok(tq("sqlite:///does/not/exist.db", "stats", "after", "--json", "--url", db_url,
              env={"TABLEQ_URL": "sqlite:///nor/this.db"}))
    assert jl(r.stdout)[0]["ready"] == 1
