"""The README's Spark commands (the rest: tests/test_readme.py): its Python block, with the
reader's `spark`, `df` and `url` as stand-ins, and `tableq demo --url postgresql://...
--master spark://...`, the command that once failed, run on a fresh PostgreSQL schema with
local[1] in place of the cluster (and --jobs 200 instead of 100,000, so the test stays
short)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import blocks, inline_commands, substitute

import tableq

from .conftest import _root_conftest, child_env, require_java


def test_readme_spark_block(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (code,) = [text for lang, text in blocks() if lang == "python" and "tableq.spark" in text]
    url = f"sqlite:///{tmp_path}/readme.db"
    tableq.connect(url, migrate=True).close()
    df = spark.createDataFrame([(f'{{"n": {i}}}',) for i in range(5)], "payload string")
    names = {"spark": spark, "df": df, "url": url}
    exec(compile(code, "README.md (Spark)", "exec"), names)
    assert names["stream"].isStreaming
    with tableq.connect(url) as q:
        assert sorted(m.payload for m in q.receive("jobs", max=10)) == [
            f'{{"n": {i}}}' for i in range(5)]  # a string column is a string payload


@pytest.mark.slow
def test_readme_demo_on_a_server_database_with_spark(tmp_path: Path) -> None:
    require_java()
    (demo,) = [c for c in inline_commands() if c.startswith("tableq demo ")]
    for pg_url in _root_conftest().make_url("postgres", tmp_path):
        argv = shlex.split(substitute(demo, {"postgres": pg_url}))
        assert argv[1:] == ["demo", "--url", pg_url, "--master", "local[1]"]
        r = subprocess.run([sys.executable, "-m", "tableq.cli", *argv[1:], "--jobs", "200",
                            "--out", str(tmp_path / "demo-out")], cwd=str(tmp_path),
                           env=child_env(), capture_output=True, text=True, timeout=600,
                           check=False)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "Spark session local[1]" in r.stdout and "processed 200 jobs" in r.stdout
        assert (tmp_path / "demo-out" / "report.html").exists()
        assert not (tmp_path / "demo-out" / "tableq.db").exists()  # it used the server
