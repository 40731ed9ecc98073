"""State strips: one thin bar per device coloured by its state over time, on a shared time axis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

from .states import STATES, check_states, hatch_defs, paint, state_class, state_label, state_legend
from .svg import CHAR_W, empty_chart, epoch, finish, fmt, row_label, svg_open, time_axis


@dataclass(frozen=True)
class StripRow:
    """A device's strip: its name, its stretches of one state (start, end, state), and a link to its page.
    Time no span covers is left blank: no data."""

    label: str
    spans: Sequence[tuple[datetime, datetime, str]]
    href: str | None = None


def state_strip_svg(
    rows: Sequence[StripRow],
    *,
    start: datetime,
    end: datetime,
    width: int = 640,
    title: str,
    label_width: int = 110,
    strip_height: int = 8,
) -> Markup:
    """One strip per row over [start, end] (UTC), each span in its state's colour with a tooltip such as
    "GPU 2 · idle · 14:00-17:00 UTC (3 h)"; spans are clipped to the window. The time axis is below the
    strips, the legend of the states shown below that."""
    t0, t1 = epoch(start), epoch(end)
    if t1 <= t0:
        raise ValueError("end must be after start")
    check_states(state for row in rows for _, _, state in row.spans)
    clipped = [
        [(max(a, t0), min(b, t1), state) for a, b, state in ((epoch(s), epoch(e), st) for s, e, st in row.spans)]
        for row in rows
    ]
    clipped = [[span for span in row if span[1] > span[0]] for row in clipped]
    if not any(clipped):
        return empty_chart("chart-strip", width, 60, title)

    pitch = strip_height + 6
    top = 4
    plot_w = width - label_width - 10
    plot_h = pitch * len(rows) - 6
    bottom = top + plot_h
    x_scale = plot_w / (t1 - t0)
    present = [s for s in STATES if any(span[2] == s for row in clipped for span in row)]
    legend, legend_rows = state_legend(present, x=label_width, y=bottom + 22, right=width - 10)
    height = bottom + 22 + 14 * legend_rows
    multi_day = t1 - t0 > 86400 or _day(t0) != _day(t1 - 1)

    out = svg_open("chart-strip", width, height, title, f"{title}: {len(rows)} devices")
    out.append(hatch_defs())
    out.append('<g class="grid">')
    out += time_axis(t0, t1, left=label_width, plot_w=plot_w, top=top, bottom=bottom + 3, label_y=bottom + 15)
    out.append("</g>")
    max_chars = max(1, int((label_width - 10) // CHAR_W))
    for r, (row, spans) in enumerate(zip(rows, clipped, strict=True)):
        y = top + r * pitch
        out.append(row_label(row.label, row.href, x=label_width - 6, y=y + strip_height / 2, max_chars=max_chars))
        out.append(
            f'<rect class="track" x="{label_width}" y="{fmt(y)}" width="{fmt(plot_w)}" height="{strip_height}"/>'
        )
        for a, b, state in spans:
            tooltip = f"{row.label} \u00b7 {state_label(state)} \u00b7 {_span_text(a, b, multi_day)}"
            x0 = label_width + (a - t0) * x_scale
            out.append(
                f'<rect class="{state_class(state)}" x="{fmt(x0)}" y="{fmt(y)}" width="{fmt((b - a) * x_scale)}" '
                f'height="{strip_height}" fill="{paint(state)}"><title>{escape(tooltip)}</title></rect>'
            )
    out += legend
    out.append("</svg>")
    return finish(out)


def _day(t: float) -> int:
    return int(t // 86400)


def _span_text(a: float, b: float, multi_day: bool) -> str:
    """`14:00-17:00 UTC (3 h)`, with dates where the window or the span crosses midnight."""
    start, end = datetime.fromtimestamp(a, UTC), datetime.fromtimestamp(b, UTC)
    if not multi_day and _day(a) == _day(b - 1):
        when = f"{start:%H:%M}-{end:%H:%M} UTC"
    elif _day(a) == _day(b - 1):
        when = f"{start.day} {start:%b %H:%M}-{end:%H:%M} UTC"
    else:
        when = f"{start.day} {start:%b %H:%M} - {end.day} {end:%b %H:%M} UTC"
    return f"{when} ({_duration(b - a)})"


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"
    return f"{seconds / 86400:.1f}".removesuffix(".0") + " d"
