"""Server-rendered SVG charts: time series, a 100% state bar and MIG slice layouts.

Every function returns `Markup` ready to drop into a template; all text in it is escaped and nothing needs
JavaScript. Colours come from `static/app.css` through the classes `state-<state>` and `series-<n>`, which
set the CSS `color` that lines, areas and stripes paint with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from markupsafe import Markup, escape

ACTIVE = "active"
IDLE_HELD = "idle-held"
IDLE = "idle"
UNPARTITIONED = "unpartitioned"
UNKNOWN = "unknown"
OFFLINE = "offline"
STATES = (ACTIVE, IDLE_HELD, IDLE, UNPARTITIONED, UNKNOWN, OFFLINE)
"""Every state the dashboard colours, in the order bars and legends show them."""

STATE_LABELS = {
    ACTIVE: "active",
    IDLE_HELD: "idle, held",
    IDLE: "idle",
    UNPARTITIONED: "unpartitioned",
    UNKNOWN: "unknown",
    OFFLINE: "offline",
}
STATE_HELP = {
    ACTIVE: "Utilization at or above the idle bound.",
    IDLE_HELD: "Under the idle bound, but a process runs or memory is allocated.",
    IDLE: "Under the idle bound, no process, no memory held.",
    UNPARTITIONED: "MIG compute slices no instance was created on: idle capacity.",
    UNKNOWN: "The hardware reported no utilization figure: neither idle nor active.",
    OFFLINE: "No data came: instance stopped or agent down.",
}
# Drawn striped or dotted over a light fill so they never read as a solid colour.
_HATCHED = frozenset({UNPARTITIONED, UNKNOWN})

_SVG_NS = "http://www.w3.org/2000/svg"
_CHAR_W = 6.2  # rough width of one character of the 11px chart font, for layout only


def state_class(state: str) -> str:
    """The CSS class of a state; anything unrecognised is drawn as unknown."""
    return f"state-{state}" if state in STATE_LABELS else "state-unknown"


def state_label(state: str) -> str:
    return STATE_LABELS.get(state, state)


@dataclass(frozen=True)
class Series:
    """One line of a time series chart; `None` values are gaps."""

    name: str
    points: Sequence[tuple[datetime, float | None]]
    css_class: str


@dataclass(frozen=True)
class MigSlot:
    """A block of a MIG layout: a slice instance, or compute slices nobody created one on."""

    start: int
    """First compute-slice column, 0-6."""
    size: int
    """Compute slices it spans, 1-7."""
    label: str
    state: str
    detail: str
    """Tooltip text."""

    def __post_init__(self) -> None:
        if not (0 <= self.start <= 6 and 1 <= self.size <= 7 and self.start + self.size <= 7):
            raise ValueError(f"MIG slot {self.label!r} at {self.start}+{self.size} does not fit in 7 columns")
        if self.state not in STATE_LABELS:
            raise ValueError(f"MIG slot {self.label!r} has unknown state {self.state!r}")


def _svg_open(kind: str, width: int, height: int, title: str, label: str | None = None) -> list[str]:
    return [
        f'<svg class="chart {kind}" xmlns="{_SVG_NS}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(label or title)}">',
        f"<title>{escape(title)}</title>",
    ]


def _f(value: float) -> str:
    """A coordinate with one decimal, without a trailing `.0`."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _epoch(when: datetime) -> float:
    # Naive datetimes are UTC throughout the server.
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `raw`."""
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 2.5, 5.0, 10.0):
        if factor * power >= raw * (1 - 1e-9):
            return factor * power
    return 10.0 * power


def _tick_label(value: float) -> str:
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.3g}{suffix}"
    return f"{value:.3g}"


_TIME_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 1209600)


def _time_ticks(t0: float, t1: float, max_ticks: int) -> tuple[list[float], int]:
    step = next((s for s in _TIME_STEPS if (t1 - t0) / s <= max_ticks), _TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    return [float(t) for t in range(int(first), int(t1) + 1, step)], step


def _time_label(t: float, step: int) -> str:
    when = datetime.fromtimestamp(t, UTC)
    if step >= 86400 or (when.hour == 0 and when.minute == 0):
        return f"{when.day} {when:%b}"
    return f"{when:%H:%M}"


def timeseries_svg(
    series: Sequence[Series],
    *,
    start: datetime,
    end: datetime,
    step_s: float,
    y_label: str,
    y_max: float | None = None,
    width: int = 640,
    height: int = 160,
    title: str,
) -> Markup:
    """A line chart of `series` over [start, end] in UTC.

    A line breaks where a value is None or two points lie more than 1.5 x `step_s` apart, so missing data
    shows as a gap. `y_max` fixes the top of the axis (100 for percentages); otherwise it is rounded up
    from the data.
    """
    t0, t1 = _epoch(start), _epoch(end)
    if t1 <= t0:
        raise ValueError("end must be after start")
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    left, right, top, bottom = 40, 10, 22, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    # The legend follows the axis label and wraps; extra rows make the chart taller, not the plot smaller.
    legend = _legend_layout([s.name for s in series], left + len(y_label) * _CHAR_W + 16, left, width - right)
    extra = 14 * max((row for _, row in legend), default=0)
    top += extra
    height += extra
    if y_max is None or y_max <= 0:
        peak = max(
            (v for s in series for _, v in s.points if v is not None and math.isfinite(v)),
            default=0.0,
        )
        y_step = _nice_step(peak / 4) if peak > 0 else 0.25
        y_top = math.ceil(peak / y_step - 1e-9) * y_step if peak > 0 else 1.0
    else:
        y_top = y_max
        y_step = _nice_step(y_max / 4)
    x_scale = plot_w / (t1 - t0)
    y_scale = plot_h / y_top
    bottom_y = top + plot_h

    out = _svg_open("chart-timeseries", width, height, title)
    out.append(f'<text class="axis-label" x="{left}" y="12">{escape(y_label)}</text>')
    out.append('<g class="grid">')
    for i in range(int(y_top / y_step + 1e-9) + 1):
        value = i * y_step
        y = _f(bottom_y - value * y_scale)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{left - 4}" y="{y}" dy="3.5" text-anchor="end">{_tick_label(value)}</text>')
    ticks, tick_step = _time_ticks(t0, t1, max(2, plot_w // 72))
    for t in ticks:
        x = left + (t - t0) * x_scale
        anchor = "end" if x + 18 > width else "middle"
        out.append(f'<line class="x" x1="{_f(x)}" x2="{_f(x)}" y1="{top}" y2="{bottom_y}"/>')
        out.append(
            f'<text class="tick" x="{_f(x)}" y="{bottom_y + 13}" text-anchor="{anchor}">'
            f"{_time_label(t, tick_step)}</text>"
        )
    out.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{bottom_y}" y2="{bottom_y}"/>')
    out.append("</g>")

    drawn = False
    for s in series:
        cls, name = escape(s.css_class), escape(s.name)
        paths, dots = _polylines(s.points, t0, t1, 1.5 * step_s, left, x_scale, bottom_y, y_top, y_scale)
        if paths:
            out.append(f'<path class="line series {cls}" d="{paths}"><title>{name}</title></path>')
        for cx, cy in dots:
            out.append(f'<circle class="dot series {cls}" cx="{cx}" cy="{cy}" r="1.8"><title>{name}</title></circle>')
        drawn = drawn or bool(paths or dots)
    if not drawn:
        out.append(
            f'<text class="no-data" x="{_f(left + plot_w / 2)}" y="{_f(top + plot_h / 2)}" '
            'text-anchor="middle">no data</text>'
        )

    out.append('<g class="legend">')
    for s, (x, row) in zip(series, legend, strict=True):
        ly = 8 + 14 * row
        out.append(
            f'<line class="key series {escape(s.css_class)}" x1="{_f(x)}" x2="{_f(x + 14)}" y1="{ly}" y2="{ly}"/>'
        )
        out.append(f'<text x="{_f(x + 18)}" y="{ly + 4}">{escape(s.name)}</text>')
    out.append("</g></svg>")
    return Markup("".join(out))


def _legend_layout(names: Sequence[str], first_x: float, left: float, right: float) -> list[tuple[float, int]]:
    """Where each legend entry starts: (x, row), rows after the first starting at `left`."""
    places: list[tuple[float, int]] = []
    x, row = first_x, 0
    for name in names:
        item_w = 18 + len(name) * _CHAR_W
        if x + item_w > right and x > (first_x if row == 0 else left):
            x, row = left, row + 1
        places.append((x, row))
        x += item_w + 12
    return places


def _polylines(
    points: Sequence[tuple[datetime, float | None]],
    t0: float,
    t1: float,
    max_gap: float,
    left: float,
    x_scale: float,
    bottom_y: float,
    y_top: float,
    y_scale: float,
) -> tuple[str, list[tuple[str, str]]]:
    """Path data with one `M` segment per unbroken run of points, and the lone points of one-point runs."""
    paths: list[str] = []
    dots: list[tuple[str, str]] = []
    # Coordinates in integer tenths of a pixel: cheap to compare and to print with one decimal.
    xs: list[int] = []
    ys: list[int] = []
    x0, x10 = 10 * (left - t0 * x_scale), 10 * x_scale
    y0, y10 = 10 * bottom_y, 10 * y_scale

    def end_run() -> None:
        if len(xs) > 1:
            run = zip(xs, ys, strict=True) if len(xs) <= 2 * (xs[-1] - xs[0]) // 10 + 2 else _thin(xs, ys)
            paths.append("M" + " ".join([f"{_tenths(x)},{_tenths(y)}" for x, y in run]))
        elif xs:
            dots.append((_tenths(xs[0]), _tenths(ys[0])))
        xs.clear()
        ys.clear()

    prev: float | None = None
    for when, value in points:
        if value is None or not math.isfinite(value):
            end_run()
            prev = None
            continue
        t = when.timestamp() if when.tzinfo is not None else _epoch(when)
        if not t0 <= t <= t1:
            end_run()
            prev = None
            continue
        if prev is not None and (t - prev > max_gap or t < prev):
            end_run()
        prev = t
        x = round(x0 + t * x10)
        y = round(y0 - (y_top if value > y_top else value if value > 0 else 0.0) * y10)
        # The middle of a flat run adds nothing to the line: idle hours collapse to their two ends.
        if len(ys) > 1 and ys[-1] == y and ys[-2] == y:
            xs[-1] = x
        else:
            xs.append(x)
            ys.append(y)
    end_run()
    return "".join(paths), dots


def _thin(xs: list[int], ys: list[int]) -> list[tuple[int, int]]:
    """The lowest and highest point of each one-pixel column (in their order), and the run's two ends.

    A denser line draws the same pixels: a day at 30 s is ~5 points per pixel on a 640 px chart.
    """
    out = [(xs[0], ys[0])]
    i, n = 1, len(xs) - 1
    while i < n:
        column = xs[i] // 10
        lo = hi = i
        j = i + 1
        while j < n and xs[j] // 10 == column:
            if ys[j] < ys[lo]:
                lo = j
            elif ys[j] > ys[hi]:
                hi = j
            j += 1
        out += [(xs[k], ys[k]) for k in ((lo, hi) if lo < hi else (hi, lo) if hi < lo else (lo,))]
        i = j
    out.append((xs[-1], ys[-1]))
    return out


def _tenths(value: int) -> str:
    whole, tenth = divmod(value, 10)
    return f"{whole}.{tenth}" if tenth else str(whole)


@lru_cache(maxsize=256)
def _hatch(w: float, h: float, spacing: float = 5.0) -> str:
    """Path data of `/` diagonals across a w x h rectangle at the origin, clipped to it (no clipPath ids to
    collide); kept per size, since a MIG page draws hundreds of blocks of a few sizes."""
    parts: list[str] = []
    c = spacing
    while c < w + h:
        u1, u2 = max(0.0, c - h), min(w, c)
        parts.append(f"M{_f(u1)},{_f(c - u1)}L{_f(u2)},{_f(c - u2)}")
        c += spacing
    return "".join(parts)


def _block(state: str, x: float, y: float, w: float, h: float, *, kind: str, tooltip: str, text: str) -> str:
    """A state-coloured rectangle (striped or dotted where the state is hatched) with a tooltip and a label."""
    hatch = ""
    if state in _HATCHED:
        hatch = f'<path class="hatch" transform="translate({_f(x)},{_f(y)})" d="{_hatch(round(w, 1), round(h, 1))}"/>'
    label = ""
    if text and len(text) * _CHAR_W + 4 <= w and h >= 12:
        label = f'<text x="{_f(x + w / 2)}" y="{_f(y + h / 2)}" dy="3.5" text-anchor="middle">{escape(text)}</text>'
    return (
        f'<g class="{kind} {state_class(state)}"><title>{escape(tooltip)}</title>'
        f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(h)}"/>{hatch}{label}</g>'
    )


def state_bar_svg(
    shares: Mapping[str, float], *, width: int = 320, height: int = 16, label: str = "Time by state"
) -> Markup:
    """One 100% bar of `shares` (any non-negative weights: fractions, seconds, dollars) in `STATES` order."""
    unknown = set(shares) - set(STATES)
    if unknown:
        raise ValueError(f"unknown state(s): {', '.join(sorted(unknown))}")
    if any(v < 0 or not math.isfinite(v) for v in shares.values()):
        raise ValueError("shares must be finite and non-negative")
    total = sum(shares.values())
    parts = [f"{state_label(s)} {100 * shares[s] / total:.1f}%" for s in STATES if total > 0 and shares.get(s, 0) > 0]
    out = _svg_open("chart-statebar", width, height, label, f"{label}: {', '.join(parts) or 'no data'}")
    if total <= 0:
        out.append(f'<rect class="empty" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}"/>')
        out.append("</svg>")
        return Markup("".join(out))
    cum = 0.0
    x = 0.0
    for state in STATES:
        share = shares.get(state, 0.0)
        if share <= 0:
            continue
        cum += share
        # Edges from the running sum, so the segments always add up to the full width.
        end = round(width * cum / total, 1)
        w = end - x
        pct = 100 * share / total
        tooltip = f"{state_label(state)}: {pct:.1f}%"
        out.append(_block(state, x, 0, w, height, kind="seg", tooltip=tooltip, text=f"{pct:.0f}%"))
        x = end
    out.append("</svg>")
    return Markup("".join(out))


def mig_layout_svg(
    slots: Sequence[MigSlot], *, width: int = 168, height: int = 28, title: str = "MIG layout"
) -> Markup:
    """A GPU as 7 compute-slice columns with its slice instances (and unpartitioned capacity) on them."""
    pad = 1.5
    col = (width - 2 * pad) / 7
    summary = "; ".join(f"{s.label} {state_label(s.state)}" for s in sorted(slots, key=lambda s: s.start))
    out = _svg_open("chart-mig", width, height, title, f"{title}: {summary or 'no slices'}")
    out.append(f'<rect class="gpu" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" rx="2"/><g class="cols">')
    for i in range(1, 7):
        cx = _f(pad + i * col)
        out.append(f'<line x1="{cx}" x2="{cx}" y1="{pad}" y2="{_f(height - pad)}"/>')
    out.append("</g>")
    inner_h = height - 2 * pad - 2
    for slot in slots:
        x = pad + slot.start * col + 1
        w = slot.size * col - 2
        tooltip = slot.detail or f"{slot.label}: {state_label(slot.state)}"
        out.append(_block(slot.state, x, pad + 1, w, inner_h, kind="slot", tooltip=tooltip, text=slot.label))
    out.append("</svg>")
    return Markup("".join(out))
