"""Heatmaps: devices x time buckets coloured by state (`state_heatmap_svg`), and the hours of a week coloured
by the money idle GPUs wasted in them (`hour_of_week_svg`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby

from markupsafe import Markup, escape

from .states import STATE_LABELS, STATES, hatch_defs, paint, state_class, state_legend
from .svg import CHAR_W, empty_chart, epoch, finish, fmt, money, row_label, svg_open, time_axis

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
HEAT_LEVELS = 5
"""Classes `heat-1` .. `heat-5` shade money from a little to the most; `heat-0` is none, `heat-none` no data."""


@dataclass(frozen=True)
class HeatCell:
    """One bucket of one row: its state and its tooltip.

    The tooltips are most of a heatmap's bytes (a cell costs under 50 bytes besides its title), so keep
    them short ("Fri 14:00 · idle"): the row's name is beside the row already.
    """

    state: str
    title: str

    def __post_init__(self) -> None:
        if self.state not in STATE_LABELS:
            raise ValueError(f"heat cell {self.title!r} has unknown state {self.state!r}")


@dataclass(frozen=True)
class HeatRow:
    """A device's row: its name, a link to its page, and one cell per bucket (None: no data, left blank)."""

    label: str
    href: str | None
    cells: Sequence[HeatCell | None]


def state_heatmap_svg(
    rows: Sequence[HeatRow],
    starts: Sequence[datetime],
    step_s: int,
    *,
    width: int = 960,
    title: str,
    label_width: int = 140,
    row_height: int = 12,
) -> Markup:
    """One row per entry of `rows`, one column per bucket (`starts`: consecutive, `step_s` apart), each cell
    in its state's colour (unknown and unpartitioned hatched), with the time axis on top and a legend below.

    Row names longer than the label column are cut with an ellipsis, the whole name in their tooltip. Cells
    are whole units wide where there is room for 2 or more, which can make the chart a little narrower than
    `width`. Consecutive cells of a row with the same state and the same tooltip are drawn as one.
    """
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    for row in rows:
        if len(row.cells) != len(starts):
            raise ValueError(f"row {row.label!r} has {len(row.cells)} cells for {len(starts)} buckets")
    filled = sum(cell is not None for row in rows for cell in row.cells)
    summary = f"{title}: {len(rows)} rows, {len(starts)} buckets" if filled else f"{title}: no data"
    n = len(starts)
    if not rows or not n:
        return empty_chart("chart-heatmap", width, 60, title)

    pitch = row_height + 3
    top = 22
    span = (width - label_width - 10) / n
    cell_w = math.floor(span) if span >= 2 else span
    plot_w = cell_w * n
    plot_h = pitch * len(rows) - 3
    present = [s for s in STATES if any(c is not None and c.state == s for row in rows for c in row.cells)]
    chart_w = label_width + plot_w + 10
    blank = "no data" if filled < n * len(rows) else None
    legend, legend_rows = state_legend(present, x=label_width, y=top + plot_h + 8, right=chart_w - 10, blank=blank)
    height = top + plot_h + 8 + 14 * legend_rows

    out = svg_open("chart-heatmap", chart_w, height, title, summary)
    out.append(hatch_defs())
    t0 = epoch(starts[0])
    out.append('<g class="grid">')
    out += time_axis(t0, t0 + n * step_s, left=label_width, plot_w=plot_w, top=top - 4, bottom=top, label_y=top - 8)
    out.append("</g>")
    max_chars = max(1, int((label_width - 10) // CHAR_W))
    out.append('<g class="rows">')
    for r, row in enumerate(rows):
        out.append(
            row_label(row.label, row.href, x=label_width - 6, y=top + r * pitch + row_height / 2, max_chars=max_chars)
        )
    out.append("</g>")

    # One group per state, not per row: a cell then needs nothing but its place and its tooltip.
    runs: dict[str, list[str]] = {s: [] for s in present}
    for r, row in enumerate(rows):
        y = fmt(top + r * pitch + row_height / 2)
        i = 0
        for cell, same in groupby(row.cells):
            count = len(list(same))
            if cell is not None:
                x = fmt(label_width + i * cell_w)
                runs[cell.state].append(
                    f'<path d="M{x} {y}h{fmt(count * cell_w)}"><title>{escape(cell.title)}</title></path>'
                )
            i += count
    for state, cells in runs.items():
        out.append(
            f'<g class="cells {state_class(state)}" stroke="{paint(state)}" stroke-width="{row_height}">'
            f"{''.join(cells)}</g>"
        )
    out += legend
    out.append("</svg>")
    return finish(out)


def hour_of_week_svg(
    usd: Sequence[Sequence[float]],
    hours: Sequence[Sequence[int]],
    *,
    width: int = 640,
    title: str,
) -> Markup:
    """7 rows (Mon..Sun) x 24 columns (00..23 UTC): `usd[d][h]` dollars wasted over `hours[d][h]` hours of
    the window that fell on that hour of the week.

    Shaded by dollars per hour, in `HEAT_LEVELS` steps up to the highest; no waste and no data (no hours)
    each look different. Each cell's tooltip reads "Tue 14:00-15:00 UTC · $123.45 wasted over 4 hours ·
    $30.86 per hour".
    """
    if len(usd) != 7 or len(hours) != 7 or any(len(r) != 24 for r in (*usd, *hours)):
        raise ValueError("hour_of_week_svg needs 7 rows of 24 figures for both usd and hours")
    if any(v < 0 or not math.isfinite(v) for r in usd for v in r) or any(h < 0 for r in hours for h in r):
        raise ValueError("dollars and hours must be finite and non-negative")
    rates = [[u / h if h else 0.0 for u, h in zip(ur, hr, strict=True)] for ur, hr in zip(usd, hours, strict=True)]
    top_rate = max(max(r) for r in rates)
    total = sum(sum(r) for r in usd)
    summary = f"{title}: {money(total)} wasted" if any(any(r) for r in hours) else f"{title}: no data"

    left, top, gap, row_h = 36, 18, 2, 18
    cell_w = (width - left - 8) / 24
    plot_h = 7 * row_h
    legend_y = top + plot_h + 10
    height = legend_y + 14
    out = svg_open("chart-week", width, height, title, summary)
    out.append('<g class="grid">')
    every = 1 if cell_w >= 20 else 2 if cell_w >= 12 else 3
    for h in range(0, 24, every):
        x = fmt(left + (h + 0.5) * cell_w)
        out.append(f'<text class="tick" x="{x}" y="{top - 5}" text-anchor="middle">{h:02}</text>')
    out.append(f'<text class="tick" x="{left - 6}" y="{top - 5}" text-anchor="end">UTC</text>')
    for d, day in enumerate(DAYS):
        y = fmt(top + (d + 0.5) * row_h)
        out.append(f'<text class="tick" x="{left - 6}" y="{y}" dy="3.5" text-anchor="end">{day}</text>')
    out.append('</g><g class="heat">')
    for d, day in enumerate(DAYS):
        for h in range(24):
            level = _level(usd[d][h], hours[d][h], rates[d][h], top_rate)
            out.append(
                f'<rect class="heat-{level}" x="{fmt(left + h * cell_w + gap / 2)}" '
                f'y="{fmt(top + d * row_h + gap / 2)}" width="{fmt(cell_w - gap)}" height="{row_h - gap}">'
                f"<title>{escape(_week_tooltip(day, h, usd[d][h], hours[d][h]))}</title></rect>"
            )
    out.append("</g>")
    out += _heat_legend(left, legend_y, top_rate)
    out.append("</svg>")
    return Markup("".join(out))


def _level(usd: float, hours: int, rate: float, top_rate: float) -> str:
    if hours == 0:
        return "none"
    if usd <= 0 or top_rate <= 0:
        return "0"
    return str(min(HEAT_LEVELS, max(1, math.ceil(HEAT_LEVELS * rate / top_rate - 1e-9))))


def _week_tooltip(day: str, hour: int, usd: float, hours: int) -> str:
    when = f"{day} {hour:02}:00-{(hour + 1) % 24:02}:00 UTC"
    if hours == 0:
        return f"{when} \u00b7 no data"
    over = f"{hours} hour" if hours == 1 else f"{hours} hours"
    if usd <= 0:
        return f"{when} \u00b7 no waste over {over}"
    return f"{when} \u00b7 {money(usd)} wasted over {over} \u00b7 {money(usd / hours)} per hour"


def _heat_legend(x: float, y: float, top_rate: float) -> list[str]:
    """Swatches for no data, no waste and each shade (its range of dollars per hour in its tooltip)."""
    entries = [("none", "no data", "no data"), ("0", "no waste", "no waste")]
    if top_rate > 0:
        edges = [top_rate * i / HEAT_LEVELS for i in range(HEAT_LEVELS + 1)]
        entries += [
            (str(i), f"{money(edges[i - 1])}-{money(edges[i])} per hour", "") for i in range(1, HEAT_LEVELS + 1)
        ]
        entries[-1] = (entries[-1][0], entries[-1][1], f"up to {money(top_rate)} per hour")
    out = ['<g class="legend heat">']
    for level, tooltip, text in entries:
        out.append(
            f'<rect class="heat-{level}" x="{fmt(x)}" y="{fmt(y)}" width="10" height="10">'
            f"<title>{escape(tooltip)}</title></rect>"
        )
        x += 12
        if text:
            out.append(f'<text x="{fmt(x + 2)}" y="{fmt(y + 9)}">{escape(text)}</text>')
            x += 2 + len(text) * CHAR_W + 12
    out.append("</g>")
    return out
