"""`tableq doctor`: what is risky about this queue database and how to fix it, as a table (or
JSON lines), with exit code 0 when fine and 1 when something is risky. The checks and their
judgement live in tableq.doctor; this module only shows them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from tableq.cli import output
from tableq.doctor import MAX_CLOCK_OFFSET_S, MAX_TRANSACTION_AGE_S, diagnose, exit_code, worst

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_STYLE = {"ok": "green", "warn": "yellow", "risk": "bold red"}


if TYPE_CHECKING:  # generic in click >= 8.2 only (pyproject allows 8.1)
    _FloatParam = click.ParamType[float]
else:
    _FloatParam = click.ParamType


class Duration(_FloatParam):
    """Seconds, or a number with a unit: 500ms, 30s, 5m, 1h."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?\s*", str(value))
        if m is None:
            self.fail(f"{value!r} is not a duration such as 30, 30s, 500ms, 5m or 1h", param,
                      ctx)
        return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@click.command()
@click.option("--max-transaction-age", type=Duration(), default=MAX_TRANSACTION_AGE_S,
              show_default="5m", metavar="DURATION",
              help="A transaction open longer than this holds back cleanup: risky.")
@click.option("--max-clock-offset", type=Duration(), default=MAX_CLOCK_OFFSET_S,
              show_default="1s", metavar="DURATION",
              help="How far this host's clock may be from the database's before a warning.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on risks.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per finding.")
@click.pass_context
def doctor(ctx: click.Context, max_transaction_age: float, max_clock_offset: float,
           strict: bool, as_json: bool) -> None:
    """Check the queue database: durability settings, old transactions that hold back
    cleanup, dead rows or undo history, pending migrations, and the clock offset to this
    host. Exit code 0: fine (warnings alone too, unless --strict); 1: something is risky."""
    q = ctx.obj.queue()  # the doctor only looks: a missing SQLite file is refused, not made
    findings = diagnose(q, max_transaction_age=max_transaction_age,
                        max_clock_offset=max_clock_offset)
    where = q.where
    if as_json:
        output.json_lines([{"database": where, "check": f.check, "level": f.level,
                            "summary": f.summary, "advice": f.advice, "facts": dict(f.facts)}
                           for f in findings])
    else:
        table = Table(title=output.clean(f"tableq doctor — {where}"), title_justify="left")
        table.add_column("level")
        table.add_column("check")
        table.add_column("finding", ratio=3)
        table.add_column("what to do", ratio=2)
        for f in findings:
            table.add_row(Text(f.level.upper(), style=_STYLE[f.level]), f.check,
                          output.clean(f.summary), output.clean(f.advice or ""))
        output.show(table)
        risks = sum(f.level == "risk" for f in findings)
        warns = sum(f.level == "warn" for f in findings)
        level = worst(findings)
        verdict = {"ok": "all checks passed", "warn": "warnings only",
                   "risk": "something is risky"}[level]
        output.show(f"{risks} risk(s), {warns} warning(s): {verdict}")
    ctx.exit(exit_code(findings, strict=strict))
