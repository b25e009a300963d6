"""The test seam of the Spark data source (tableq.spark._seam): library code names fault points
and carries no fault code; a hook named by TABLEQ_SPARK_TEST_HOOKS is loaded once per process
and called at each point. No Spark session needed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tableq.spark import _seam

from ._faults import hook_env, injected

SPARK_SRC = Path(_seam.__file__).resolve().parent


@pytest.fixture
def fresh_seam(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv(_seam.ENV, raising=False)
    monkeypatch.setattr(_seam, "_loaded", (None, None))
    yield monkeypatch


def test_no_fault_code_ships_in_the_library() -> None:
    for path in SPARK_SRC.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"os\._exit|[\"']_fault|_crash_after|_Crash\b", text), path


def test_a_point_does_nothing_without_a_hook(fresh_seam: pytest.MonkeyPatch) -> None:
    _seam.point("sink.commit", job="j")  # no hook installed: nothing happens


def test_the_hook_named_in_the_environment_is_loaded_and_called(
        fresh_seam: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in hook_env(tmp_path / "fault").items():
        fresh_seam.setenv(name, value)
    _seam.point("sink.commit", job="j")  # no fault written: the hook lets it pass
    with pytest.raises(RuntimeError, match="fault injected into commit"):
        with injected("commit"):
            _seam.point("sink.commit", job="j")
    with injected("task"):  # strikes the first attempt of partition 1 only
        _seam.point("sink.task_staged", job="j", part=7, partition=0, rows=1, attempt=0)
        _seam.point("sink.task_staged", job="j", part=8, partition=1, rows=1, attempt=1)
        with pytest.raises(RuntimeError, match="task attempt 9 after staging 100 rows"):
            _seam.point("sink.task_staged", job="j", part=9, partition=1, rows=100, attempt=0)


def test_a_malformed_hook_name_says_what_to_do(fresh_seam: pytest.MonkeyPatch) -> None:
    fresh_seam.setenv(_seam.ENV, "no-function-named")
    with pytest.raises(ValueError, match="expected 'module:function'"):
        _seam.point("sink.commit", job="j")
