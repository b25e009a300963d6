"""What a benchmark run measures: the modes (quick, default, full) with their sizes, and the
list of cases (scenario x database x system x parameter) built from them. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCENARIOS = ("drain_worker", "drain_loop", "send_many", "send_one", "pickup", "pickup_busy",
             "steady", "backlog", "bloat", "held_snapshot", "open_load", "rss", "spark")
DATABASES = ("postgres", "sqlite", "mysql")

# Peers whose drains run at hundreds of jobs/s get proportionally fewer jobs, so that every
# case takes seconds, not minutes; a rate is a rate.
SIZE_FACTOR = {"procrastinate": 0.1, "kombu": 0.05, "huey": 0.5, "persistqueue": 0.5}
MIN_JOBS = 500

MODES: dict[str, dict[str, Any]] = {
    "quick": dict(rounds=1, jobs=2_000, send_many=5_000, send_one=300, samples=20,
                  pg_conc=[1, 4], conc=[1, 4], producers=[1, 4], steady_s=5,
                  backlog=[20_000, 100_000], bloat_through=20_000, held_s=15, held_base_s=10,
                  held_raw=True, open_rows=20_000, rss_s=20, spark_rows=20_000,
                  spark_stream=20_000, spark_rounds=1),
    "default": dict(rounds=3, jobs=20_000, send_many=50_000, send_one=3_000, samples=100,
                    pg_conc=[1, 4, 16], conc=[1, 4], producers=[1, 4], steady_s=60,
                    backlog=[20_000, 1_000_000], bloat_through=1_000_000, held_s=120,
                    held_base_s=60, held_raw=False, open_rows=500_000, rss_s=180,
                    spark_rows=500_000, spark_stream=200_000, spark_rounds=2),
    "full": dict(rounds=3, jobs=50_000, send_many=100_000, send_one=5_000, samples=200,
                 pg_conc=[1, 4, 16], conc=[1, 4, 16], producers=[1, 4], steady_s=60,
                 backlog=[20_000, 1_000_000, 10_000_000], bloat_through=10_000_000,
                 held_s=300, held_base_s=300, held_raw=True, open_rows=500_000, rss_s=600,
                 spark_rows=1_000_000, spark_stream=200_000, spark_rounds=3),
}

# Which systems run which scenario on which database ("sqlite" covers FULL and NORMAL).
PEERS: dict[tuple[str, str], list[str]] = {
    ("drain_worker", "postgres"): ["tableq", "pgqueuer", "procrastinate", "pgmq", "raw"],
    ("drain_worker", "sqlite"): ["tableq", "huey", "persistqueue", "kombu", "raw"],
    ("drain_worker", "mysql"): ["tableq", "kombu", "raw"],
    ("drain_loop", "postgres"): ["tableq", "raw"],
    ("drain_loop", "sqlite"): ["tableq", "raw"],
    ("drain_loop", "mysql"): ["tableq", "raw"],
    ("send_many", "postgres"): ["tableq", "pgqueuer", "procrastinate", "pgmq", "raw"],
    ("send_many", "sqlite"): ["tableq", "huey", "persistqueue", "raw"],
    ("send_many", "mysql"): ["tableq", "raw"],
    ("send_one", "postgres"): ["tableq", "pgqueuer", "procrastinate", "pgmq", "raw"],
    ("send_one", "sqlite"): ["tableq", "huey", "persistqueue", "kombu", "raw"],
    ("send_one", "mysql"): ["tableq", "kombu", "raw"],
    ("pickup", "postgres"): ["tableq", "pgqueuer", "procrastinate", "raw"],
    ("pickup", "sqlite"): ["tableq", "huey", "kombu"],
    ("pickup", "mysql"): ["tableq", "kombu"],
    ("pickup_busy", "postgres"): ["tableq", "pgqueuer"],
    ("steady", "postgres"): ["tableq", "pgqueuer"],
    ("steady", "sqlite"): ["tableq"],
    ("steady", "mysql"): ["tableq"],
}
# kombu's SQLAlchemy transport takes SQLite's defaults (no PRAGMA hook): FULL rows only.
FULL_ONLY = {"kombu"}
MODULE = {"tableq": "sys_tableq", "pgqueuer": "sys_pgqueuer",
          "procrastinate": "sys_procrastinate", "pgmq": "sys_pgmq", "huey": "sys_huey",
          "persistqueue": "sys_persistqueue", "kombu": "sys_kombu", "raw": "sys_raw"}


@dataclass(frozen=True)
class Case:
    scenario: str  # one of SCENARIOS
    db: str  # postgres | mysql | sqlite
    system: str  # tableq, a peer, or raw
    label: str  # the parameter that tells cases of one scenario apart: "c=4", "1M", ...
    module: str
    entry: str  # the function in `module`.CASES
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    sync: str = ""  # SQLite synchronous setting
    once: bool = False  # long cases: once per run, not once per round

    @property
    def variant(self) -> str:
        return f"sqlite {self.sync}" if self.db == "sqlite" else self.db

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.scenario, self.variant, self.label, self.system)

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "db": self.db, "system": self.system,
                "label": self.label, "module": self.module, "entry": self.entry,
                "params": self.params, "sync": self.sync, "once": self.once}


def _variants(db: str) -> list[str]:
    return ["FULL", "NORMAL"] if db == "sqlite" else [""]


def _jobs(system: str, jobs: int) -> int:
    return max(MIN_JOBS, int(jobs * SIZE_FACTOR.get(system, 1.0)))


def build(mode: str, scenarios: list[str], dbs: list[str], systems: list[str] | None,
          overrides: dict[str, Any] | None = None) -> list[Case]:
    """Every case of the run, in a fixed order (the runner shuffles each round)."""
    m = {**MODES[mode], **(overrides or {})}
    out: list[Case] = []

    def add(scenario: str, db: str, system: str, label: str, entry: str,
            params: dict[str, Any], module: str | None = None, once: bool = False) -> None:
        if systems and system not in systems:
            return
        for sync in _variants(db):
            if sync == "NORMAL" and system in FULL_ONLY:
                continue
            out.append(Case(scenario, db, system, label, module or MODULE[system], entry,
                            params, sync, once))

    for db in dbs:
        conc = m["pg_conc"] if db == "postgres" else m["conc"]
        for system in PEERS.get(("drain_worker", db), []) if "drain_worker" in scenarios else []:
            for c in conc:
                add("drain_worker", db, system, f"c={c}", "drain_worker",
                    {"jobs": _jobs(system, m["jobs"]), "concurrency": c})
        for system in PEERS.get(("drain_loop", db), []) if "drain_loop" in scenarios else []:
            for c in conc:
                add("drain_loop", db, system, f"c={c}", "drain_loop",
                    {"jobs": m["jobs"], "concurrency": c, "batch": 100})
        for system in PEERS.get(("send_many", db), []) if "send_many" in scenarios else []:
            add("send_many", db, system, "batch=1000", "send_many",
                {"messages": _jobs(system, m["send_many"]), "batch": 1000})
        for system in PEERS.get(("send_one", db), []) if "send_one" in scenarios else []:
            for n in m["producers"]:
                add("send_one", db, system, f"producers={n}", "send_one",
                    {"messages": _jobs(system, m["send_one"]) * n, "producers": n})
        for system in PEERS.get(("pickup", db), []) if "pickup" in scenarios else []:
            samples = m["samples"] if system != "kombu" else max(10, m["samples"] // 4)
            add("pickup", db, system, "idle", "pickup",
                # each database's own wake-up: NOTIFY on PostgreSQL, the commit-counter watch
                # on SQLite; MariaDB has none and polls
                {"samples": samples, "notify": db != "mysql"})
        for system in (PEERS.get(("pickup_busy", db), []) if "pickup_busy" in scenarios
                       else []):
            add("pickup_busy", db, system, "4 workers busy", "pickup",
                {"samples": m["samples"], "busy": True, "notify": True})
        for system in PEERS.get(("steady", db), []) if "steady" in scenarios else []:
            add("steady", db, system, f"{m['steady_s']} s", "steady",
                {"seconds": m["steady_s"], "producers": 4, "concurrency": 4}, once=True)
        if db in ("postgres", "mysql"):
            if "backlog" in scenarios:
                for b in m["backlog"]:
                    add("backlog", db, "tableq", _count(b), "backlog",
                        {"backlog": b, "drain": 20_000}, "scale", once=True)
            if "bloat" in scenarios:
                add("bloat", db, "tableq", _count(m["bloat_through"]), "bloat",
                    {"through": m["bloat_through"]}, "scale", once=True)
            if "held_snapshot" in scenarios:
                for impl in ["tableq", "raw"] if (m["held_raw"] or db == "postgres") else [
                        "tableq"]:
                    for held in (False, True):
                        secs = m["held_s"] if held else m["held_base_s"]
                        add("held_snapshot", db, impl, "held" if held else "not held",
                            "held_snapshot", {"seconds": secs, "held": held, "impl": impl},
                            "scale", once=True)
            if "open_load" in scenarios:
                add("open_load", db, "tableq", _count(m["open_rows"]), "open_load",
                    {"rows": m["open_rows"]}, "scale", once=True)
        if db == "postgres" and "rss" in scenarios:
            add("rss", db, "tableq", f"{m['rss_s']} s", "rss", {"seconds": m["rss_s"]},
                "scale", once=True)
        if db == "postgres" and "spark" in scenarios:
            add("spark", db, "tableq", "local[2]", "spark",
                {"rows": m["spark_rows"], "stream_rows": m["spark_stream"],
                 "rounds": m["spark_rounds"]}, "sys_spark", once=True)
    return out


def parse_sizes(items: list[str], mode: str) -> dict[str, Any]:
    """NAME=VALUE overrides of a mode's sizes: whole numbers, or comma lists where the mode
    has a list."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in MODES[mode]:
            raise SystemExit(f"--size takes NAME=VALUE with NAME one of "
                             f"{', '.join(sorted(MODES[mode]))}; got {item!r}")
        current = MODES[mode][name]
        if isinstance(current, list):
            out[name] = [int(v) for v in value.split(",") if v]
        elif isinstance(current, bool):
            out[name] = value.lower() in ("1", "true", "yes", "on")
        else:
            out[name] = int(value)
    return out


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"
