"""One SparkSession for the whole Spark suite: local[2,2] so a failed task is retried once.
Without Java the suite is skipped locally and fails under CI=true. Crash tests start their own
Spark driver as a subprocess (a master cannot change inside a process)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh queue database on SQLite and PostgreSQL (the Spark suite's default pair)."""
    yield from _root_conftest().make_url(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh queue database on all three backends."""
    yield from _root_conftest().make_url(request.param, tmp_path)
