"""The faults the Spark suite injects at the data source's named points (tableq.spark._seam).
Spark runs the source and sink in Python processes of its own, so the seam loads `hook` from
this file in each of them (TABLEQ_SPARK_TEST_HOOKS, set by hook_env) and the hook reads the
fault to inject from the file that TABLEQ_SPARK_FAULT_FILE names, written by a test before its
query runs. Faults:
- "task": the first attempt of partition 1 fails after staging its first Arrow batch;
- "commit": a batch write's commit() raises, so Spark aborts the load;
- "exit-after-claim:<seq>": the stream source's process ends right after leasing batch <seq>,
  before Spark logged that offset (as if the driver died there);
- "exit-after-prefetch:<seq>": the stream source's process ends right after leasing batch
  <seq> ahead, in the background, while Spark runs the batch before it;
- "exit-after-publish:<batchId>": the stream sink's commit process ends right after publishing
  batch <batchId>, before Spark logged its commit;
- "archive-crash-after-write": the archive pipeline raises after writing its first source's
  Parquet, before purging it.
The seam loads this file as a module of its own, apart from the copy the tests import: match
what a fault raises by its message, not by a class defined here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FAULT_FILE = "TABLEQ_SPARK_FAULT_FILE"


def hook_env(fault_file: Path) -> dict[str, str]:
    """The environment that installs this hook in a Spark driver's processes, reading the fault
    from `fault_file`; set it before the driver's JVM starts (its workers inherit it)."""
    return {"TABLEQ_SPARK_TEST_HOOKS": f"{Path(__file__).resolve()}:hook",
            FAULT_FILE: str(fault_file)}


def _fault() -> str:
    path = os.environ.get(FAULT_FILE)
    try:
        return Path(path).read_text().strip() if path else ""
    except FileNotFoundError:
        return ""


def _fired() -> Path:
    return Path(os.environ[FAULT_FILE] + ".fired")


def hook(point: str, **ctx: Any) -> None:
    fault = _fault()
    if not fault:
        return
    if point == "sink.task_staged" and fault == "task" and ctx["partition"] == 1 \
            and ctx["attempt"] == 0:
        _fired().touch()
        raise RuntimeError(f"fault injected into task attempt {ctx['part']} after staging "
                           f"{ctx['rows']} rows (fault task)")
    if point == "sink.commit" and fault == "commit":
        _fired().touch()
        raise RuntimeError("fault injected into commit() (fault commit)")
    if point == "archive.written" and fault == "archive-crash-after-write":
        _fired().touch()
        raise RuntimeError(f"crash injected after writing {ctx['source']}")
    if point == "source.stream_leased" and fault == f"exit-after-claim:{ctx['seq']}":
        _fired().touch()
        os._exit(3)  # as if the driver died here: leased in the database, not in the log
    if point == "source.stream_prefetched" and fault == f"exit-after-prefetch:{ctx['seq']}":
        _fired().touch()
        os._exit(3)  # the driver dies with a batch leased ahead, besides the one being run
    if point == "sink.stream_published" and fault == f"exit-after-publish:{ctx['batch_id']}":
        _fired().touch()
        os._exit(3)  # as if the driver died here: published, not in Spark's commit log


@contextmanager
def injected(fault: str) -> Iterator[None]:
    """Injects `fault` into the queries run inside the block (in this process's session);
    fails the test if the block ends normally and the fault never fired."""
    path, fired = Path(os.environ[FAULT_FILE]), _fired()
    fired.unlink(missing_ok=True)
    path.write_text(fault)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        was_fired = fired.exists()
        fired.unlink(missing_ok=True)
    assert was_fired, f"the fault {fault!r} never fired, so nothing was tested"
