"""`tableq stats [--watch]`: per-topic counts, and with --watch a live table whose rates come
from successive samples. Rates are differences of counts, so they are net figures: the live
backlog's change per second, and completions per second where they can be seen (acked
messages are only counted with retention on; dead letters always)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
from rich.live import Live
from rich.table import Table

from tableq.cli import output
from tableq.stats import TopicStats


@dataclass(frozen=True, slots=True)
class Rates:
    backlog_per_s: float
    done_per_s: float
    dead_per_s: float


def rates(before: TopicStats | None, after: TopicStats, elapsed_s: float) -> Rates | None:
    """Per-second change between two samples of one topic; None without an earlier one."""
    if before is None or elapsed_s <= 0:
        return None
    return Rates(
        backlog_per_s=(after.live - before.live) / elapsed_s,
        done_per_s=max(0, after.done - before.done) / elapsed_s,
        dead_per_s=max(0, after.dead - before.dead) / elapsed_s,
    )


def _rate(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def table(rows: list[TopicStats], previous: dict[str, TopicStats], elapsed_s: float,
          *, title: str) -> Table:
    t = Table(title=output.clean(title), title_justify="left")
    for col in ("topic", "ready", "scheduled", "in flight", "dead", "oldest ready", "done",
                "backlog Δ/s", "done/s", "dead/s"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for s in rows:
        r = rates(previous.get(s.topic), s, elapsed_s)
        # "~": scaled up from a sample of a big table (TopicStats.estimated)
        n = (lambda v: f"~{v}") if s.estimated else str
        t.add_row(output.clean(s.topic), n(s.ready), n(s.scheduled), n(s.in_flight),
                  str(s.dead), output.age(s.oldest_ready_age), str(s.done),
                  _rate(r.backlog_per_s if r else None, signed=True),
                  _rate(r.done_per_s if r else None), _rate(r.dead_per_s if r else None))
    if not rows:
        t.add_row("(no topics yet)", *[""] * 9)
    return t


@click.command()
@click.argument("topic", required=False)
@click.option("--watch", "-w", is_flag=True, help="Refresh live until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between samples with --watch.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per topic (with "
              "--watch, per topic and sample, with the sample's time in \"at\").")
@click.option("--exact", is_flag=True,
              help="Count every row, even in a big table where counts are estimated "
                   "(shown with ~); takes time in proportion to the table.")
def stats(topic: str | None, watch: bool, interval: float, as_json: bool, exact: bool) -> None:
    """Ready, scheduled, in-flight and dead counts and the oldest ready age, per topic."""
    q: Any = click.get_current_context().obj.queue()

    def sample() -> list[TopicStats]:
        return list(q.stats(topic, exact=True) if exact else q.stats(topic))

    def as_lines(rows: list[TopicStats], **extra: Any) -> None:
        output.json_lines([{
            "topic": s.topic, "ready": s.ready, "scheduled": s.scheduled,
            "in_flight": s.in_flight, "dead": s.dead, "done": s.done,
            "oldest_ready_age": s.oldest_ready_age, "estimated": s.estimated, **extra}
            for s in rows])

    if not watch:
        rows = sample()
        if as_json:
            as_lines(rows)
        else:
            output.show(table(rows, {}, 0.0, title=f"tableq stats — {q.where}"))
        return
    if as_json:  # one JSON object per topic and sample, each with the sample's time
        try:
            while True:
                as_lines(sample(), at=datetime.now(UTC).isoformat(timespec="milliseconds"))
                time.sleep(interval)  # the sampling cadence itself
        except KeyboardInterrupt:
            return
    previous: dict[str, TopicStats] = {}
    last = time.monotonic()
    title = f"tableq stats — {q.where} — every {interval:g}s, Ctrl-C to quit"
    try:
        # On a terminal, one table redrawn in place; piped, one table per sample.
        live = Live(console=output.stdout, auto_refresh=False) if output.stdout.is_terminal \
            else None
        with live or _NoLive():
            while True:
                rows = sample()
                now = time.monotonic()
                shown = table(rows, previous, now - last, title=title)
                if live is not None:
                    live.update(shown, refresh=True)
                else:
                    output.stdout.print(shown)
                    output.stdout.file.flush()
                previous, last = {s.topic: s for s in rows}, now
                time.sleep(interval)  # the refresh cadence itself, not waiting for a condition
    except KeyboardInterrupt:
        return


class _NoLive:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
