"""Chart geometry for the dashboard and the Spark report: scales, ticks and shapes as plain
values, which one SVG template draws. Pure functions, no I/O. Each chart has its own scale and
unit, so series of different sizes (seconds of waiting, milliseconds of work) each get a chart
they can be read on instead of sharing one axis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

PALETTE = ("#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d",
           "#4d7c0f")
WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 40


@dataclass(frozen=True, slots=True)
class Tick:
    at: float  # pixel position along its axis
    label: str


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    color: str
    points: str  # "x,y x,y ..." for <polyline>
    dots: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class Bar:
    name: str
    color: str
    x: float
    y: float
    width: float
    height: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    unit: str
    width: int = WIDTH
    height: int = HEIGHT
    lines: tuple[Line, ...] = ()
    bars: tuple[Bar, ...] = ()
    x_ticks: tuple[Tick, ...] = ()
    y_ticks: tuple[Tick, ...] = ()
    legend: tuple[tuple[str, str], ...] = ()
    note: str | None = None
    plot: tuple[float, float, float, float] = field(
        default=(LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM))

    @property
    def empty(self) -> bool:
        return not self.lines and not self.bars


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering lo..hi (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    ticks, value = [], start
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def seconds_unit(values: Sequence[float]) -> tuple[str, float]:
    """The unit a set of durations (in seconds) reads best in: (name, factor to apply)."""
    top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    if top >= 120:
        return "min", 1 / 60
    if top >= 1:
        return "s", 1.0
    if top >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _y_scale(values: Sequence[float], plot: tuple[float, float, float, float]
             ) -> tuple[list[float], float, float]:
    top = max([0.0, *values])
    ticks = nice_ticks(0.0, top if top > 0 else 1.0, 4)
    return ticks, ticks[0], ticks[-1]


def _clock(ts: float, span: float) -> str:
    at = datetime.fromtimestamp(ts, UTC)
    return at.strftime("%H:%M:%S" if span < 600 else "%H:%M")


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *,
               unit: str, times: bool = True, width: int = WIDTH, height: int = HEIGHT,
               note: str | None = None) -> Chart:
    """Lines over x (Unix seconds when `times`, shown as UTC clock time)."""
    plot = (LEFT, TOP, width - RIGHT, height - BOTTOM)
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    if not xs:
        return Chart(title, unit, width, height, note=note or "no data yet", plot=plot)
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    ticks, y0, y1 = _y_scale(ys, plot)

    def px(x: float) -> float:
        return plot[0] + (x - x0) / (x1 - x0) * (plot[2] - plot[0])

    def py(y: float) -> float:
        return plot[3] - (y - y0) / (y1 - y0) * (plot[3] - plot[1])

    lines, legend = [], []
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        dots = tuple((round(px(x), 1), round(py(y), 1)) for x, y in sorted(pts))
        lines.append(Line(name, color, " ".join(f"{x},{y}" for x, y in dots), dots))
        legend.append((name, color))
    span = x1 - x0
    x_ticks = []
    for j in range(5):
        x = x0 + span * j / 4
        x_ticks.append(Tick(round(px(x), 1), _clock(x, span) if times else number(x)))
    y_ticks = tuple(Tick(round(py(t), 1), number(t)) for t in ticks)
    return Chart(title, unit, width, height, tuple(lines), (), tuple(x_ticks), y_ticks,
                 tuple(legend), note, plot)


def bar_chart(title: str, groups: Sequence[str], series: Sequence[tuple[str, Sequence[float]]],
              *, unit: str, width: int = WIDTH, height: int = HEIGHT,
              note: str | None = None) -> Chart:
    """Grouped bars: one group per label in `groups`, one bar per series inside each."""
    plot = (LEFT, TOP, width - RIGHT, height - BOTTOM)
    values = [v for _, vs in series for v in vs if v is not None and math.isfinite(v)]
    if not groups or not series or not values:
        return Chart(title, unit, width, height, note=note or "no data", plot=plot)
    ticks, y0, y1 = _y_scale(values, plot)
    slot = (plot[2] - plot[0]) / len(groups)
    bar_w = slot * 0.8 / len(series)
    bars, legend = [], []
    for i, (name, vs) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        legend.append((name, color))
        for g, v in enumerate(vs):
            if v is None or not math.isfinite(v):
                continue
            h = (v - y0) / (y1 - y0) * (plot[3] - plot[1])
            x = plot[0] + g * slot + slot * 0.1 + i * bar_w
            bars.append(Bar(name, color, round(x, 1), round(plot[3] - h, 1),
                            round(max(bar_w - 2, 1), 1), round(h, 1), number(v)))
    x_ticks = tuple(Tick(round(plot[0] + (g + 0.5) * slot, 1), label)
                    for g, label in enumerate(groups))
    y_ticks = tuple(Tick(round(plot[3] - (t - y0) / (y1 - y0) * (plot[3] - plot[1]), 1),
                         number(t)) for t in ticks)
    return Chart(title, unit, width, height, (), tuple(bars), x_ticks, y_ticks, tuple(legend),
                 note, plot)
