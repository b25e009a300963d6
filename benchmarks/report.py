"""Turns a run's records (results.json) into benchmarks/RESULTS.md, the headline table for
the README and a PNG chart: medians and ranges over rounds, ratios to the best peer and to
the raw-SQL ceilings of the same run, and one line per goal of issue 15. Pure apart from
writing those files."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import goals

NAMES = {"tableq": "tableq", "pgqueuer": "pgqueuer", "procrastinate": "procrastinate",
         "pgmq": "PGMQ", "huey": "huey", "persistqueue": "persist-queue",
         "kombu": "kombu (SQLAlchemy)", "raw": "raw SQL"}
ORDER = ["tableq", "pgqueuer", "procrastinate", "pgmq", "huey", "persistqueue", "kombu", "raw"]
VARIANTS = ["postgres", "sqlite FULL", "sqlite NORMAL", "mysql"]
VARIANT_TITLE = {"postgres": "PostgreSQL", "sqlite FULL": "SQLite, synchronous=FULL",
                 "sqlite NORMAL": "SQLite, synchronous=NORMAL", "mysql": "MariaDB"}
ROWS = [  # (scenario, label prefix, row title, metric)
    ("drain_worker", None, "drain, worker runtime, {label} (jobs/s)", "rate"),
    ("drain_loop", None, "drain, library loop receive(100)+ack_many / raw lease 100 + "
                         "fenced delete, {label} threads (jobs/s)", "rate"),
    ("send_many", None, "send_many, batches of 1000 (msgs/s)", "rate"),
    ("send_one", None, "send, one per call, {label} (msgs/s)", "rate"),
    ("pickup", None, "pickup latency, idle worker, p50 / p99 (ms)", "latency"),
    ("pickup_busy", None, "pickup latency, 4 other workers draining, p50 / p99 (ms)",
     "latency"),
]


class Results:
    """Records grouped by case: values(scenario, variant, label, system, metric)."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        self.by_key: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
        self.errors: list[tuple[dict[str, Any], str]] = []
        for rec in run["records"]:
            c = rec["case"]
            variant = f"sqlite {c['sync']}" if c["db"] == "sqlite" else c["db"]
            if "result" in rec:
                self.by_key[(c["scenario"], variant, c["label"], c["system"])].append(
                    rec["result"])
            else:
                self.errors.append((c, rec.get("error", "?")))

    def values(self, scenario: str, variant: str, label: str, system: str,
               metric: str = "rate") -> list[float]:
        return [r[metric] for r in self.by_key.get((scenario, variant, label, system), [])
                if isinstance(r.get(metric), (int, float))]

    def median(self, scenario: str, variant: str, label: str, system: str,
               metric: str = "rate") -> float | None:
        v = self.values(scenario, variant, label, system, metric)
        return statistics.median(v) if v else None

    def labels(self, scenario: str, variant: str) -> list[str]:
        seen = [k[2] for k in self.by_key if k[0] == scenario and k[1] == variant]
        return sorted(set(seen), key=_label_order)

    def systems(self, scenario: str, variant: str, label: str | None = None) -> list[str]:
        got = {k[3] for k in self.by_key if k[0] == scenario and k[1] == variant
               and (label is None or k[2] == label)}
        return [s for s in ORDER if s in got]

    def once(self, scenario: str, variant: str, label: str, system: str = "tableq"
             ) -> dict[str, Any] | None:
        got = self.by_key.get((scenario, variant, label, system))
        return got[0] if got else None


def _label_order(label: str) -> tuple[float, str]:
    """Labels sort by their number, with k and M read as such: 20k < 1M, c=4 < c=16."""
    digits = "".join(ch for ch in label if ch.isdigit())
    scale = 1e6 if label.endswith("M") else 1e3 if label.endswith("k") else 1
    return (int(digits) * scale if digits else 0.0, label)


# --- formatting -------------------------------------------------------------------------------

def k(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:.1f}k"
    if x >= 1000:
        return f"{x / 1000:.2f}k"
    return f"{x:.0f}"


def ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


def cell_rate(values: list[float]) -> str:
    if not values:
        return ""
    med = statistics.median(values)
    if len(values) == 1:
        return k(med)
    return f"{k(med)} ({k(min(values))}–{k(max(values))})"


def cell_latency(p50: list[float], p99: list[float]) -> str:
    if not p50:
        return ""
    text = f"{ms(statistics.median(p50))} / {ms(statistics.median(p99))}"
    if len(p99) > 1:
        text += f" (p99 {ms(min(p99))}–{ms(max(p99))})"
    return text


def comparison_table(res: Results, variant: str) -> list[str]:
    systems = [s for s in ORDER if any(k[1] == variant and k[3] == s and k[0] in
                                       {r[0] for r in ROWS} for k in res.by_key)]
    if not systems:
        return []
    out = ["| measure | " + " | ".join(NAMES[s] for s in systems) + " |",
           "|---|" + "---:|" * len(systems)]
    for scenario, _, title, metric in ROWS:
        for label in res.labels(scenario, variant):
            cells = []
            for s in systems:
                if metric == "rate":
                    cells.append(cell_rate(res.values(scenario, variant, label, s)))
                else:
                    cells.append(cell_latency(res.values(scenario, variant, label, s, "p50_ms"),
                                              res.values(scenario, variant, label, s, "p99_ms")))
            if any(cells):
                out.append(f"| {title.format(label=label)} | " + " | ".join(cells) + " |")
    return out


def ratio_table(res: Results, variant: str) -> list[str]:
    """tableq's median over the best peer's median and over the raw ceiling's, per row."""
    rows = []
    for scenario, _, title, metric in ROWS:
        if metric != "rate":
            continue
        for label in res.labels(scenario, variant):
            tq = res.median(scenario, variant, label, "tableq")
            if tq is None:
                continue
            peers = {s: res.median(scenario, variant, label, s)
                     for s in res.systems(scenario, variant, label) if s not in ("tableq", "raw")}
            peers = {s: v for s, v in peers.items() if v}
            best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
            raw = res.median(scenario, variant, label, "raw")
            rows.append(f"| {title.format(label=label)} | {k(tq)} | "
                        + (f"{tq / best[1]:.2f}x {NAMES[best[0]]}" if best else "—") + " | "
                        + (f"{tq / raw:.2f}x" if raw else "—") + " |")
    if not rows:
        return []
    return ["| measure | tableq | tableq / best peer | tableq / raw SQL |", "|---|---:|---:|---:|",
            *rows]


# --- the scale section --------------------------------------------------------------------------

def scale_section(res: Results) -> list[str]:
    out: list[str] = []
    for variant in ("postgres", "mysql"):
        title = VARIANT_TITLE[variant]
        labels = res.labels("backlog", variant)
        if labels:
            out += [f"**{title}, backlog size** (library loop, 1 thread, receive 100 + "
                    "ack_many; 20k drained, median of the drains, the backlog topped up "
                    "between them):", "",
                    "| backlog | drain jobs/s | each drain | stats() ms | fill msgs/s |",
                    "|---|---:|---:|---:|---:|"]
            for label in labels:
                r = res.once("backlog", variant, label)
                if r:
                    each = " / ".join(k(x) for x in r.get("drain_rates", [r["rate"]]))
                    out.append(f"| {label} | {k(r['rate'])} | {each} | {ms(r['stats_ms'])} | "
                               f"{k(r['fill_rate'])} |")
            out.append("")
        for label in res.labels("bloat", variant):
            r = res.once("bloat", variant, label)
            if r:
                out += [f"**{title}, table + index size** after {label} messages through a "
                        f"20k backlog: empty {_mb(r['empty_bytes'])}, with the backlog "
                        f"{_mb(r['start_bytes'])}, after {_mb(r['end_bytes'])} "
                        f"({r['ratio']:.2f}x; churn ran at {k(r['rate'])} msgs/s).", ""]
        held = [(impl, lab) for impl in ("tableq", "raw") for lab in ("not held", "held")
                if res.once("held_snapshot", variant, lab, impl)]
        if held:
            out += [f"**{title}, held snapshot** (fill 20k + drain with the library loop, "
                    "repeated; one REPEATABLE READ transaction open throughout when held):", "",
                    "| system | snapshot | seconds | msgs | mean jobs/s | first / last / slowest "
                    "segment | dead rows at end |", "|---|---|---:|---:|---:|---:|---:|"]
            for impl, lab in held:
                r = res.once("held_snapshot", variant, lab, impl)
                assert r is not None
                dead = r.get("dead_tuples", r.get("history_list_length"))
                what = "dead tuples" if "dead_tuples" in r else "history list length"
                secs = next((rec["case"]["params"]["seconds"] for rec in res.run["records"]
                             if rec["case"]["scenario"] == "held_snapshot"
                             and rec["case"]["label"] == lab and rec["case"]["system"] == impl
                             and rec["case"]["db"] == variant), "?")
                out.append(f"| {NAMES[impl]} | {lab} | {secs} | {r['messages']:,} | "
                           f"{k(r['rate'])} | {k(r['first_rate'])} / {k(r['last_rate'])} / "
                           f"{k(r['min_rate']) if 'min_rate' in r else '-'} | {dead:,.0f} {what} |")
            out.append("")
        for label in res.labels("open_load", variant):
            r = res.once("open_load", variant, label)
            if r:
                out += [f"**{title}, open bulk load**: receive(max=1) on a topic with {label} "
                        f"rows of an open load {ms(r['loaded_ms'])} ms vs {ms(r['plain_ms'])} ms "
                        f"without ({r['ratio']:.1f}x; median of 20).", ""]
    for variant in VARIANTS:
        for label in res.labels("steady", variant):
            for s in res.systems("steady", variant, label):
                r = res.once("steady", variant, label, s)
                if r and "p99_ms" in r:
                    out.append(f"- steady state, {VARIANT_TITLE[variant]}, {NAMES[s]}, {label}, 4 "
                               f"producers (single sends) + worker c=4: {k(r['rate'])} jobs/s done "
                               f"(sent {k(r['sent_rate'])}/s, {r['backlog_at_end']:,} left at the "
                               f"end), pickup p50 {ms(r['p50_ms'])} / p99 {ms(r['p99_ms'])} ms")
    for label in res.labels("rss", "postgres"):
        r = res.once("rss", "postgres", label)
        if r:
            out.append(f"- worker RSS, concurrency 16, PostgreSQL, {label} ({r['jobs']:,} jobs): "
                       f"{r['start_mb']:.0f} MB at start, {r['max_mb']:.0f} MB max, "
                       f"{r['end_mb']:.0f} MB at the end, trend {r['slope_mb_per_min']:+.2f} "
                       "MB/min")
    spark = res.once("spark", "postgres", "local[2]")
    if spark:
        out += ["", "**Spark on PostgreSQL, local[2]** (rows/s):", "",
                "| path | rows | rows/s |", "|---|---:|---:|"]
        for name, rows, rate in spark["table"]:
            out.append(f"| {name} | {rows:,} | {k(rate)} |")
    return out


def _short(variant: str) -> str:
    return variant.replace("sqlite ", "sqlite\n")


def _mb(b: float) -> str:
    return f"{b / 2**10:.0f} kB" if b < 2**20 else f"{b / 2**20:.1f} MB"


# --- files --------------------------------------------------------------------------------------

def headline_markdown(run: dict[str, Any], chart: str = "benchmarks/results.png") -> str:
    res = Results(run)
    lines = [f"Measured by `make bench` ({_when(run)}, {run['mode']} mode, medians of "
             f"{run['rounds']} interleaved rounds; see [benchmarks/RESULTS.md]"
             "(benchmarks/RESULTS.md)). PostgreSQL, durability on:", ""]
    lines += comparison_table(res, "postgres")
    if run.get("note"):
        lines += ["", f"Conditions: {run['note']}."]
    if later := _remeasured(run, "postgres"):
        lines += ["", "Rows re-measured in later runs (this machine's speed differs from day "
                  "to day: compare within a row): " + "; ".join(
                      f"{', '.join(sorted(cases))} on {day}" for day, cases in later.items())
                  + "."]
    lines += ["", f"![tableq beside its peers]({chart})"]
    return "\n".join(lines)


def _remeasured(run: dict[str, Any], db: str) -> dict[str, set[str]]:
    """The headline's scenarios of `db` that --update runs replaced, by the day of their
    latest run."""
    shown = {r[0] for r in ROWS}
    latest: dict[str, str] = {}
    for update in run.get("updates", []):
        cases, _, rest = update.partition(" re-measured in a second run at ")
        for case in cases.split(", "):
            scenario = case.removesuffix(f" ({db})")
            if scenario != case and scenario in shown:
                latest[scenario] = rest[:10]
    days: dict[str, set[str]] = {}
    for case, day in latest.items():
        days.setdefault(day, set()).add(case)
    return dict(sorted(days.items()))


def _when(run: dict[str, Any]) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(run.get("started", time.time())))


def _params_line(run: dict[str, Any]) -> str:
    sizes: dict[str, set[str]] = defaultdict(set)
    for rec in run["records"]:
        c = rec["case"]
        for key, v in c["params"].items():
            if key in ("jobs", "messages", "samples", "seconds", "backlog", "rows", "through",
                       "stream_rows"):
                sizes[f"{c['scenario']}.{key}"].add(f"{v:,}" if isinstance(v, int) else str(v))
    return "; ".join(f"{name} {'/'.join(sorted(v, key=lambda s: float(s.replace(',', ''))))}"
                     for name, v in sorted(sizes.items()))


def results_markdown(run: dict[str, Any]) -> str:
    res = Results(run)
    # The cases' own wall times: a run merged by --update keeps its first run's start, so
    # start to finish would count the hours between the runs.
    took = sum(rec.get("wall_s", 0.0) for rec in run["records"])
    env, servers = run.get("environment", {}), run.get("servers", {})
    lines = [
        "# tableq benchmarks: results",
        "",
        f"Written by `python -m benchmarks` (`make bench`) on {_when(run)} UTC; mode "
        f"**{run['mode']}**, {run['rounds']} interleaved round(s) (every case once per round, "
        f"in a shuffled order; long cases once per run); the cases shown took {took / 60:.0f} min. "
        "Every case runs in its own process against a fresh database (or SQLite file) on the "
        "same servers. Figures are medians with the range over rounds in brackets. No-op jobs, "
        f"~100-byte JSON payloads. Command line: `python -m benchmarks "
        f"{' '.join(run.get('argv', []))}`.",
        "",
        "**Conditions:** " + run.get("note", "none noted (pass --note to describe the "
                                         "machine's state during the run)") + ".",
        "",
        *(f"**Updated:** {u}." for u in run.get("updates", [])),
        "",
        "## Machine, servers, versions",
        "",
    ]
    for key in ("machine", "load_at_start", "python", "tableq", "peers", "pgmq_sql", "java",
                "jdbc"):
        if key in env:
            lines.append(f"- {key.replace('_', ' ')}: {env[key]}")
    for key, text in servers.items():
        lines.append(f"- {key}: {text}")
    loads = [r["load"] for r in run["records"] if "load" in r]
    if loads:
        lines.append(f"- machine load (1-minute load average at each case's start, 2 cores): "
                     f"median {statistics.median(loads):.1f}, range {min(loads):.1f}–"
                     f"{max(loads):.1f}")
    lines += ["- sizes: " + _params_line(run), ""]
    lines += ["## Goals of issue 15", "", *goals.lines(res), ""]
    misses = Path(__file__).with_name("misses.md")
    if misses.exists():
        lines += ["## Why the misses, and the next design step", "",
                  misses.read_text("utf-8").rstrip(), ""]
    for variant in VARIANTS:
        table = comparison_table(res, variant)
        if table:
            lines += [f"## {VARIANT_TITLE[variant]}", "", *table, ""]
            ratios = ratio_table(res, variant)
            if ratios:
                lines += ["Ratios of medians (same run):", "", *ratios, ""]
    scale = scale_section(res)
    if scale:
        lines += ["## Scale, held snapshot, steady state, memory, Spark", "", *scale, ""]
    lines += ["## How each system was driven", "", *HOW, ""]
    lines += ["## Time per scenario in this run", "", "| scenario | cases | minutes |",
              "|---|---:|---:|"]
    per: dict[str, list[float]] = defaultdict(list)
    for rec in run["records"]:
        per[rec["case"]["scenario"]].append(rec.get("wall_s", 0.0))
    for name, walls in per.items():
        lines.append(f"| {name} | {len(walls)} | {sum(walls) / 60:.1f} |")
    rounds = max(1, run["rounds"])
    per_round = sum(r.get("wall_s", 0.0) for r in run["records"] if not r["case"]["once"])
    once = sum(r.get("wall_s", 0.0) for r in run["records"] if r["case"]["once"])
    lines += ["", f"Interleaved cases took {per_round / rounds / 60:.1f} min per round and the "
              f"once-per-run cases {once / 60:.1f} min, so this mode takes about "
              f"{(per_round / rounds * 3 + once) / 60:.0f} min with 3 rounds (plus server "
              "start-up and, on first use, building .venv-bench)."]
    if res.errors:
        lines += ["", "## Cases that failed", ""]
        for c, err in res.errors:
            last = err.strip().splitlines()[-1] if err.strip() else "?"
            lines.append(f"- {c['scenario']} {c['db']} {c['sync']} {c['system']} {c['label']}: "
                         f"`{last[:200]}`")
    lines += ["", "![chart](results.png)", ""]
    return "\n".join(lines)


HOW = [
    "- **tableq**: drain = `App.worker(burst=True)` with one handler at `concurrency=c`; "
    "library loop = `receive(max=100)` + `ack_many` in c threads sharing one Queue; sends = "
    "`send_many` in batches of 1000 / `send` from 1 or 4 threads; pickup = an idle worker "
    "(LISTEN/NOTIFY on PostgreSQL, the data_version watch on SQLite, adaptive polling on "
    "MariaDB) and the time from `send()` returning to the handler starting, one sample "
    "after an idle gap of 20-200 ms (uniform, "
    "seeded: the same gaps for every system); busy = 4 worker threads of another process "
    "draining another topic that a producer keeps refilling. Steady state: 4 producer threads "
    "in another process send one message per call as fast as they can for the whole window, "
    "a worker at concurrency 4 runs them; pickup there is from just before send() to the "
    "handler's start (wall clocks of one host).",
    "- **pgqueuer**: asyncpg driver (its docs' recommendation), c QueueManagers with dequeue "
    "batches of 10 (its benchmark tool's setup), `mode=drain`; batch enqueue by lists.",
    "- **procrastinate**: PsycopgConnector, async no-op task, one worker at `concurrency=c`, "
    "`wait=False`; `batch_defer_async` for batches; LISTEN/NOTIFY on.",
    "- **PGMQ**: the SQL-only install bundled in the `pgmq` PyPI package (no extension build "
    "needed), its sync client; consumers are c threads looping `read(qty=10)` + "
    "`delete_batch` (PGMQ has no worker runtime); `send_batch` for batches. Pickup not "
    "measured (it polls).",
    "- **huey**: `SqliteHuey` (fsync=True for FULL; NORMAL set on its connections), "
    "`create_consumer(workers=c, worker_type='thread')`, default polling; no batch enqueue "
    "(send_many is a loop). At-most-once: no lease.",
    "- **persist-queue**: `SQLiteAckQueue(multithreading=True)` shared by c threads, "
    "`get(block=False)` + `ack`; no batch put, no worker runtime.",
    "- **kombu**: SQLAlchemy transport, `SimpleQueue` put/get/ack, one Connection per "
    "thread; SQLite with SQLAlchemy's defaults (rollback journal, synchronous FULL), so FULL "
    "rows only.",
    "- **raw SQL**: the ceilings, a bare table with one claim index on the same server: "
    "worker rows = SKIP LOCKED claim+delete of one row per transaction in c threads; loop "
    "rows = claim 100 under a lease token in one statement + one delete fenced on it; send = "
    "single-row INSERT loop; send_many = COPY (PostgreSQL), one multi-row INSERT (MariaDB), "
    "executemany in one transaction (SQLite); pickup = INSERT + pg_notify, a LISTENing thread "
    "claims.",
]


def chart(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = Results(run)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    colors = {"tableq": "#1f77b4", "pgqueuer": "#ff7f0e", "procrastinate": "#8c564b",
              "pgmq": "#2ca02c", "huey": "#9467bd", "persistqueue": "#e377c2",
              "kombu": "#7f7f7f", "raw": "#bcbd22"}

    def bars(ax: Any, groups: list[tuple[str, Callable[[str], float | None]]],
             systems: list[str], title: str, ylabel: str, log: bool = True) -> None:
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            ys = [fn(s) or 0 for _, fn in groups]
            ax.bar([g + i * width for g in range(len(groups))], ys, width, label=NAMES[s],
                   color=colors[s])
        ax.set_xticks([g + width * (len(systems) - 1) / 2 for g in range(len(groups))])
        ax.set_xticklabels([name for name, _ in groups], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)

    def med(scn: str, var: str, lab: str, metric: str = "rate") -> Callable[[str], float | None]:
        return lambda s: res.median(scn, var, lab, s, metric)

    pg = "postgres"
    bars(axes[0][0], [(f"worker {lab}", med("drain_worker", pg, lab))
                      for lab in res.labels("drain_worker", pg)]
         + [(f"loop {lab}", med("drain_loop", pg, lab)) for lab in res.labels("drain_loop", pg)],
         res.systems("drain_worker", pg) or ["tableq"],
         "PostgreSQL drain (jobs/s); raw = 1 row/txn beside the worker,\n"
         "100-row lease + fenced delete beside the loop", "jobs/s")
    bars(axes[0][1], [("send_many 1000", med("send_many", pg, "batch=1000"))]
         + [(f"send {lab}", med("send_one", pg, lab)) for lab in res.labels("send_one", pg)],
         res.systems("send_many", pg) or ["tableq"], "PostgreSQL sends (msgs/s)", "msgs/s")
    groups = []
    lat_systems: list[str] = []
    for var in VARIANTS:
        for scn in ("pickup", "pickup_busy"):
            for lab in res.labels(scn, var):
                groups.append((f"{_short(var)}\n{lab} p99",
                               med(scn, var, lab, "p99_ms")))
                lat_systems += [s for s in res.systems(scn, var, lab) if s not in lat_systems]
    if groups:
        bars(axes[1][0], groups, [s for s in ORDER if s in lat_systems],
             "pickup latency p99 (ms, lower is better)", "ms")
    groups = [(f"{_short(var)}\n{lab}", med("drain_worker", var, lab))
              for var in VARIANTS[1:] for lab in res.labels("drain_worker", var)]
    systems = [s for s in ORDER if any(res.median("drain_worker", v, lab, s)
                                       for v in VARIANTS[1:]
                                       for lab in res.labels("drain_worker", v))]
    if groups:
        bars(axes[1][1], groups, systems, "SQLite and MariaDB drain, worker (jobs/s)", "jobs/s")
    fig.suptitle(f"tableq beside its peers and raw SQL ({_when(run)}, {run['mode']} mode, "
                 f"medians of {run['rounds']} rounds; durability on)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(run: dict[str, Any], out: Path) -> Path:
    (out / "RESULTS.md").write_text(results_markdown(run))
    (out / "README-headline.md").write_text(headline_markdown(run) + "\n")
    chart(run, out / "results.png")
    return out / "RESULTS.md"
