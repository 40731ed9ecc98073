"""Heatmaps: a cell per device and bucket in its state's colour, small enough for a week of 50 GPUs; the
hours of a week shaded by dollars wasted."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.web.charts import STATES, HeatCell, HeatRow, hour_of_week_svg, state_heatmap_svg, state_label

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


def buckets(n: int) -> list[datetime]:
    return [START + timedelta(hours=i) for i in range(n)]


def cell(state: str, when: datetime) -> HeatCell:
    return HeatCell(state, f"{when:%a %H:%M} \u00b7 {state_label(state)}")


def cell_groups(root: ET.Element) -> dict[str, ET.Element]:
    groups = [g for g in root.iter(f"{SVG}g") if "cells" in g.get("class", "").split()]
    return {g.get("class", "").split()[1].removeprefix("state-"): g for g in groups}


def test_cells_take_their_state_and_title() -> None:
    starts = buckets(4)
    rows = [
        HeatRow("GPU 0", "/instances/i-1#gpu-0", [cell("active", starts[0]), None, cell("idle", starts[2]), None]),
        HeatRow("GPU 1", None, [cell("unknown", t) for t in starts]),
    ]
    root = parse(state_heatmap_svg(rows, starts, 3600, width=400, title="States"))
    groups = cell_groups(root)
    assert list(groups) == ["active", "idle", "unknown"]
    # Solid states stroke with their colour, hatched ones with this chart's pattern.
    assert groups["active"].get("stroke") == "currentColor" and groups["active"].get("stroke-width") == "12"
    unknown = groups["unknown"].get("stroke", "")
    assert re.fullmatch(r"url\(#c[0-9a-f]{10}-unknown\)", unknown)
    assert unknown[5:-1] in {p.get("id") for p in root.iter(f"{SVG}pattern")}
    titles = {state: [p.findtext(f"{SVG}title") for p in g.iter(f"{SVG}path")] for state, g in groups.items()}
    assert titles["active"] == ["Fri 00:00 \u00b7 active"] and titles["idle"] == ["Fri 02:00 \u00b7 idle"]
    assert len(titles["unknown"]) == 4
    # Cells sit on their row and column; None is left blank.
    (active,) = groups["active"].iter(f"{SVG}path")
    (idle,) = groups["idle"].iter(f"{SVG}path")
    cell_w = (400 - 140 - 10) // 4
    assert active.get("d") == f"M140 28h{cell_w}" and idle.get("d") == f"M{140 + 2 * cell_w} 28h{cell_w}"
    assert next(groups["unknown"].iter(f"{SVG}path")).get("d") == f"M140 43h{cell_w}"
    # Row names, the first a link; a legend of the states shown and of no data.
    link = root.find(f".//{SVG}a")
    assert link is not None and link.get("href") == "/instances/i-1#gpu-0"
    legend = root.find(f"{SVG}g[@class='legend']")
    assert legend is not None and [t.text for t in legend.iter(f"{SVG}text")] == [
        "active",
        "idle",
        "unknown",
        "no data",
    ]


def test_time_axis_is_on_top() -> None:
    starts = buckets(168)
    root = parse(
        state_heatmap_svg([HeatRow("GPU 0", None, [cell("idle", t) for t in starts])], starts, 3600, title="t")
    )
    ticks = [t for t in root.iter(f"{SVG}text") if t.get("class") == "tick"]
    assert [t.text for t in ticks][:3] == ["20 Nov", "21 Nov", "22 Nov"]
    assert all(float(t.get("y", "0")) < 22 for t in ticks)


def test_equal_neighbours_merge_into_one_cell() -> None:
    starts = buckets(6)
    off = HeatCell("offline", "no data came")
    row = HeatRow("GPU 0", None, [off, off, off, cell("idle", starts[3]), off, off])
    groups = cell_groups(parse(state_heatmap_svg([row], starts, 3600, width=310, title="t")))
    assert [p.get("d") for p in groups["offline"].iter(f"{SVG}path")] == ["M140 28h78", "M244 28h52"]


def test_long_names_are_cut_and_text_escaped() -> None:
    label = "<&> i-0123456789abcdef0 GPU 3 (a long name)"
    starts = buckets(2)
    row = HeatRow(label, "/instances/x?a=1&b=<2>", [HeatCell("idle", "<b>idle</b> & more"), None])
    svg = state_heatmap_svg([row], starts, 3600, title="<Heat & map>")
    text = str(svg)
    assert "<b>" not in text and "&lt;b&gt;idle&lt;/b&gt; &amp; more" in text
    root = parse(svg)
    assert root.findtext(f"{SVG}title") == "<Heat & map>"
    name = root.find(f".//{SVG}a/{SVG}text")
    assert name is not None and name.findtext(f"{SVG}title") == label
    shown = "".join(name.itertext())[len(label) :]
    assert shown.startswith("<&> i-0123") and shown.endswith("\u2026") and len(shown) == 20


def test_a_week_of_fifty_gpus_stays_small() -> None:
    starts = buckets(168)
    rows = [
        HeatRow(
            f"i-0123456789abcdef0 GPU {r}",
            f"/instances/i-0123456789abcdef0#gpu-{r}",
            # Every cell differs from its neighbours: nothing merges.
            [cell(STATES[(i + r) % len(STATES)], t) for i, t in enumerate(starts)],
        )
        for r in range(50)
    ]
    svg = str(state_heatmap_svg(rows, starts, 3600, width=960, title="Last 7 days"))
    size = len(svg.encode())
    titles = sum(len(c.title.encode()) for row in rows for c in row.cells if c is not None)
    assert size < 600_000
    # Besides its tooltip, a cell costs under 50 bytes: that is what bounds the size for longer tooltips.
    assert (size - titles) / (50 * 168) < 50
    assert len(parse(Markup(svg)).findall(f".//{SVG}path[{SVG}title]")) == 50 * 168


def test_heatmap_empty_and_invalid() -> None:
    for svg in (state_heatmap_svg([], buckets(3), 3600, title="t"), state_heatmap_svg([], [], 3600, title="t")):
        assert [t.text for t in parse(svg).iter(f"{SVG}text")] == ["No data in this window"]
    with pytest.raises(ValueError, match="2 cells for 3 buckets"):
        state_heatmap_svg([HeatRow("GPU 0", None, [None, None])], buckets(3), 3600, title="t")
    with pytest.raises(ValueError, match="unknown state"):
        HeatCell("busy", "x")


def week(value: float = 0.0) -> list[list[float]]:
    return [[value] * 24 for _ in range(7)]


def test_hour_of_week_shades_dollars_per_hour() -> None:
    usd, hours = week(), [[4] * 24 for _ in range(7)]
    usd[1][14] = 123.45  # Tuesday 14:00, the most per hour
    usd[0][0] = 12.0
    hours[6][23] = 0  # Sunday 23:00: no data
    root = parse(hour_of_week_svg(usd, [list(r) for r in hours], width=640, title="Waste by hour of week"))
    heat = root.find(f"{SVG}g[@class='heat']")
    assert heat is not None
    cells = heat.findall(f"{SVG}rect")
    assert len(cells) == 7 * 24
    by_title = {c.findtext(f"{SVG}title"): c.get("class") for c in cells}
    assert by_title["Tue 14:00-15:00 UTC \u00b7 $123.45 wasted over 4 hours \u00b7 $30.86 per hour"] == "heat-5"
    assert by_title["Mon 00:00-01:00 UTC \u00b7 $12.00 wasted over 4 hours \u00b7 $3.00 per hour"] == "heat-1"
    assert by_title["Sun 23:00-00:00 UTC \u00b7 no data"] == "heat-none"
    assert by_title["Wed 09:00-10:00 UTC \u00b7 no waste over 4 hours"] == "heat-0"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts[:3] == ["00", "01", "02"] and "Sun" in texts and "UTC" in texts
    legend = root.find(f"{SVG}g[@class='legend heat']")
    assert legend is not None
    assert [r.get("class") for r in legend.findall(f"{SVG}rect")] == [f"heat-{n}" for n in ("none", 0, 1, 2, 3, 4, 5)]
    assert legend.findall(f"{SVG}rect")[2].findtext(f"{SVG}title") == "$0.00-$6.17 per hour"
    assert "up to $30.86 per hour" in [t.text for t in legend.iter(f"{SVG}text")]


def test_hour_of_week_one_hour_and_no_waste_at_all() -> None:
    usd, hours = week(), [[0] * 24 for _ in range(7)]
    usd[2][5], hours[2][5] = 2.5, 1
    root = parse(hour_of_week_svg(usd, hours, title="t"))
    assert "Wed 05:00-06:00 UTC \u00b7 $2.50 wasted over 1 hour \u00b7 $2.50 per hour" in [
        t.text for t in root.iter(f"{SVG}title")
    ]
    empty = parse(hour_of_week_svg(week(), [[0] * 24 for _ in range(7)], title="t"))
    assert {r.get("class") for r in empty.iter(f"{SVG}rect")} == {"heat-none", "heat-0"}
    assert empty.get("aria-label") == "t: no data"


def test_hour_of_week_checks_its_shape() -> None:
    with pytest.raises(ValueError, match="7 rows of 24"):
        hour_of_week_svg(week()[:6], [[1] * 24] * 6, title="t")
    with pytest.raises(ValueError, match="non-negative"):
        hour_of_week_svg(week(-1.0), [[1] * 24] * 7, title="t")
