"""Runs one benchmark case in a process of its own and prints its result as one JSON line
(after MARK), so cases never share imports, threads, pools or memory with each other.

    python -m benchmarks.case '{"module": "sys_tableq", "scenario": "drain_worker",
                                "target": {...}, "params": {...}}'"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time

from benchmarks.common import Target

MARK = "BENCH-RESULT "


def run(spec: dict) -> dict:  # type: ignore[type-arg]
    module = importlib.import_module(f"benchmarks.{spec['module']}")
    target = Target.from_json(spec["target"])
    t0 = time.perf_counter()
    module.setup(target)
    result = module.CASES[spec["scenario"]](target, spec["params"])
    result["case_seconds"] = time.perf_counter() - t0
    return result


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tableq").setLevel(logging.WARNING)
    spec = json.loads(sys.argv[1])
    result = run(spec)
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
