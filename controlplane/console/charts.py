"""Server-drawn SVG charts: no chart library, no script, readable by screen readers.

Each chart is an ``<svg role="img">`` with a title and a one-line summary; the page puts the
same numbers in a table next to it for anyone who cannot see the drawing.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

Value = float | None
Formatter = Callable[[float], str]


def number(v: float) -> str:
    """Whole numbers as such; small fractions (an axis midpoint of 0.5) keep one decimal."""
    return f"{v:,.0f}" if v >= 10 or v == int(v) else f"{v:,.1f}"


def nice_ceiling(value: float) -> float:
    """The smallest 1/2/5×10^k at or above value, so the axis reads in round numbers."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * 10**exp >= value:
            return float(m * 10**exp)
    return float(10 ** (exp + 1))


def _label(t: dt.datetime, step: dt.timedelta) -> str:
    return t.strftime("%b %d") if step >= dt.timedelta(days=1) else t.strftime("%H:%M")


def _frame(chart_id: str, title: str, summary: str, y_max: float, fmt: Formatter, times: Sequence[dt.datetime],
           step: dt.timedelta, body: list[str], plotted: int) -> Markup:
    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-t {escape(chart_id)}-d" data-points="{plotted}" '
        f'preserveAspectRatio="xMidYMid meet">',
        f'<title id="{escape(chart_id)}-t">{escape(title)}</title>',
        f'<desc id="{escape(chart_id)}-d">{escape(summary)}</desc>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = TOP + PLOT_H * (1 - frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{escape(fmt(y_max * frac))}</text>')
    if times:
        for i in sorted({0, len(times) // 2, len(times) - 1}):
            x = LEFT + PLOT_W * (i + 0.5) / len(times)
            parts.append(f'<text class="axis" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                         f'{escape(_label(times[i], step))}</text>')
    parts.extend(body)
    parts.append("</svg>")
    return Markup("".join(parts))


def bar_chart(chart_id: str, title: str, times: Sequence[dt.datetime], values: Sequence[Value],
              step: dt.timedelta, fmt: Formatter = number) -> Markup:
    present = [v for v in values if v]
    y_max = nice_ceiling(max(present, default=0.0))
    slot = PLOT_W / max(len(values), 1)
    body = []
    for i, (t, v) in enumerate(zip(times, values, strict=True)):
        if not v:
            continue
        h = PLOT_H * v / y_max
        body.append(
            f'<rect class="bar" x="{LEFT + i * slot + slot * 0.1:.1f}" y="{TOP + PLOT_H - h:.1f}" '
            f'width="{max(slot * 0.8, 1):.1f}" height="{h:.1f}"><title>{escape(_label(t, step))}: '
            f'{escape(fmt(v))}</title></rect>'
        )
    summary = f"{title}: total {fmt(sum(present))}, peak {fmt(max(present))}." if present else f"{title}: no data."
    return _frame(chart_id, title, summary, y_max, fmt, times, step, body, len(present))


def line_chart(chart_id: str, title: str, times: Sequence[dt.datetime], series: Sequence[tuple[str, Sequence[Value]]],
               step: dt.timedelta, fmt: Formatter = number, y_max: float | None = None) -> Markup:
    present = [v for _, vs in series for v in vs if v is not None]
    top = y_max if y_max is not None else nice_ceiling(max(present, default=0.0))
    n = max(len(times), 1)
    body = []
    for k, (name, values) in enumerate(series):
        coords = [
            (LEFT + PLOT_W * (i + 0.5) / n, TOP + PLOT_H * (1 - min(v / top, 1.0)))
            for i, v in enumerate(values) if v is not None
        ]
        if len(coords) > 1:
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            body.append(f'<polyline class="line s{k}" points="{pts}"><title>{escape(name)}</title></polyline>')
        for (x, y), v in zip(coords, [v for v in values if v is not None], strict=True):
            body.append(f'<circle class="dot s{k}" cx="{x:.1f}" cy="{y:.1f}" r="3">'
                        f'<title>{escape(name)}: {escape(fmt(v))}</title></circle>')
    if present:
        latest = "; ".join(
            f"{name} latest {fmt(next(v for v in reversed(vs) if v is not None))}"
            for name, vs in series if any(v is not None for v in vs)
        )
        summary = f"{title}: {latest}."
    else:
        summary = f"{title}: no data."
    return _frame(chart_id, title, summary, top, fmt, times, step, body, len(present))


def stacked_bar(chart_id: str, title: str, parts: Sequence[tuple[str, float]], unit: str = "ms") -> Markup:
    """One horizontal bar split into named parts (queueing, prefill, generation)."""
    total = sum(v for _, v in parts) or 1.0
    height = 36
    x = 0.0
    body = []
    for k, (name, v) in enumerate(parts):
        w = 100.0 * v / total
        body.append(f'<rect class="part s{k}" x="{x:.2f}%" y="4" width="{w:.2f}%" height="{height - 8}">'
                    f'<title>{escape(name)}: {v:,.0f} {escape(unit)}</title></rect>')
        x += w
    summary = ", ".join(f"{name} {v:,.0f} {unit}" for name, v in parts)
    return Markup(
        f'<svg class="stack" id="{escape(chart_id)}" width="100%" height="{height}" role="img" '
        f'aria-label="{escape(title)}: {escape(summary)}">{"".join(body)}</svg>'
    )
