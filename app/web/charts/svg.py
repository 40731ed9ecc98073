"""Shared pieces of the SVG charts: the open tag, coordinates, axis ticks, time and money labels, chart ids.

Sizes are viewBox units; the `svg.chart` rules in `static/app.css` scale every chart to its container.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlsplit

from markupsafe import Markup, escape

SVG_NS = "http://www.w3.org/2000/svg"
CHAR_W = 6.2
"""Rough width of one character of the 11px chart font, for layout only."""
NO_DATA = "No data in this window"

CHART_ID = "<@>"
"""Stands for the chart's id in ids and `url(#...)` references until `finish` replaces it. Escaped text never
holds a raw `<`, so only the places that mean the id do."""


def svg_open(kind: str, width: float, height: float, title: str, label: str | None = None) -> list[str]:
    """The `<svg>` tag and its `<title>`; `label` (the accessible name) defaults to the title."""
    w, h = fmt(width), fmt(height)
    return [
        f'<svg class="chart {kind}" xmlns="{SVG_NS}" viewBox="0 0 {w} {h}" width="{w}" '
        f'height="{h}" role="img" aria-label="{escape(label or title)}">',
        f"<title>{escape(title)}</title>",
    ]


def finish(parts: Sequence[str]) -> Markup:
    """Join a chart and give it its id: a digest of its own text, so the same chart always reads the same
    and two different charts on one page never share a pattern id."""
    body = "".join(parts)
    if CHART_ID not in body:
        return Markup(body)
    digest = hashlib.blake2b(body.encode(), digest_size=5).hexdigest()
    return Markup(body.replace(CHART_ID, f"c{digest}"))


def fmt(value: float) -> str:
    """A coordinate with one decimal, without a trailing `.0`."""
    text = f"{value:.1f}"
    if text == "-0.0":
        return "0"
    return text[:-2] if text.endswith(".0") else text


def epoch(when: datetime) -> float:
    """Seconds since the epoch; naive datetimes are UTC throughout the server."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `raw`."""
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        if factor * power >= raw * (1 - 1e-9):
            return factor * power
    return 10.0 * power


def nice_axis(peak: float, ticks: int = 4) -> tuple[float, float]:
    """(top, step) of a y axis from 0 that holds `peak` in about `ticks` round steps."""
    if not peak > 0 or not math.isfinite(peak):
        return 1.0, 0.25
    step = nice_step(peak / ticks)
    return math.ceil(peak / step - 1e-9) * step, step


def tick_label(value: float) -> str:
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.3g}{suffix}"
    return f"{value:.3g}"


def money(value: float) -> str:
    """US dollars with cents and thousands separators: `$1,234.56`, `-$0.50`."""
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def money_tick(value: float, step: float) -> str:
    """A dollar axis label: cents only where the step needs them, `k`/`M` from $100k."""
    if abs(value) >= 1e5:
        return f"${tick_label(value)}"
    return f"${value:,.2f}" if step < 1 else f"${value:,.0f}"


_TIME_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 1209600)


def time_ticks(t0: float, t1: float, max_ticks: int) -> tuple[list[float], int]:
    """Round times in [t0, t1] (epoch s), at most about `max_ticks` of them, and their spacing, s."""
    step = next((s for s in _TIME_STEPS if (t1 - t0) / s <= max_ticks), _TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    return [float(t) for t in range(int(first), int(t1) + 1, step)], step


def time_label(t: float, step: int) -> str:
    """An axis label: the time of day, or the date at midnight and for ticks a day or more apart."""
    when = datetime.fromtimestamp(t, UTC)
    if step >= 86400 or (when.hour == 0 and when.minute == 0):
        return f"{when.day} {when:%b}"
    return f"{when:%H:%M}"


def bucket_label(when: datetime, step_s: float) -> str:
    """Names a bucket by its start: `2026-11-20 14:00 UTC`, or `2026-11-20 UTC` for day buckets."""
    at = datetime.fromtimestamp(epoch(when), UTC)
    if step_s >= 86400 and at.hour == 0 and at.minute == 0:
        return f"{at:%Y-%m-%d} UTC"
    return f"{at:%Y-%m-%d %H:%M} UTC"


def time_axis(
    t0: float, t1: float, *, left: float, plot_w: float, top: float, bottom: float, label_y: float
) -> list[str]:
    """Dashed vertical guides from `top` to `bottom` at round times, labelled at `label_y`."""
    out: list[str] = []
    if t1 <= t0:
        return out
    x_scale = plot_w / (t1 - t0)
    ticks, step = time_ticks(t0, t1, max(2, int(plot_w // 72)))
    for t in ticks:
        x = left + (t - t0) * x_scale
        anchor = "end" if x + 18 > left + plot_w + 10 else "middle"
        out.append(f'<line class="x" x1="{fmt(x)}" x2="{fmt(x)}" y1="{fmt(top)}" y2="{fmt(bottom)}"/>')
        out.append(
            f'<text class="tick" x="{fmt(x)}" y="{fmt(label_y)}" text-anchor="{anchor}">{time_label(t, step)}</text>'
        )
    return out


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, the last one an ellipsis when anything was cut."""
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - 1)] + "\u2026"


def legend_layout(
    widths: Sequence[float], first_x: float, left: float, right: float, gap: float = 12
) -> list[tuple[float, int]]:
    """Where each legend entry of the given widths starts: (x, row), rows after the first starting at `left`."""
    places: list[tuple[float, int]] = []
    x, row = first_x, 0
    for item_w in widths:
        if x + item_w > right and x > (first_x if row == 0 else left):
            x, row = left, row + 1
        places.append((x, row))
        x += item_w + gap
    return places


def no_data(x: float, y: float, text: str = NO_DATA) -> str:
    return f'<text class="no-data" x="{fmt(x)}" y="{fmt(y)}" text-anchor="middle">{escape(text)}</text>'


def hit_rect(x: float, y: float, w: float, h: float) -> str:
    """An invisible rectangle that still takes the pointer, so its group's `<title>` shows anywhere over it.
    Painted by attributes, not CSS, so it stays invisible even without the stylesheet."""
    return (
        f'<rect class="hit" x="{fmt(x)}" y="{fmt(y)}" width="{fmt(w)}" height="{fmt(h)}" '
        'fill="none" pointer-events="all"/>'
    )


def row_label(label: str, href: str | None, *, x: float, y: float, max_chars: int) -> str:
    """A row's name ending at x (right-aligned), cut to `max_chars` with the whole name as its tooltip, and a
    link when `href` is given (relative, http or https only)."""
    text = (
        f'<text class="row-label" x="{fmt(x)}" y="{fmt(y)}" dy="3.5" text-anchor="end">'
        f"<title>{escape(label)}</title>{escape(truncate(label, max_chars))}</text>"
    )
    if href is None:
        return text
    if urlsplit(href).scheme not in ("", "http", "https"):
        raise ValueError(f"refusing to link to {href!r}")
    return f'<a href="{escape(href)}">{text}</a>'


def empty_chart(kind: str, width: float, height: float, title: str) -> Markup:
    """A chart with nothing to draw: its title and "No data in this window" in the middle."""
    parts = svg_open(kind, width, height, title, f"{title}: no data")
    return Markup("".join([*parts, no_data(width / 2, height / 2 + 4), "</svg>"]))
