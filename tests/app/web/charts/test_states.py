"""State bars: segments in state order add up to the bar; hatched states carry their stripes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from markupsafe import Markup

from app.web.charts import STATES, state_bar_svg, state_class, state_label
from app.web.charts.states import hatch_defs, paint, state_legend
from app.web.charts.svg import finish

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


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


def test_state_classes_and_labels() -> None:
    assert state_class("idle-held") == "state-idle-held"
    assert state_class("busy") == "state-unknown"
    assert state_label("idle-held") == "idle, held" and state_label("busy") == "busy"


def legend_chart(states: list[str], blank: str | None = None, right: float = 600) -> ET.Element:
    parts, rows = state_legend(states, x=10, y=2, right=right, blank=blank)
    svg = finish([f'<svg xmlns="http://www.w3.org/2000/svg" data-rows="{rows}">', hatch_defs(), *parts, "</svg>"])
    return ET.fromstring(str(svg))


def chart_id(root: ET.Element) -> str:
    pattern = root.find(f".//{SVG}pattern")
    assert pattern is not None
    return pattern.get("id", "").rsplit("-", 1)[0]


def test_hatch_patterns_and_paint() -> None:
    root = legend_chart(list(STATES))
    cid = chart_id(root)
    assert re.fullmatch(r"c[0-9a-f]{10}", cid)
    patterns = {p.get("id"): p.get("class") for p in root.iter(f"{SVG}pattern")}
    assert patterns == {
        f"{cid}-unpartitioned": "hatch-fill state-unpartitioned",
        f"{cid}-unknown": "hatch-fill state-unknown",
    }
    assert paint("idle") == "currentColor" and paint("unknown").startswith("url(#")
    # A different chart gets different ids; the same chart the same ones.
    assert chart_id(legend_chart(["idle"])) != cid and chart_id(legend_chart(list(STATES))) == cid


def test_state_legend_swatches_wrap_and_blank() -> None:
    root = legend_chart(list(STATES), blank="no data")
    swatches = [r for r in root.iter(f"{SVG}rect") if "key-swatch" in r.get("class", "")]
    assert [r.get("class") for r in swatches][:2] == ["key-swatch state-active", "key-swatch state-idle-held"]
    assert (
        swatches[3].get("fill") == f"url(#{chart_id(root)}-unpartitioned)" and swatches[0].get("fill") == "currentColor"
    )
    assert swatches[-1].get("class") == "key-swatch blank" and swatches[-1].get("fill") == "none"
    assert [t.text for t in root.iter(f"{SVG}text")] == [*(state_label(s) for s in STATES), "no data"]
    assert root.get("data-rows") == "1"
    narrow = legend_chart(list(STATES), right=200)
    assert int(narrow.get("data-rows", "0")) >= 3
    assert all(float(r.get("x", "0")) < 200 for r in narrow.iter(f"{SVG}rect") if r.get("class"))
