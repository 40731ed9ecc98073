"""State strips: one strip per device, a span per stretch of one state, clipped to the window."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.web.charts import StripRow, state_strip_svg

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
END = START + timedelta(hours=12)


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


def at(hours: float) -> datetime:
    return START + timedelta(hours=hours)


def spans(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("state-")]


def test_strips_draw_each_span_with_its_state_and_tooltip() -> None:
    rows = [
        StripRow("GPU 2", [(at(2), at(5), "idle"), (at(5), at(5.75), "active"), (at(8), at(12), "unknown")]),
        StripRow("GPU 3", [(at(0), at(12), "unpartitioned")], href="/instances/i-1#gpu-3"),
    ]
    root = parse(state_strip_svg(rows, start=START, end=END, width=640, title="i-1 over 12 h"))
    drawn = spans(root)
    assert [r.get("class") for r in drawn] == ["state-idle", "state-active", "state-unknown", "state-unpartitioned"]
    assert [r.findtext(f"{SVG}title") for r in drawn] == [
        "GPU 2 \u00b7 idle \u00b7 14:00-17:00 UTC (3 h)",
        "GPU 2 \u00b7 active \u00b7 17:00-17:45 UTC (45 min)",
        "GPU 2 \u00b7 unknown \u00b7 20:00-00:00 UTC (4 h)",
        "GPU 3 \u00b7 unpartitioned \u00b7 12:00-00:00 UTC (12 h)",
    ]
    # Positions follow time on a shared axis: 520 units for 12 hours.
    x0, scale = 110, 520 / 12
    idle = drawn[0]
    assert float(idle.get("x", "0")) == pytest.approx(x0 + 2 * scale, abs=0.06)
    assert float(idle.get("width", "0")) == pytest.approx(3 * scale, abs=0.06)
    assert drawn[3].get("width") == "520" and drawn[3].get("y") != drawn[0].get("y")
    # Solid states fill with their colour, hatched ones with this chart's patterns.
    ids = {p.get("id") for p in root.iter(f"{SVG}pattern")}
    assert drawn[1].get("fill") == "currentColor" and drawn[2].get("fill", "")[5:-1] in ids
    # A track under each strip shows where no data came; a link on the second name; ticks and legend.
    assert len([r for r in root.iter(f"{SVG}rect") if r.get("class") == "track"]) == 2
    link = root.find(f".//{SVG}a")
    assert link is not None and link.get("href") == "/instances/i-1#gpu-3"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "14:00" in texts and "21 Nov" in texts
    legend = root.find(f"{SVG}g[@class='legend']")
    assert legend is not None and [t.text for t in legend.iter(f"{SVG}text")] == [
        "active",
        "idle",
        "unpartitioned",
        "unknown",
    ]


def test_spans_are_clipped_to_the_window_and_dated_over_days() -> None:
    start, end = START - timedelta(days=2), START
    rows = [
        StripRow("GPU 0", [(start - timedelta(hours=5), start + timedelta(hours=3), "idle"), (at(1), at(2), "active")])
    ]
    root = parse(state_strip_svg(rows, start=start, end=end, title="t"))
    (idle,) = spans(root)  # the span after the window is gone
    assert idle.get("x") == "110"
    assert idle.findtext(f"{SVG}title") == "GPU 0 \u00b7 idle \u00b7 18 Nov 12:00-15:00 UTC (3 h)"
    rows = [StripRow("GPU 0", [(start, end, "offline")])]
    (offline,) = spans(parse(state_strip_svg(rows, start=start, end=end, title="t")))
    assert offline.findtext(f"{SVG}title") == "GPU 0 \u00b7 offline \u00b7 18 Nov 12:00 - 20 Nov 12:00 UTC (2 d)"


def test_strip_escapes_text() -> None:
    rows = [StripRow("<GPU & 0>", [(at(0), at(1), "idle")], href="/x?a=1&b=2")]
    svg = state_strip_svg(rows, start=START, end=END, title="<t>")
    assert "<GPU" not in str(svg) and "&lt;GPU &amp; 0&gt;" in str(svg)
    root = parse(svg)
    assert spans(root)[0].findtext(f"{SVG}title", "").startswith("<GPU & 0> \u00b7 idle")
    link = root.find(f".//{SVG}a")
    assert link is not None and link.get("href") == "/x?a=1&b=2"


def test_strip_empty_and_invalid() -> None:
    for rows in ([], [StripRow("GPU 0", [])], [StripRow("GPU 0", [(at(-3), at(-1), "idle")])]):
        svg = state_strip_svg(rows, start=START, end=END, title="t")
        assert [t.text for t in parse(svg).iter(f"{SVG}text")] == ["No data in this window"]
    with pytest.raises(ValueError, match="unknown state"):
        state_strip_svg([StripRow("GPU 0", [(at(0), at(1), "busy")])], start=START, end=END, title="t")
    with pytest.raises(ValueError, match="end must be after start"):
        state_strip_svg([], start=END, end=START, title="t")
