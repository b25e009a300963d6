"""One look for tableq's HTML: the dashboard of `tableq serve` and the Spark report share
these templates, this stylesheet and the SVG charts (tableq.look.charts). Rendering only:
values in, escaped HTML out (Jinja2 with autoescaping; nothing is marked safe). No I/O but
reading the package's own files."""

from __future__ import annotations

import math
from datetime import datetime
from importlib import resources
from typing import Any

import jinja2

TEMPLATES = "templates"


def environment(*packages: str) -> jinja2.Environment:
    """A Jinja2 environment over the templates of `packages` (first wins) and tableq.look's."""
    loaders: list[jinja2.BaseLoader] = [jinja2.PackageLoader(p, TEMPLATES) for p in packages]
    loaders.append(jinja2.PackageLoader("tableq.look", TEMPLATES))
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders),
                             autoescape=jinja2.select_autoescape(["html", "svg", "xml"],
                                                                 default=True),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(num=fmt_number, age=fmt_age, pct=fmt_pct, when=fmt_when,
                       dur=fmt_duration, excerpt=excerpt)
    return env


def stylesheet() -> str:
    return resources.files("tableq.look").joinpath("static/tableq.css").read_text("utf-8")


def fmt_number(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def fmt_age(seconds: Any) -> str:
    if seconds is None:
        return "–"
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def fmt_duration(seconds: Any) -> str:
    """A latency: µs, ms or s as fits."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    s = float(seconds)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return fmt_age(s)


def fmt_pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value) * 100:.1f}%"


def fmt_when(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def excerpt(value: Any, width: int = 120) -> str:
    """A payload or error as one line of text, cut to `width` (escaped later, like all)."""
    import json

    if isinstance(value, bytes):
        text = f"<{len(value)} bytes>"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
