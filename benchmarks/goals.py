"""The goals of issue 15 as checks on one run's medians: each yields one line, "met" or
"missed by how much", or says what this run did not measure. Pure functions of the results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

PG_PEERS = ("pgqueuer", "procrastinate", "pgmq")


def verdict(value: float | None, target: float, *, at_most: bool = False,
            unit: str = "x") -> str:
    """'met (v vs target)' or 'missed by N% (v vs target)'; None when not measured."""
    if value is None:
        return "not measured in this run"
    shown = f"{value:.2f}{unit}" if unit == "x" else f"{value:.2f} {unit}"
    want = (f"<= {target:g}{unit}" if at_most else f">= {target:g}{unit}") if unit == "x" \
        else (f"<= {target:g} {unit}" if at_most else f">= {target:g} {unit}")
    ok = value <= target if at_most else value >= target
    if ok:
        return f"**met** ({shown}, goal {want})"
    short = (value / target - 1) * 100 if at_most else (1 - value / target) * 100
    word = "over" if at_most else "short"
    return f"**missed** by {short:.0f}% {word} ({shown}, goal {want})"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _best(res: Any, scenario: str, variant: str, label: str,
          peers: tuple[str, ...]) -> tuple[str, float] | None:
    vals = [(p, res.median(scenario, variant, label, p)) for p in peers]
    vals = [(p, v) for p, v in vals if v]
    return max(vals, key=lambda pv: pv[1]) if vals else None


def lines(res: Any) -> list[str]:
    return [f"- {text}" for text in _all(res)]


def _all(res: Any) -> Iterator[str]:
    pg = "postgres"
    # 1. Drain
    for label in res.labels("drain_worker", pg):
        best = _best(res, "drain_worker", pg, label, PG_PEERS)
        tq = res.median("drain_worker", pg, label, "tableq")
        yield (f"1. drain {label}, worker vs the best peer"
               f"{f' ({best[0]})' if best else ''}: "
               + verdict(_ratio(tq, best[1] if best else None), 4))
        loop = res.median("drain_loop", pg, label, "tableq")
        yield f"1. drain {label}, worker vs the library loop: " + verdict(_ratio(tq, loop), 0.8)
    # 2. Sends
    sm = res.median("send_many", pg, "batch=1000", "tableq")
    yield "2. send_many vs PGMQ's send_batch: " + verdict(
        _ratio(sm, res.median("send_many", pg, "batch=1000", "pgmq")), 1.5)
    yield "2. send_many vs pgqueuer: " + verdict(
        _ratio(sm, res.median("send_many", pg, "batch=1000", "pgqueuer")), 1.5)
    for label in res.labels("send_one", pg):
        one = res.median("send_one", pg, label, "tableq")
        yield f"2. send, {label}, vs the raw INSERT loop: " + verdict(
            _ratio(one, res.median("send_one", pg, label, "raw")), 0.9)
        yield f"2. send, {label}, vs pgqueuer: " + verdict(
            _ratio(one, res.median("send_one", pg, label, "pgqueuer")), 1.5)
    # 3. Pickup
    for scenario, what in (("pickup", "idle"), ("pickup_busy", "while 4 workers drain")):
        for label in res.labels(scenario, pg):
            yield (f"3. NOTIFY pickup p50, {what}: "
                   + verdict(res.median(scenario, pg, label, "tableq", "p50_ms"), 1.0,
                             at_most=True, unit="ms"))
            yield (f"3. NOTIFY pickup p99, {what}: "
                   + verdict(res.median(scenario, pg, label, "tableq", "p99_ms"), 2.0,
                             at_most=True, unit="ms"))
    for variant in ("sqlite FULL", "sqlite NORMAL", "mysql"):
        for label in res.labels("pickup", variant):
            p99 = res.values("pickup", variant, label, "tableq", "p99_ms")
            worst = res.values("pickup", variant, label, "tableq", "max_ms")
            how = "commit-counter wake-up" if variant.startswith("sqlite") else "polling"
            yield (f"3. {how} pickup p99, {variant}: "
                   + verdict(res.median("pickup", variant, label, "tableq", "p99_ms"), 100,
                             at_most=True, unit="ms")
                   + (f"; worst single pickup over all rounds {max(worst):.0f} ms"
                      f"{' (a multi-second tail)' if max(worst) >= 1000 else ''}"
                      if worst else "")
                   + (f"; p99 per round {', '.join(f'{x:.0f}' for x in p99)} ms" if p99 else ""))
    yield ("3. wake-ups for nack-to-now, replace and release: a behaviour, checked by the "
           "worker's tests (tests/worker/test_worker.py: a nack back to now and a replace, by "
           "send and by send_many, wake an idle worker on PostgreSQL and SQLite; MariaDB polls)")
    # 4. Scale
    for variant in (pg, "mysql"):
        labels = res.labels("backlog", variant)
        small = res.once("backlog", variant, "20k")
        bigger = [lab for lab in labels if lab != "20k"]
        big_label = "1M" if "1M" in bigger else (bigger[0] if bigger else "1M")
        big = res.once("backlog", variant, big_label)
        yield (f"4. {variant}: {big_label} backlog drain vs 20k backlog"
               f"{'' if big_label == '1M' else ' (the goal says 1M)'}: "
               + verdict(_ratio(big and big["rate"], small and small["rate"]), 0.9))
        ten = res.once("backlog", variant, "10M")
        if ten:
            yield f"4. {variant}: stats() at 10M live: " + verdict(ten["stats_ms"], 50,
                                                                    at_most=True, unit="ms")
        elif labels:
            largest = res.once("backlog", variant, labels[-1])
            yield (f"4. {variant}: stats() at 10M live: not measured in this mode (--full); at "
                   f"{labels[-1]} it took {largest['stats_ms']:.1f} ms" if largest else
                   f"4. {variant}: stats() at 10M: not measured")
        for label in res.labels("bloat", variant):
            r = res.once("bloat", variant, label)
            yield (f"4. {variant}: table+index size after {label} through vs the same backlog "
                   f"before{'' if label == '10M' else ' (the goal says 10M: --full)'}: "
                   + verdict(r and r["ratio"], 2.0, at_most=True))
        for label in res.labels("open_load", variant):
            r = res.once("open_load", variant, label)
            yield (f"4. {variant}: receive beside an open load of {label} rows vs normal: "
                   + verdict(r and r["ratio"], 2.0, at_most=True))
    # 5. Held snapshot
    for variant in (pg, "mysql"):
        for impl in ("tableq", "raw"):
            held = res.once("held_snapshot", variant, "held", impl)
            free = res.once("held_snapshot", variant, "not held", impl)
            if not held or not free:
                continue
            kept = held["rate"] / free["rate"]
            dead = held.get("dead_tuples", held.get("history_list_length"))
            what = "dead tuples" if "dead_tuples" in held else "history list length"
            line = (f"5. {variant}: held snapshot, {impl}, throughput kept "
                    f"(loss {100 * (1 - kept):.0f}%, last segment "
                    f"{held['last_rate'] / free['rate']:.2f}x of unheld; {dead:,.0f} {what}): ")
            yield line + (verdict(kept, 0.9) if impl == "tableq" else f"{kept:.2f}x (reference)")
    # 6. SQLite and MariaDB
    for variant in ("sqlite FULL", "sqlite NORMAL"):
        for label in res.labels("drain_worker", variant):
            yield (f"6. {variant} drain {label} vs huey: " + verdict(_ratio(
                res.median("drain_worker", variant, label, "tableq"),
                res.median("drain_worker", variant, label, "huey")), 3))
    for label in res.labels("drain_worker", "mysql"):
        yield (f"6. MariaDB drain {label} vs PostgreSQL's: " + verdict(_ratio(
            res.median("drain_worker", "mysql", label, "tableq"),
            res.median("drain_worker", pg, label, "tableq")), 0.75))
    for variant in ("sqlite FULL", "sqlite NORMAL", "mysql"):
        for label in res.labels("send_one", variant):
            yield (f"6. {variant} send, {label}, vs raw INSERT: " + verdict(_ratio(
                res.median("send_one", variant, label, "tableq"),
                res.median("send_one", variant, label, "raw")), 0.5))
        yield (f"6. {variant} send_many vs raw batch INSERT: " + verdict(_ratio(
            res.median("send_many", variant, "batch=1000", "tableq"),
            res.median("send_many", variant, "batch=1000", "raw")), 0.5))
    # 7. Spark
    spark = res.once("spark", pg, "local[2]")
    rates = {name: rate for name, _, rate in spark["table"]} if spark else {}
    yield "7. Spark stream consume >= 40k rows/s, micro-batches after the first: " + verdict(
        (spark or {}).get("stream_steady_rate"), 40_000, unit="rows/s")
    yield "7. Spark stream consume >= 40k rows/s, end to end (the query's start included): " \
        + verdict((spark or {}).get("stream_rate"), 40_000, unit="rows/s")
    yield "7. Spark batch writer vs JDBC writer: " + verdict(
        _ratio((spark or {}).get("write_rate"), (spark or {}).get("jdbc_write_rate")), 1.5)
    yield "7. Spark batch writer vs bare COPY: " + verdict(
        _ratio((spark or {}).get("write_rate"), (spark or {}).get("copy_rate")), 0.8)
    if rates:
        yield ("7. (beside it: Spark JDBC batch read of the same rows "
               f"{(spark or {}).get('jdbc_read_rate', 0):,.0f} rows/s)")
    # 8. Memory
    for label in res.labels("rss", pg):
        r = res.once("rss", pg, label)
        if r:
            yield (f"8. worker RSS at concurrency 16 over {label}: max "
                   + verdict(r["max_mb"], 100, at_most=True, unit="MB")
                   + f"; trend {r['slope_mb_per_min']:+.2f} MB/min ("
                   + ("flat" if abs(r["slope_mb_per_min"]) < 0.5 else "not flat")
                   + ", |trend| < 0.5 MB/min counts as flat)"
                   + ("" if label.startswith("600") else "; the goal says 10 minutes: --full"))
