"""One SparkSession for the whole Spark suite: local[2,2] so a failed task is retried once.
Without Java the suite is skipped locally and fails under CI=true. Crash tests start their own
Spark driver as a subprocess (a master cannot change inside a process)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tableq.testing import wait_until

from ._faults import hook_env

HERE = Path(__file__).resolve().parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.driver.extraJavaOptions": (
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
        f"-Dlog4j2.configurationFile=file://{HERE / 'log4j2-quiet.properties'}"
    ),
}


def _spark_env() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def require_java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        text = "Spark tests need Java 17+ (no `java` on PATH and no JAVA_HOME)"
        if IN_CI:
            pytest.fail(text, pytrace=False)
        pytest.skip(text)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    require_java()
    _spark_env()
    # Before the JVM starts: Spark's Python workers inherit the hook (see _faults.injected).
    os.environ.update(hook_env(tmp_path_factory.mktemp("faults") / "fault"))
    from pyspark.sql import SparkSession

    import tableq.spark

    builder = SparkSession.builder.master("local[2,2]").appName("tableq-tests")
    conf = {**SPARK_CONF, "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))}
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    tableq.spark.register(session)
    yield session
    session.stop()


def _root_conftest():  # type: ignore[no-untyped-def]
    """tests/conftest.py, whose make_url() makes fresh databases; both files are named
    conftest, so it is loaded by path rather than by module name."""
    import importlib.util

    name = "tableq_tests_root_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def child_env() -> dict[str, str]:
    """The environment for a Spark driver started as a subprocess by a test."""
    _spark_env()
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_driver(child: subprocess.Popen[bytes]) -> None:
    """kill -9 a Spark driver started with start_new_session=True and everything it started.
    Its process group is not enough: PySpark's Python worker daemon moves itself and its
    workers into a group of their own, and a worker orphaned that way would go on writing
    after the test believes the driver dead."""
    if child.poll() is None:
        orphans = _descendants(child.pid)
        os.killpg(child.pid, signal.SIGKILL)  # its own session: only what this test started
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: all(_state(p) == "Z" for p in orphans), timeout=30)
    child.wait()


def _state(pid: int) -> str:
    """The process state letter; "Z" (dead) for a zombie or a process already reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"  # gone


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh queue database on SQLite and PostgreSQL (the Spark suite's default pair)."""
    yield from _root_conftest().make_url(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh queue database on all three backends."""
    yield from _root_conftest().make_url(request.param, tmp_path)


def _fault_servers():  # type: ignore[no-untyped-def]
    """tests/faults/servers.py (throwaway servers), loaded by path like the root conftest."""
    import importlib.util

    name = "tableq_tests_fault_servers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "faults" / "servers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module", params=["postgres", "mysql"])
def crash_server(request: pytest.FixtureRequest) -> Iterator[object]:
    """A throwaway PostgreSQL or MariaDB server that a test may crash and restart (never the
    shared servers)."""
    servers = _fault_servers()
    server = (servers.ThrowawayPostgres() if request.param == "postgres"
              else servers.ThrowawayMariaDB())
    server.start()
    try:
        yield server
    finally:
        server.destroy()
