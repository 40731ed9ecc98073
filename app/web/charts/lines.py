"""Line charts over time: a few series (`timeseries_svg`), or every device of an instance with a hover
column per time step listing all their values (`device_lines_svg`)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

from .svg import (
    CHAR_W,
    bucket_label,
    epoch,
    fmt,
    legend_layout,
    nice_axis,
    nice_step,
    svg_open,
    tick_label,
    time_label,
    time_ticks,
)

_DASH = "\u2013"
_MIN_COLUMN = 8.0
"""Narrowest hover column of `device_lines_svg`, units."""
SERIES_COLOURS = 8
"""Colours `series-1` .. `series-8` in static/app.css; `series_class` dashes the lines after them."""


@dataclass(frozen=True)
class Series:
    """One line of a time series chart; `None` values are gaps."""

    name: str
    points: Sequence[tuple[datetime, float | None]]
    css_class: str


def series_class(index: int) -> str:
    """The classes of the `index`-th line (from 0): the 8 series colours, then the same dashed, then dotted."""
    colour = f"series-{index % SERIES_COLOURS + 1}"
    round_ = index // SERIES_COLOURS
    return colour if round_ == 0 else f"{colour} dashed" if round_ == 1 else f"{colour} dotted"


@dataclass(frozen=True)
class _Plot:
    left: float
    top: float
    plot_w: float
    plot_h: float
    t0: float
    t1: float


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
    out, _ = _draw(series, start, end, step_s, y_label, y_max, width, height, title)
    out.append("</svg>")
    return Markup("".join(out))


def device_lines_svg(
    series: Sequence[Series],
    *,
    start: datetime,
    end: datetime,
    step_s: int,
    y_label: str,
    y_max: float | None = None,
    unit: str = "",
    title: str,
    width: int = 640,
    height: int = 200,
) -> Markup:
    """`timeseries_svg` for many devices at once (the GPUs and MIG slices of one instance).

    Over the lines lies one invisible full-height column per time step whose `<title>` gives the step's time
    and every device's value there ("GPU 3: 42.0 %", `unit` after the number; a dash for none), so hovering
    anywhere shows them all. A device's value at a step is its point nearest to it, within half a step;
    steps where no device has one get no column. Where steps are narrower than 8 units, a column covers
    several and shows the values at its middle. Give each series a class from `series_class` so 8 colours
    stretch to 24 lines.
    """
    # Each point's time in epoch seconds once, for its line and for the hover columns.
    times = [_epochs(s.points) for s in series]
    out, plot = _draw(series, start, end, step_s, y_label, y_max, width, height, title, times)
    x_scale = plot.plot_w / (plot.t1 - plot.t0)
    # Columns at least _MIN_COLUMN wide: a day at 30 s would otherwise repeat every device's name 2880 times.
    every = step_s * max(1, math.ceil(_MIN_COLUMN / (step_s * x_scale)))
    steps = int((plot.t1 - plot.t0) // every) + 1
    nearest = [_nearest(s.points, at, plot.t0, every, steps) for s, at in zip(series, times, strict=True)]
    suffix = f" {unit}" if unit else ""
    half = every * x_scale / 2
    right = plot.left + plot.plot_w
    # Invisible, yet they take the pointer: painted by attributes, so even without the stylesheet.
    out.append('<g class="hover" fill="none" pointer-events="all">')
    for k in range(steps):
        if not any(k in found for found in nearest):
            continue
        t = plot.t0 + k * every
        x = plot.left + k * every * x_scale
        x0, x1 = max(plot.left, x - half), min(right, x + half)
        lines = [bucket_label(datetime.fromtimestamp(t, UTC), every)]
        for s, found in zip(series, nearest, strict=True):
            v = found.get(k)
            lines.append(f"{s.name}: {_DASH if v is None else f'{v:.1f}{suffix}'}")
        out.append(
            f'<rect x="{fmt(x0)}" y="{fmt(plot.top)}" width="{fmt(x1 - x0)}" height="{fmt(plot.plot_h)}">'
            f"<title>{escape(chr(10).join(lines))}</title></rect>"
        )
    out.append("</g></svg>")
    return Markup("".join(out))


def _draw(
    series: Sequence[Series],
    start: datetime,
    end: datetime,
    step_s: float,
    y_label: str,
    y_max: float | None,
    width: int,
    height: int,
    title: str,
    times: Sequence[Sequence[float]] | None = None,
) -> tuple[list[str], _Plot]:
    """Everything of a line chart but the closing tag, and where its plot lies. `times`: each series' point times
    in epoch seconds, when the caller has them already."""
    t0, t1 = epoch(start), epoch(end)
    if t1 <= t0:
        raise ValueError("end must be after start")
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    left, right, top, bottom = 40, 10, 22, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    # The legend follows the axis label and wraps; extra rows make the chart taller, not the plot smaller.
    legend = legend_layout(
        [18 + len(s.name) * CHAR_W for s in series], left + len(y_label) * CHAR_W + 16, left, width - right
    )
    extra = 14 * max((row for _, row in legend), default=0)
    top += extra
    height += extra
    if y_max is None or y_max <= 0:
        peak = max(
            (v for s in series for _, v in s.points if v is not None and math.isfinite(v)),
            default=0.0,
        )
        y_top, y_step = nice_axis(peak)
    else:
        y_top = y_max
        y_step = nice_step(y_max / 4)
    x_scale = plot_w / (t1 - t0)
    y_scale = plot_h / y_top
    bottom_y = top + plot_h

    out = svg_open("chart-timeseries", width, height, title)
    out.append(f'<text class="axis-label" x="{left}" y="12">{escape(y_label)}</text>')
    out.append('<g class="grid">')
    for i in range(int(y_top / y_step + 1e-9) + 1):
        value = i * y_step
        y = fmt(bottom_y - value * y_scale)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{left - 4}" y="{y}" dy="3.5" text-anchor="end">{tick_label(value)}</text>')
    ticks, tick_step = time_ticks(t0, t1, max(2, plot_w // 72))
    for t in ticks:
        x = left + (t - t0) * x_scale
        anchor = "end" if x + 18 > width else "middle"
        out.append(f'<line class="x" x1="{fmt(x)}" x2="{fmt(x)}" y1="{top}" y2="{bottom_y}"/>')
        out.append(
            f'<text class="tick" x="{fmt(x)}" y="{bottom_y + 13}" text-anchor="{anchor}">'
            f"{time_label(t, tick_step)}</text>"
        )
    out.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{bottom_y}" y2="{bottom_y}"/>')
    out.append("</g>")

    drawn = False
    for n, s in enumerate(series):
        cls, name = escape(s.css_class), escape(s.name)
        at = times[n] if times is not None else _epochs(s.points)
        paths, dots = _polylines(s.points, at, t0, t1, 1.5 * step_s, left, x_scale, bottom_y, y_top, y_scale)
        if paths:
            out.append(f'<path class="line series {cls}" d="{paths}"><title>{name}</title></path>')
        for cx, cy in dots:
            out.append(f'<circle class="dot series {cls}" cx="{cx}" cy="{cy}" r="1.8"><title>{name}</title></circle>')
        drawn = drawn or bool(paths or dots)
    if not drawn:
        out.append(
            f'<text class="no-data" x="{fmt(left + plot_w / 2)}" y="{fmt(top + plot_h / 2)}" '
            'text-anchor="middle">no data</text>'
        )

    out.append('<g class="legend">')
    for s, (x, row) in zip(series, legend, strict=True):
        ly = 8 + 14 * row
        out.append(
            f'<line class="key series {escape(s.css_class)}" x1="{fmt(x)}" x2="{fmt(x + 14)}" y1="{ly}" y2="{ly}"/>'
        )
        out.append(f'<text x="{fmt(x + 18)}" y="{ly + 4}">{escape(s.name)}</text>')
    out.append("</g>")
    return out, _Plot(left, top, plot_w, plot_h, t0, t1)


def _epochs(points: Sequence[tuple[datetime, float | None]]) -> list[float]:
    """The points' times, epoch s. A series' times are all aware (from the database) or all naive (UTC)."""
    if points and points[0][0].tzinfo is not None:
        return [when.timestamp() for when, _v in points]
    return [epoch(when) for when, _v in points]


def _nearest(
    points: Sequence[tuple[datetime, float | None]], times: Sequence[float], t0: float, every: float, steps: int
) -> dict[int, float]:
    """Hover column k (at t0 + k x every, k < steps) -> the value of the series' point nearest to it, of those
    with a value and within half a column; on a tie, the earlier point. Columns are found by bisection over the
    points' times (in order), not point by point: a day at 5 minutes is 288 points per device, 24 devices."""
    at = [t for t, (_w, v) in zip(times, points, strict=True) if v is not None and math.isfinite(v)]
    values = [v for _w, v in points if v is not None and math.isfinite(v)]
    out: dict[int, float] = {}
    if not at:
        return out
    half = every / 2
    first = max(0, math.ceil((at[0] - t0 - half) / every))
    last = min(steps - 1, math.floor((at[-1] - t0 + half) / every))
    n = len(at)
    for k in range(first, last + 1):
        tk = t0 + k * every
        i = bisect_left(at, tk)
        left = tk - at[i - 1] if i > 0 else math.inf
        right = at[i] - tk if i < n else math.inf
        if left <= right:
            if left <= half:
                out[k] = values[i - 1]
        elif right <= half:
            out[k] = values[i]
    return out


def _polylines(
    points: Sequence[tuple[datetime, float | None]],
    times: Sequence[float],
    t0: float,
    t1: float,
    max_gap: float,
    left: float,
    x_scale: float,
    bottom_y: float,
    y_top: float,
    y_scale: float,
) -> tuple[str, list[tuple[str, str]]]:
    """Path data with one `M` segment per unbroken run of points (`times`: theirs, epoch s), and the lone points
    of one-point runs."""
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
    isfinite = math.isfinite
    for t, (_when, value) in zip(times, points, strict=True):
        if value is None or not isfinite(value):
            # Slices have no power and NVML measures no utilization on some: runs of None are common.
            if xs:
                end_run()
            prev = None
            continue
        if not t0 <= t <= t1:
            if xs:
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
