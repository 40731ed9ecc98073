"""MIG layouts: slots on 7 compute-slice columns, free capacity striped, tooltips escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from markupsafe import Markup

from app.web.charts import MigSlot, mig_layout_svg

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: Markup) -> ET.Element:
    return ET.fromstring(str(svg))


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
