"""The static checks CI enforces (CI runs `make test` only, so they live here): `mypy --strict`
on src/ (configured in pyproject.toml), the import contracts of docs/design.md's layers
(`lint-imports`, also in pyproject.toml), py.typed shipped, and the public API's types as a
user's own mypy run sees them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

MYPY = [sys.executable, "-m", "mypy", "--strict"]


def _run(cmd: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_mypy_strict_on_src() -> None:
    done = _run([*MYPY, "src"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_import_contracts() -> None:
    done = _run([str(BIN / "lint-imports"), "--no-cache"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", done.stdout), done.stdout


def test_py_typed_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["tableq"]
    assert (ROOT / "src" / "tableq" / "py.typed").is_file()


# A user's module: the lines marked `# error` must be the only errors mypy --strict reports.
USER_CODE = '''
from datetime import timedelta

import pydantic

import tableq


class Email(pydantic.BaseModel):
    to: str


app = tableq.App("sqlite:///user.db")


@app.handler("mail", mode="exactly_once")
def handle(msg: tableq.Message[Email]) -> str:
    msg.forward("sent", {"to": msg.payload.to}, key=msg.payload.to, delay=timedelta(seconds=1))
    return msg.heartbeat(extend=60).payload.to


def untyped(msg: tableq.Message) -> None:
    msg.nack(delay=5, error="later")


def main(q: tableq.Queue) -> None:
    name: str = q.register_kind(Email)
    q.send("mail", Email(to="a@b.c"), on_duplicate="replace")
    with q.transaction() as tx:
        tx.send("mail", {"n": 1}, key=name)
        tx.connection.cursor()
    q.send("mail", 1, on_duplicate="ignroe")  # error
    q.receive("mail", mode="exactly_once")  # error
    app.send("mail", 1, priorty=1)  # error
    with q.transaction() as tx:
        tx.send("mail", 1, conection=None)  # error


@app.handler("sms", mode="at_most_twice")  # error
def other(msg: tableq.Message[Email]) -> int:
    return msg.payload.to  # error
'''


def test_the_public_api_is_typed_for_users(tmp_path: Path) -> None:
    (tmp_path / "user_code.py").write_text(USER_CODE)
    done = _run([*MYPY[:4], "--cache-dir", str(ROOT / ".mypy_cache"), "user_code.py"],
                cwd=tmp_path)
    reported = sorted({int(m.group(1)) for m in re.finditer(r"^user_code\.py:(\d+): error",
                                                            done.stdout, re.M)})
    expected = [n for n, line in enumerate(USER_CODE.splitlines(), 1)
                if line.endswith("# error")]
    assert reported == expected, done.stdout + done.stderr
