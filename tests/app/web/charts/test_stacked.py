"""Column charts: states stack in order with a tooltip per column; bars show dollars; no data says so."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.web.charts import STATES, bars_svg, stacked_states_svg

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 20, 14, 0, tzinfo=UTC)


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


def columns(root: ET.Element) -> list[ET.Element]:
    (cols,) = [g for g in root.findall(f"{SVG}g") if g.get("class", "").split()[:1] == ["cols"]]
    return list(cols.findall(f"{SVG}g"))


def hours_of(n: int) -> list[datetime]:
    return [START + timedelta(hours=i) for i in range(n)]


def test_stacked_columns_stack_states_in_order() -> None:
    hours = {
        "offline": [1.0, 0.0, 2.0],
        "idle": [12.3, 4.0, 0.0],
        "active": [2.0, 4.0, 0.0],
        "unknown": [0.5, 0.0, 0.0],
        "unpartitioned": [1.2, 0.0, 0.0],
    }
    svg = stacked_states_svg(hours_of(3), 3600, hours, width=640, height=200, title="GPU-hours by state")
    root = parse(svg)
    cols = columns(root)
    assert len(cols) == 3
    segs = [[r for r in col.findall(f"{SVG}rect") if r.get("class") != "hit"] for col in cols]
    # Bottom to top in STATES order, zero figures left out.
    assert [r.get("class") for r in segs[0]] == [
        "state-active",
        "state-idle",
        "state-unpartitioned",
        "state-unknown",
        "state-offline",
    ]
    assert [r.get("class") for r in segs[1]] == ["state-active", "state-idle"]
    ys = [float(r.get("y", "0")) for r in segs[0]]
    assert ys == sorted(ys, reverse=True)
    # Segments touch, and their heights follow the figures.
    for lower, upper in zip(segs[0], segs[0][1:], strict=False):
        assert float(upper.get("y", "0")) + float(upper.get("height", "0")) == pytest.approx(float(lower.get("y", "0")))
    heights = [float(r.get("height", "0")) for r in segs[1]]
    assert heights[0] == pytest.approx(heights[1], abs=0.11)
    # Hatched states paint with this chart's patterns, solid ones with their colour.
    patterns = {p.get("id", "") for p in root.iter(f"{SVG}pattern")}
    assert segs[0][2].get("fill") == f"url(#{next(p for p in patterns if p.endswith('unpartitioned'))})"
    assert segs[0][0].get("fill") == "currentColor"
    # One tooltip per column: the time and every state's figure.
    assert cols[0].findtext(f"{SVG}title") == (
        "2026-11-20 14:00 UTC \u00b7 active 2.0 GPU-h \u00b7 idle 12.3 GPU-h \u00b7 unpartitioned 1.2 GPU-h"
        " \u00b7 unknown 0.5 GPU-h \u00b7 offline 1.0 GPU-h \u00b7 total 17.0 GPU-h"
    )
    # Each column takes the pointer over the full plot height, even where it is short.
    hit = cols[2].find(f"{SVG}rect[@class='hit']")
    assert hit is not None and hit.get("pointer-events") == "all" and hit.get("fill") == "none"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "GPU-hours" in texts and "idle, held" not in texts and "unpartitioned" in texts
    assert {"0", "5", "10", "15", "20"} <= set(texts)


def test_stacked_axis_hours_for_a_day_dates_for_a_month() -> None:
    day = stacked_states_svg(hours_of(24), 3600, {"idle": [1.0] * 24}, title="day")
    assert "18:00" in [t.text for t in parse(day).iter(f"{SVG}text")]
    days = [START.replace(hour=0) + timedelta(days=i) for i in range(30)]
    month = stacked_states_svg(days, 86400, {"idle": [1.0] * 30}, title="month")
    texts = [t.text or "" for t in parse(month).iter(f"{SVG}text")]
    assert "3 Dec" in texts and not any(":" in t for t in texts)
    assert columns(parse(month))[0].findtext(f"{SVG}title", "").startswith("2026-11-20 UTC \u00b7 idle 1.0 GPU-h")


def test_stacked_legend_wraps_on_narrow_charts() -> None:
    hours = {s: [1.0] for s in STATES}
    wide = parse(stacked_states_svg(hours_of(1), 3600, hours, width=900, height=200, title="t"))
    narrow = parse(stacked_states_svg(hours_of(1), 3600, hours, width=320, height=200, title="t"))
    assert wide.get("height") == "200" and float(narrow.get("height", "0")) > 200


def test_stacked_without_data_says_so() -> None:
    for svg in (
        stacked_states_svg([], 3600, {}, title="empty"),
        stacked_states_svg(hours_of(2), 3600, {"idle": [0.0, 0.0]}, title="zero"),
    ):
        root = parse(svg)
        assert [t.text for t in root.iter(f"{SVG}text")] == ["No data in this window"]
        assert root.get("aria-label", "").endswith(": no data")


def test_stacked_checks_its_input() -> None:
    with pytest.raises(ValueError, match="unknown state"):
        stacked_states_svg(hours_of(1), 3600, {"busy": [1.0]}, title="t")
    with pytest.raises(ValueError, match="2 values for 1 buckets"):
        stacked_states_svg(hours_of(1), 3600, {"idle": [1.0, 2.0]}, title="t")
    with pytest.raises(ValueError, match="non-negative"):
        stacked_states_svg(hours_of(1), 3600, {"idle": [-1.0]}, title="t")


def test_stacked_escapes_text() -> None:
    svg = stacked_states_svg(hours_of(1), 3600, {"idle": [1.0]}, title="<&>", unit="<GPU>")
    assert "<GPU>" not in str(svg) and "&lt;GPU&gt;" in str(svg)
    assert parse(svg).findtext(f"{SVG}title") == "<&>"


def test_bars_show_dollars() -> None:
    svg = bars_svg(hours_of(4), 3600, [1234.56, None, 0.0, 600.0], width=640, height=180, title="Wasted per hour")
    root = parse(svg)
    cols = columns(root)
    assert len(cols) == 3  # no bar where there is no data
    bars = [c.find(f"{SVG}rect[@class='bar']") for c in cols]
    assert all(b is not None and b.get("fill") == "currentColor" for b in bars)
    heights = [float(b.get("height", "0")) for b in bars if b is not None]
    assert heights[0] > heights[2] > heights[1] == 0
    assert [c.findtext(f"{SVG}title") for c in cols] == [
        "2026-11-20 14:00 UTC \u00b7 $1,234.56",
        "2026-11-20 16:00 UTC \u00b7 $0.00",
        "2026-11-20 17:00 UTC \u00b7 $600.00",
    ]
    ticks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "tick" and (t.text or "").startswith("$")]
    assert ticks == ["$0", "$500", "$1,000", "$1,500"]
    assert root.get("aria-label") == "Wasted per hour: total $1,834.56"
    assert root.find(f".//{SVG}g[@class='cols waste']") is not None


def test_bars_in_another_unit_and_class() -> None:
    svg = bars_svg(hours_of(2), 3600, [0.2, 0.4], title="t", unit="GPU-hours", css_class='x" onclick="y')
    root = parse(svg)
    assert root.find(f"{SVG}g[@class='cols x\" onclick=\"y']") is not None and 'onclick="' not in str(svg)
    assert columns(root)[0].findtext(f"{SVG}title") == "2026-11-20 14:00 UTC \u00b7 0.20 GPU-hours"
    assert "0.1" in [t.text for t in root.iter(f"{SVG}text")]


def test_bars_without_data_say_so() -> None:
    for svg in (bars_svg([], 3600, [], title="t"), bars_svg(hours_of(2), 3600, [None, None], title="t")):
        assert [t.text for t in parse(svg).iter(f"{SVG}text")] == ["No data in this window"]
    with pytest.raises(ValueError):
        bars_svg(hours_of(2), 3600, [1.0], title="t")
