"""Line charts: gaps stay gaps, text is escaped, dense series are thinned, many devices hover as columns."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from markupsafe import Markup

from app.web.charts import Series, device_lines_svg, series_class, timeseries_svg

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 21, 0, 0, tzinfo=UTC)


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


def points(
    values: Sequence[float | None], step_s: float = 30.0, start: datetime = START
) -> list[tuple[datetime, float | None]]:
    return [(start + timedelta(seconds=i * step_s), v) for i, v in enumerate(values)]


def segments(svg: Markup) -> list[list[tuple[float, float]]]:
    """The runs of every series' path, as lists of (x, y)."""
    runs = []
    for path in parse(svg).iter(f"{SVG}path"):
        if "line" not in path.get("class", "").split():
            continue
        for run in path.get("d", "").split("M")[1:]:
            runs.append([(float(x), float(y)) for x, y in (p.split(",") for p in run.split())])
    return runs


def chart(
    series: list[Series],
    *,
    minutes: int = 10,
    step_s: float = 30.0,
    y_max: float | None = None,
    y_label: str = "Utilization, %",
    title: str = "GPU 0",
) -> Markup:
    end = START + timedelta(minutes=minutes)
    return timeseries_svg(series, start=START, end=end, step_s=step_s, y_label=y_label, y_max=y_max, title=title)


def test_none_values_break_the_line() -> None:
    svg = chart([Series("GPU 0", points([10, 20, 30, None, 40, 50, None, None, 60, 70]), "series-1")], y_max=100)
    runs = segments(svg)
    assert [len(r) for r in runs] == [3, 2, 2]
    # Nothing joins the runs: each starts right of where the previous ended.
    assert runs[0][-1][0] < runs[1][0][0] and runs[1][-1][0] < runs[2][0][0]


def test_time_gaps_break_the_line() -> None:
    pts = points([10, 20, 30]) + points([40, 50], start=START + timedelta(seconds=30 * 2 + 46))
    svg = chart([Series("GPU 0", pts, "series-1")], y_max=100)
    assert [len(r) for r in segments(svg)] == [3, 2]
    # Up to 1.5 steps apart is still one line.
    pts = points([10, 20, 30]) + points([40, 50], start=START + timedelta(seconds=30 * 2 + 45))
    assert [len(r) for r in segments(chart([Series("GPU 0", pts, "series-1")], y_max=100))] == [5]


def test_lone_points_are_dots() -> None:
    svg = chart([Series("GPU 0", points([None, 42, None, 10, 20]), "series-1")], y_max=100)
    root = parse(svg)
    assert len(list(root.iter(f"{SVG}circle"))) == 1
    assert [len(r) for r in segments(svg)] == [2]


def test_flat_runs_collapse_but_keep_their_ends() -> None:
    svg = chart([Series("GPU 0", points([0.0] * 20 + [50.0]), "series-1")], y_max=100)
    (run,) = segments(svg)
    assert len(run) == 3
    assert run[0][1] == run[1][1] != run[2][1]


def test_values_are_clamped_and_points_outside_the_window_dropped() -> None:
    pts = [(START - timedelta(minutes=1), 50.0), *points([150.0, -5.0, 50.0])]
    (run,) = segments(chart([Series("x", pts, "series-1")], y_max=100))
    top, bottom = 22.0, 160 - 18.0
    assert run[0] == (40.0, top) and run[1][1] == bottom


def test_text_is_escaped() -> None:
    evil = "<script>alert(1)</script>"
    svg = chart([Series(evil, points([1, 2, 3]), 'x" onload="alert(1)')], y_max=100, y_label=evil, title=evil)
    text = str(svg)
    assert "<script>" not in text and 'onload="' not in text
    assert text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # title, aria-label, axis label, legend
    root = parse(svg)  # still well-formed
    assert root.get("role") == "img" and root.get("aria-label") == evil
    assert root.find(f"{SVG}title") is not None


def test_axes_legend_and_ticks() -> None:
    svg = chart(
        [Series("GPU 0", points([1, 2]), "series-1"), Series("MIG 1g", points([3, 4]), "series-2")], minutes=360
    )
    texts = [t.text for t in parse(svg).iter(f"{SVG}text")]
    assert "Utilization, %" in texts and "GPU 0" in texts and "MIG 1g" in texts
    # Hour ticks for six hours, the day named at midnight; y from 0 to a round number over the data.
    assert texts[:13] == [
        "Utilization, %",
        "0",
        "1",
        "2",
        "3",
        "4",
        "21 Nov",
        "01:00",
        "02:00",
        "03:00",
        "04:00",
        "05:00",
        "06:00",
    ]
    week = chart([], minutes=7 * 24 * 60, step_s=3600)
    assert "no data" in str(week) and re.search(r">2[1-8] Nov<", str(week))


def test_dense_series_are_thinned_to_what_the_pixels_show() -> None:
    values = [float((i * 37) % 101) for i in range(2880)]  # a day at 30 s, jumping about
    svg = chart([Series("GPU 0", points(values), "series-1")], minutes=24 * 60, y_max=100)
    (run,) = segments(svg)
    # At most the lowest and highest point of each pixel column, plus the two ends.
    assert len(run) <= 2 * 590 + 2 < len(values)
    assert not re.search(r"\d\.\d\d", str(svg))  # one decimal
    assert len(str(svg)) < 20_000
    xs = [x for x, _ in run]
    assert xs == sorted(xs) and xs[0] == 40.0 and xs[-1] == pytest.approx(630, abs=0.3)
    # Each column still spans what its points span.
    x_scale, y_of = 590 / 86400, (lambda v: round(142 - v * 1.2, 1))
    for column in (0, 100, 589):
        data = [y_of(v) for i, v in enumerate(values) if int(10 * (40 + i * 30 * x_scale) + 0.5) // 10 == 40 + column]
        drawn = [y for x, y in run if int(x) == 40 + column]
        assert (min(drawn), max(drawn)) == (min(data), max(data))


def test_legend_wraps_and_the_chart_grows() -> None:
    names = ["GPU 0"] + [f"3g.40gb GI {i}" for i in range(7)]
    root = parse(chart([Series(n, points([1, 2]), f"series-{i + 1}") for i, n in enumerate(names)]))
    assert root.get("height") == "174" and root.get("viewBox") == "0 0 640 174"
    legend = root.find(f"{SVG}g[@class='legend']")
    assert legend is not None
    assert {t.get("y") for t in legend.iter(f"{SVG}text")} == {"12", "26"}
    assert all(float(t.get("x", "0")) + 12 * 6.2 < 640 for t in legend.iter(f"{SVG}text"))


def devices(n: int, steps: int, step_s: int = 300) -> list[Series]:
    return [
        Series(f"GPU {g}", points([float((g * 7 + i) % 100) for i in range(steps)], step_s=step_s), series_class(g))
        for g in range(n)
    ]


def hover_titles(svg: Markup) -> list[str]:
    hover = parse(svg).find(f"{SVG}g[@class='hover']")
    assert hover is not None
    return [rect.findtext(f"{SVG}title", "") for rect in hover.iter(f"{SVG}rect")]


def test_series_classes_cycle_colours_then_dash() -> None:
    assert [series_class(i) for i in (0, 7, 8, 15, 16)] == [
        "series-1",
        "series-8",
        "series-1 dashed",
        "series-8 dashed",
        "series-1 dotted",
    ]


def test_device_lines_hover_columns_list_every_device() -> None:
    series = devices(3, 12)
    series[1] = Series("GPU 1", points([None] * 5 + [7.5] * 7, step_s=300), "series-2")
    svg = device_lines_svg(
        series,
        start=START,
        end=START + timedelta(hours=1),
        step_s=300,
        y_label="Utilization, %",
        y_max=100,
        unit="%",
        title="i-0abc",
    )
    root = parse(svg)
    # The lines as a time series draws them, one per device, then a column per step with data.
    assert len([p for p in root.iter(f"{SVG}path") if "line" in p.get("class", "")]) == 3
    titles = hover_titles(svg)
    assert len(titles) == 12
    assert titles[0] == "2026-11-21 00:00 UTC\nGPU 0: 0.0 %\nGPU 1: \u2013\nGPU 2: 14.0 %"
    assert titles[5].splitlines()[2] == "GPU 1: 7.5 %"
    # Columns tile the plot without overlapping: the first and last are half a step wide.
    hover = root.find(f"{SVG}g[@class='hover']")
    assert hover is not None and hover.get("fill") == "none" and hover.get("pointer-events") == "all"
    rects = list(hover.iter(f"{SVG}rect"))
    xs = [(float(r.get("x", "0")), float(r.get("width", "0"))) for r in rects]
    assert xs[0][0] == 40 and all(abs(a[0] + a[1] - b[0]) < 0.11 for a, b in pairwise(xs))
    assert xs[-1][0] + xs[-1][1] <= 640 - 10


def test_device_lines_skip_steps_without_data_and_escape_names() -> None:
    evil = Series("<GPU & 1>", points([1.0, None, None, 2.0], step_s=300), "series-1")
    svg = device_lines_svg([evil], start=START, end=START + timedelta(minutes=15), step_s=300, y_label="W", title="t")
    assert "<GPU & 1>" not in str(svg) and "&lt;GPU &amp; 1&gt;: 1.0" in str(svg)
    assert [t.splitlines()[1] for t in hover_titles(svg)] == ["<GPU & 1>: 1.0", "<GPU & 1>: 2.0"]


def test_device_lines_stay_small_for_a_day_of_sixteen_devices() -> None:
    svg = device_lines_svg(
        devices(16, 288),
        start=START,
        end=START + timedelta(days=1),
        step_s=300,
        y_label="Utilization, %",
        y_max=100,
        unit="%",
        title="i-0abc",
        width=760,
        height=220,
    )
    # 5-minute steps are 2.4 units wide at this size: a column covers four of them, 20 minutes.
    assert len(hover_titles(svg)) == 73  # both ends included
    assert len(str(svg).encode()) < 80_000
    # The legend wraps to more rows and the chart grows for them.
    legend = parse(svg).find(f"{SVG}g[@class='legend']")
    assert legend is not None and len({t.get("y") for t in legend.iter(f"{SVG}text")}) >= 2


def test_device_lines_merge_steps_narrower_than_eight_units() -> None:
    svg = device_lines_svg(
        devices(2, 2880, step_s=30), start=START, end=START + timedelta(days=1), step_s=30, y_label="%", title="t"
    )
    titles = hover_titles(svg)
    # 590 units of plot: at most one column per 8 units, each naming its middle time.
    assert 50 < len(titles) <= 74
    assert titles[1].startswith("2026-11-21 00:")
