"""`python -m benchmarks` (what `make bench` runs): tableq beside its peers and the raw-SQL
ceilings, interleaved over rounds on the same throwaway servers; writes
benchmarks/RESULTS.md, results.json and the chart.

    python -m benchmarks [--quick | --full] [--scenario drain_worker --scenario pickup ...]
        [--db postgres --db sqlite --db mysql] [--system tableq --system pgqueuer ...]
        [--rounds 3] [--jobs 20000] [--report-only]

Runs inside .venv-bench (made from benchmarks/requirements.txt on first use, then this
command re-executes itself there), so the peers are never dependencies of tableq."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import env, plan

HERE = Path(__file__).resolve().parent
CASE_TIMEOUT_S = 1800  # an interleaved case; a once-per-run case (10M rows in --full) gets 4 h
ONCE_TIMEOUT_S = 4 * 3600


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks",
                                 description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke run: 1 round, small sizes")
    mode.add_argument("--full", action="store_true",
                      help="the heavy cases too: 10M rows, 5-minute held snapshot, 10-minute "
                           "RSS, 50k-job drains")
    ap.add_argument("--scenario", action="append", choices=plan.SCENARIOS)
    ap.add_argument("--db", action="append", choices=plan.DATABASES)
    ap.add_argument("--system", action="append", choices=sorted(plan.MODULE))
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--jobs", type=int, help="jobs per drain (peers' factors still apply)")
    ap.add_argument("--samples", type=int, help="pickup samples per case")
    ap.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                    help="override any size of the mode (see benchmarks/plan.py MODES), e.g. "
                         "--size backlog=20000,1000000 --size held_s=300 --size steady_s=30")
    ap.add_argument("--out", type=Path, default=HERE,
                    help="where RESULTS.md, results.json and the chart go (default: benchmarks/)")
    ap.add_argument("--pg", metavar="HOST:PORT",
                    help="use this PostgreSQL (superuser postgres, trust) instead of a "
                         "throwaway cluster; it must not be a server others use")
    ap.add_argument("--mysql", metavar="HOST:PORT", help="same, for MariaDB (root)")
    ap.add_argument("--update", action="store_true",
                    help="merge into --out/results.json: the scenarios run now replace that "
                         "run's records of the same scenarios on the same databases "
                         "(RESULTS.md says so)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite RESULTS.md and the chart from --out/results.json")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--note", help="a sentence for RESULTS.md on the conditions of this run, "
                                   "e.g. whether the machine was quiet or shared")
    return ap.parse_args(argv)


def _addr(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


def run_case(case: plan.Case, target: Any) -> dict[str, Any]:
    spec = {"module": case.module, "scenario": case.entry, "target": target.to_json(),
            "params": case.params}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.case", json.dumps(spec)],
                          cwd=HERE.parent, capture_output=True, text=True,
                          timeout=ONCE_TIMEOUT_S if case.once else CASE_TIMEOUT_S)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line[len("BENCH-RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
    raise RuntimeError("\n".join(tail) or f"exit code {proc.returncode}")


def _headline(result: dict[str, Any]) -> str:
    if "rate" in result:
        return f"{result['rate']:,.0f}/s"
    if "p50_ms" in result:
        return f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms"
    if "ratio" in result:
        return f"ratio {result['ratio']:.2f}"
    return ", ".join(f"{k}={v:.1f}" for k, v in result.items() if isinstance(v, float))[:80]


def execute(args: argparse.Namespace, mode: str, cases: list[plan.Case],
            rounds: int, out: Path) -> dict[str, Any]:
    from benchmarks.servers import Servers

    servers = Servers({c.db for c in cases}, _addr(args.pg), _addr(args.mysql))
    records: list[dict[str, Any]] = []
    started = time.time()
    run: dict[str, Any] = {"mode": mode, "rounds": rounds, "started": started,
                           "argv": sys.argv[1:], "records": records}
    if args.note:
        run["note"] = args.note
    try:
        servers.start()
        run["servers"] = servers.describe()
        run["environment"] = env.describe()
        per_round = [c for c in cases if not c.once]
        once = [c for c in cases if c.once]
        schedule: list[tuple[int, plan.Case]] = []
        for r in range(rounds):
            order = list(per_round)
            random.Random(args.seed * 1000 + r).shuffle(order)  # interleaved, every round
            schedule += [(r, c) for c in order]
        schedule += [(0, c) for c in once]
        for i, (r, case) in enumerate(schedule, 1):
            t0 = time.time()
            record: dict[str, Any] = {"case": case.to_json(), "round": r,
                                      "load": os.getloadavg()[0]}
            try:
                with servers.fresh(case.db, case.sync or "FULL") as target:
                    record["result"] = run_case(case, target)
                note = _headline(record["result"])
            except Exception as exc:  # noqa: BLE001 - a failed case is reported, not fatal
                record["error"] = str(exc)[-2000:]
                note = "FAILED: " + str(exc).strip().splitlines()[-1][:150]
            record["wall_s"] = time.time() - t0
            records.append(record)
            print(f"[{i}/{len(schedule)} {time.time() - started:6.0f}s] round {r + 1} "
                  f"{case.scenario} {case.variant} {case.system} {case.label}: {note} "
                  f"({record['wall_s']:.1f}s)", file=sys.stderr, flush=True)
            run["finished"] = time.time()
            out.write_text(json.dumps(run, indent=1))
    finally:
        servers.stop()
    return run


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` with its records of the (scenario, database) pairs in `new` replaced by new's
    records: a run with --db re-measures that database only, and the others' stay."""
    if not old:
        return new
    redone = {(r["case"]["scenario"], r["case"]["db"]) for r in new["records"]}
    kept = [r for r in old["records"]
            if (r["case"]["scenario"], r["case"]["db"]) not in redone]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(new["started"]))
    pairs = sorted({f"{scenario} ({db})" for scenario, db in redone})
    took = new.get("finished", new["started"]) - new["started"]
    note = (f"{', '.join(pairs)} re-measured in a second run at {stamp} "
            f"({new['rounds']} round(s), {took / 60:.0f} min, `{' '.join(new.get('argv', []))}`)")
    return {**old, "records": kept + new["records"],
            "updates": [*old.get("updates", []), note]}


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    env.ensure(sys.argv[1:] if argv is None else argv)  # re-executes in .venv-bench
    from benchmarks import report

    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        run = json.loads((args.out / "results.json").read_text())
    else:
        mode = "quick" if args.quick else "full" if args.full else "default"
        overrides: dict[str, Any] = {}
        if args.jobs:
            overrides["jobs"] = args.jobs
        if args.samples:
            overrides["samples"] = args.samples
        overrides.update(plan.parse_sizes(args.size, mode))
        rounds = args.rounds or plan.MODES[mode]["rounds"]
        cases = plan.build(mode, args.scenario or list(plan.SCENARIOS),
                           args.db or list(plan.DATABASES), args.system, overrides)
        print(f"{len(cases)} cases, {rounds} round(s), mode {mode}", file=sys.stderr)
        final = args.out / "results.json"
        old = json.loads(final.read_text()) if args.update and final.exists() else {}
        progress = args.out / "results.partial.json" if old else final
        run = execute(args, mode, cases, rounds, progress)
        if old:
            run = merge(old, run)
            final.write_text(json.dumps(run, indent=1))
            progress.unlink()
    path = report.write(run, args.out)
    print(f"wrote {path}", file=sys.stderr)
    if os.environ.get("BENCH_PRINT", "1") == "1":
        print(report.headline_markdown(run))


if __name__ == "__main__":
    main()
