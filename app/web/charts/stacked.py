"""Column charts over time buckets: GPU-hours stacked by state (`stacked_states_svg`) and one figure per
bucket, such as dollars wasted (`bars_svg`).

Each column is a group whose `<title>` names the bucket and its figures, over an invisible full-height
rectangle, so hovering anywhere over the column shows them, even where the column is short.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

from .states import STATES, check_states, hatch_defs, paint, state_class, state_label, state_legend
from .svg import (
    CHAR_W,
    bucket_label,
    empty_chart,
    epoch,
    finish,
    fmt,
    hit_rect,
    money,
    money_tick,
    nice_axis,
    svg_open,
    tick_label,
    time_axis,
)

_SHORT_UNITS = {"GPU-hours": "GPU-h"}


@dataclass(frozen=True)
class _Frame:
    """Where the plot lies and how buckets map onto it."""

    left: float
    top: float
    plot_w: float
    plot_h: float
    t0: float
    x_scale: float
    """Units per second."""
    y_scale: float
    """Units per unit of value."""
    bar_w: float
    gap: float

    @property
    def bottom(self) -> float:
        return self.top + self.plot_h

    def x(self, when: datetime) -> float:
        return self.left + (epoch(when) - self.t0) * self.x_scale


def stacked_states_svg(
    starts: Sequence[datetime],
    step_s: int,
    hours: Mapping[str, Sequence[float]],
    *,
    width: int = 640,
    height: int = 200,
    title: str,
    unit: str = "GPU-hours",
) -> Markup:
    """One column per bucket (`starts[i]`, `step_s` long) stacking `hours[state][i]` in `STATES` order from
    the bottom, each state in its colour (unpartitioned and unknown hatched).

    A column's `<title>` gives the bucket's start and every state's figure in `unit`. With no buckets, or
    nothing in any, the chart says "No data in this window".
    """
    check_states(hours)
    _check(starts, step_s, hours.values())
    states = [s for s in STATES if s in hours]
    totals = [sum(hours[s][i] for s in states) for i in range(len(starts))]
    peak = max(totals, default=0.0)
    short = _SHORT_UNITS.get(unit, unit)
    if peak <= 0:
        return empty_chart("chart-stacked", width, height, title)
    # The legend follows the unit label and wraps; extra rows make the chart taller, not the plot smaller.
    legend, rows = state_legend(states, x=40 + len(unit) * CHAR_W + 16, y=3, right=width - 10, left=40)
    extra = 14 * (rows - 1)
    summary = f"{title}: {sum(totals):,.1f} {short} in {len(starts)} buckets"
    out = svg_open("chart-stacked", width, height + extra, title, summary)
    out.append(hatch_defs())
    frame = _frame(out, starts, step_s, width=width, height=height + extra, top=22 + extra, peak=peak, unit=unit)
    out += legend
    out.append('<g class="cols">')
    for i, when in enumerate(starts):
        figures = " \u00b7 ".join(f"{state_label(s)} {_amount(hours[s][i])} {short}" for s in states)
        tooltip = f"{bucket_label(when, step_s)} \u00b7 {figures} \u00b7 total {_amount(totals[i])} {short}"
        x = frame.x(when)
        hit = hit_rect(x, frame.top, frame.bar_w + frame.gap, frame.plot_h)
        out.append(f"<g><title>{escape(tooltip)}</title>{hit}")
        below = 0.0
        y_below = frame.bottom
        for state in states:
            value = hours[state][i]
            if value <= 0:
                continue
            below += value
            # Edges from the running sum, so the segments stack without gaps or overlaps.
            y_top = round(frame.bottom - below * frame.y_scale, 1)
            out.append(
                f'<rect class="{state_class(state)}" x="{fmt(x + frame.gap / 2)}" y="{fmt(y_top)}" '
                f'width="{fmt(frame.bar_w)}" height="{fmt(y_below - y_top)}" fill="{paint(state)}"/>'
            )
            y_below = y_top
        out.append("</g>")
    out.append("</g></svg>")
    return finish(out)


def bars_svg(
    starts: Sequence[datetime],
    step_s: int,
    values: Sequence[float | None],
    *,
    width: int = 640,
    height: int = 180,
    title: str,
    unit: str = "USD",
    css_class: str = "waste",
) -> Markup:
    """One bar per bucket (`starts[i]`, `step_s` long) of `values[i]` in `unit`: dollars wasted per hour or
    day by default, shown as `$1,234.56`. A None value (no data) draws no bar; with no values at all the
    chart says "No data in this window"."""
    _check(starts, step_s, [values])
    usd = unit == "USD"
    shown = [v for v in values if v is not None]
    if not shown:
        return empty_chart("chart-bars", width, height, title)
    out = svg_open("chart-bars", width, height, title, f"{title}: total {_value(sum(shown), unit)}")
    frame = _frame(out, starts, step_s, width=width, height=height, top=22, peak=max(shown), unit=unit, usd=usd)
    out.append(f'<g class="cols {escape(css_class)}">')
    for when, value in zip(starts, values, strict=True):
        if value is None:
            continue
        x = frame.x(when)
        y = frame.bottom - value * frame.y_scale
        out.append(
            f"<g><title>{escape(bucket_label(when, step_s))} \u00b7 {escape(_value(value, unit))}</title>"
            f"{hit_rect(x, frame.top, frame.bar_w + frame.gap, frame.plot_h)}"
            f'<rect class="bar" x="{fmt(x + frame.gap / 2)}" y="{fmt(y)}" width="{fmt(frame.bar_w)}" '
            f'height="{fmt(frame.bottom - y)}" fill="currentColor"/></g>'
        )
    out.append("</g></svg>")
    return Markup("".join(out))


def _check(starts: Sequence[datetime], step_s: int, columns: Iterable[Sequence[float | None]]) -> None:
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    for column in columns:
        if len(column) != len(starts):
            raise ValueError(f"{len(column)} values for {len(starts)} buckets")
        if any(v is not None and (v < 0 or not math.isfinite(v)) for v in column):
            raise ValueError("values must be finite and non-negative")


def _frame(
    out: list[str],
    starts: Sequence[datetime],
    step_s: int,
    *,
    width: float,
    height: float,
    top: float,
    peak: float,
    unit: str,
    usd: bool = False,
) -> _Frame:
    """Draw the unit label, y grid with ticks and the time axis of a column chart; return its frame."""
    y_top, y_step = nice_axis(peak)
    tick: Callable[[float], str] = (lambda v: money_tick(v, y_step)) if usd else tick_label
    labels = [tick(i * y_step) for i in range(int(y_top / y_step + 1e-9) + 1)]
    left = max(32.0, 8 + max(len(t) for t in labels) * CHAR_W)
    plot_w, plot_h = width - left - 10, height - top - 18
    t0 = min(epoch(s) for s in starts)
    t1 = max(epoch(s) for s in starts) + step_s
    x_scale = plot_w / (t1 - t0)
    col_w = step_s * x_scale
    gap = min(col_w * 0.2, 4.0) if col_w >= 4 else 0.0
    frame = _Frame(left, top, plot_w, plot_h, t0, x_scale, plot_h / y_top, col_w - gap, gap)
    bottom = frame.bottom
    out.append(f'<text class="axis-label" x="{fmt(left)}" y="12">{escape(unit)}</text><g class="grid">')
    for i, label in enumerate(labels):
        y = fmt(bottom - i * y_step * frame.y_scale)
        out.append(f'<line x1="{fmt(left)}" x2="{fmt(left + plot_w)}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{fmt(left - 4)}" y="{y}" dy="3.5" text-anchor="end">{label}</text>')
    out += time_axis(t0, t1, left=left, plot_w=plot_w, top=top, bottom=bottom, label_y=bottom + 13)
    out.append(f'<line class="axis" x1="{fmt(left)}" x2="{fmt(left + plot_w)}" y1="{fmt(bottom)}" y2="{fmt(bottom)}"/>')
    out.append("</g>")
    return frame


def _amount(value: float) -> str:
    """A figure for a tooltip: one decimal, or two significant digits under 0.1 so small ones show."""
    if value == 0:
        return "0"
    return f"{value:,.1f}" if value >= 0.1 else f"{value:.2g}"


def _value(value: float, unit: str) -> str:
    return money(value) if unit == "USD" else f"{value:,.2f} {unit}"
