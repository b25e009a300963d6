"""Named points in the data source where tableq's own tests inject faults. The library only
names the points and holds no fault code: a point does nothing unless a hook is installed.
Spark runs the data source in Python processes of its own (planner runners and workers), so a
hook is named by the TABLEQ_SPARK_TEST_HOOKS environment variable, "module:function" or
"/path/to/file.py:function", and loaded once in each process; the hook is called as
hook(point, **context) and may raise or end the process."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

ENV = "TABLEQ_SPARK_TEST_HOOKS"
Hook = Callable[..., None]

# (the variable's value, its hook): loaded again only when the variable changes.
_loaded: tuple[str | None, Hook | None] = (None, None)


def point(name: str, **context: Any) -> None:
    """Calls the installed hook at point `name`; does nothing when none is installed."""
    global _loaded
    spec = os.environ.get(ENV) or None
    if spec != _loaded[0]:
        _loaded = (spec, _load(spec) if spec else None)
    hook = _loaded[1]
    if hook is not None:
        hook(name, **context)


def _load(spec: str) -> Hook:
    where, _, attr = spec.rpartition(":")
    if not where or not attr.isidentifier():
        raise ValueError(f"{ENV}={spec!r}: expected 'module:function' or "
                         "'/path/to/file.py:function', or unset it")
    if where.endswith(".py"):
        found = importlib.util.spec_from_file_location("_tableq_spark_test_hooks", where)
        if found is None or found.loader is None:
            raise ValueError(f"{ENV}={spec!r}: {where} is not a Python file; fix or unset it")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    hook: Hook = getattr(module, attr)
    return hook
