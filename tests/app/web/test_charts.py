"""SVG charts: gaps stay gaps, text is escaped, bars add up, MIG layouts show free capacity."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.web.charts import STATES, MigSlot, Series, mig_layout_svg, state_bar_svg, timeseries_svg

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


def test_state_bar_order_and_sum() -> None:
    shares = {"offline": 1.0, "idle": 2.0, "active": 3.0, "unknown": 1.0, "idle-held": 1.0, "unpartitioned": 2.0}
    root = parse(state_bar_svg(shares, width=400, height=16))
    groups = [g for g in root.iter(f"{SVG}g") if "seg" in g.get("class", "").split()]
    states = [g.get("class", "").split()[1].removeprefix("state-") for g in groups]
    assert states == list(STATES)
    widths = [float(g.find(f"{SVG}rect").get("width", "0")) for g in groups]  # type: ignore[union-attr]
    assert sum(widths) == pytest.approx(400, abs=0.05)
    titles = [g.find(f"{SVG}title").text for g in groups]  # type: ignore[union-attr]
    assert titles[0] == "active: 30.0%" and titles[2] == "idle: 20.0%"
    # Hatched states carry their stripes; solid ones do not.
    hatched = [g.get("class") for g in groups if g.find(f"{SVG}path") is not None]
    assert hatched == ["seg state-unpartitioned", "seg state-unknown"]


def test_state_bar_skips_zero_and_handles_nothing() -> None:
    root = parse(state_bar_svg({"active": 0.25, "idle": 0.75, "offline": 0.0}))
    assert len([g for g in root.iter(f"{SVG}g")]) == 2
    empty = state_bar_svg({})
    assert "no data" in str(empty)
    with pytest.raises(ValueError, match="unknown state"):
        state_bar_svg({"busy": 1.0})


def test_mig_layout_with_unpartitioned_slots() -> None:
    slots = [
        MigSlot(0, 3, "3g.40gb", "active", "3g.40gb GI 1: 87% <busy>"),
        MigSlot(3, 2, "2g.20gb", "idle", "2g.20gb GI 5: idle 6 h"),
        MigSlot(5, 2, "", "unpartitioned", "2 free compute slices: $1.20/h"),
    ]
    svg = mig_layout_svg(slots, width=168, height=28, title="i-0abc GPU 0")
    root = parse(svg)
    groups = [g for g in root.iter(f"{SVG}g") if "slot" in g.get("class", "").split()]
    assert [g.get("class") for g in groups] == ["slot state-active", "slot state-idle", "slot state-unpartitioned"]
    rects = [g.find(f"{SVG}rect") for g in groups]
    widths = [float(r.get("width", "0")) for r in rects if r is not None]
    assert widths[0] > widths[1] == pytest.approx(widths[2])
    # Free capacity is striped, and tooltips are escaped.
    assert groups[2].find(f"{SVG}path") is not None and groups[0].find(f"{SVG}path") is None
    assert "&lt;busy&gt;" in str(svg)
    assert root.get("aria-label", "").startswith("i-0abc GPU 0: 3g.40gb active; 2g.20gb idle")
    # Column guides for the 7 compute slices.
    assert len(root.findall(f"{SVG}g[@class='cols']/{SVG}line")) == 6


def test_mig_slot_must_fit() -> None:
    with pytest.raises(ValueError):
        MigSlot(5, 3, "3g", "active", "")
    with pytest.raises(ValueError):
        MigSlot(0, 1, "1g", "busy", "")
