"""Shared chart pieces: round axes, dollar and time labels, cut names, chart ids, and what every chart obeys."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.web import charts
from app.web.charts.svg import (
    bucket_label,
    finish,
    fmt,
    money,
    money_tick,
    nice_axis,
    row_label,
    time_axis,
    truncate,
)

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)


def test_coordinates_have_one_decimal() -> None:
    assert [fmt(v) for v in (3.0, 2.25, 1.04, -0.04, 120.96)] == ["3", "2.2", "1", "0", "121"]


@pytest.mark.parametrize(
    ("peak", "axis"),
    [(0.0, (1.0, 0.25)), (3.2, (4.0, 1.0)), (17.0, (20.0, 5.0)), (9.0, (10.0, 2.5)), (1234.0, (1500.0, 500.0))],
)
def test_nice_axis(peak: float, axis: tuple[float, float]) -> None:
    assert nice_axis(peak) == axis


def test_money() -> None:
    assert money(1234.561) == "$1,234.56" and money(0) == "$0.00" and money(-0.5) == "-$0.50"
    assert money_tick(1500, 500) == "$1,500" and money_tick(0.25, 0.25) == "$0.25"
    assert money_tick(250_000, 50_000) == "$250k"


def test_bucket_labels_name_the_start_in_utc() -> None:
    assert bucket_label(datetime(2026, 11, 20, 14, 0, tzinfo=UTC), 3600) == "2026-11-20 14:00 UTC"
    assert bucket_label(datetime(2026, 11, 20, 14, 0), 3600) == "2026-11-20 14:00 UTC"  # naive: UTC
    assert bucket_label(datetime(2026, 11, 20, tzinfo=UTC), 86400) == "2026-11-20 UTC"


def test_time_axis_hours_for_short_spans_dates_for_long() -> None:
    def labels(span: timedelta) -> list[str]:
        t0 = START.timestamp()
        parts = time_axis(t0, t0 + span.total_seconds(), left=40, plot_w=590, top=0, bottom=100, label_y=112)
        return re.findall(r">([^<]+)</text>", "".join(parts))

    assert labels(timedelta(hours=6))[:3] == ["20 Nov", "01:00", "02:00"]
    assert labels(timedelta(days=7))[:3] == ["20 Nov", "21 Nov", "22 Nov"]
    assert labels(timedelta(days=30)) == ["26 Nov", "3 Dec", "10 Dec", "17 Dec"]
    assert time_axis(10.0, 10.0, left=0, plot_w=100, top=0, bottom=10, label_y=20) == []


def test_truncate() -> None:
    assert truncate("GPU 0", 8) == "GPU 0"
    assert truncate("i-0123456789abcdef0 GPU 3", 10) == "i-0123456\u2026"
    assert len(truncate("x" * 50, 10)) == 10


def test_row_label_escapes_cuts_and_links() -> None:
    label = "<&> " + "y" * 40
    text = row_label(label, "/instances/i-1?gpu=0&x=<1>", x=100, y=20, max_chars=12)
    root = ET.fromstring(f'<svg xmlns="http://www.w3.org/2000/svg">{text}</svg>')
    link = root.find(f"{SVG}a")
    assert link is not None and link.get("href") == "/instances/i-1?gpu=0&x=<1>"
    node = link.find(f"{SVG}text")
    assert node is not None and node.findtext(f"{SVG}title") == label
    assert "".join(node.itertext()).endswith("<&> yyyyyyy\u2026")
    assert row_label("GPU 0", None, x=1, y=1, max_chars=9).startswith("<text")
    with pytest.raises(ValueError, match="refusing"):
        row_label("GPU 0", "javascript:alert(1)", x=1, y=1, max_chars=9)


def test_finish_names_each_chart_by_its_content() -> None:
    one = finish(['<svg><pattern id="<@>-a"/><rect fill="url(#<@>-a)"/></svg>'])
    two = finish(['<svg><pattern id="<@>-a"/><rect fill="url(#<@>-a)"/><g/></svg>'])
    assert isinstance(one, Markup) and "<@>" not in one
    ids = re.findall(r'id="(c[0-9a-f]{10})-a"', one)
    assert ids and f"url(#{ids[0]}-a)" in one
    assert one == finish(['<svg><pattern id="<@>-a"/><rect fill="url(#<@>-a)"/></svg>']) and one[:40] != two[:40]


def every_chart(text: str) -> list[Markup]:
    """One of each chart with `text` as every name, title and tooltip."""
    hours = [START + timedelta(hours=i) for i in range(6)]
    row = charts.HeatRow(text, "/x", [charts.HeatCell("unknown", text), None, *[charts.HeatCell("idle", text)] * 4])
    points = [(t, 50.0) for t in hours]
    return [
        charts.timeseries_svg(
            [charts.Series(text, points, "series-1")],
            start=START,
            end=hours[-1],
            step_s=3600,
            y_label=text,
            title=text,
        ),
        charts.device_lines_svg(
            [charts.Series(text, points, "series-1")],
            start=START,
            end=hours[-1],
            step_s=3600,
            y_label=text,
            title=text,
        ),
        charts.state_bar_svg({"idle": 1.0, "unknown": 1.0}, label=text),
        charts.mig_layout_svg([charts.MigSlot(0, 7, text, "unpartitioned", text)], title=text),
        charts.stacked_states_svg(hours, 3600, {"idle": [1.0] * 6, "unpartitioned": [2.0] * 6}, title=text, unit=text),
        charts.bars_svg(hours, 3600, [1.0] * 6, title=text, css_class=text),
        charts.state_heatmap_svg([row], hours, 3600, title=text),
        charts.hour_of_week_svg([[1.0] * 24] * 7, [[2] * 24] * 7, title=text),
        charts.state_strip_svg(
            [charts.StripRow(text, [(START, hours[2], "unknown")], "/x")], start=START, end=hours[-1], title=text
        ),
    ]


def test_every_chart_is_escaped_well_formed_svg_without_style_or_script() -> None:
    evil = '<script>alert("x")</script> & <b onload="y">'
    for svg in every_chart(evil):
        assert isinstance(svg, Markup)
        text = str(svg)
        assert "<script" not in text and "<b " not in text and "style=" not in text
        root = ET.fromstring(text)
        assert root.tag == f"{SVG}svg" and root.get("role") == "img"
        assert root.findtext(f"{SVG}title") == evil
        assert all(el.get("style") is None for el in root.iter())
        assert not any(el.tag.endswith(("script", "style", "foreignObject")) for el in root.iter())
        # Every pattern a shape paints with is defined in the same chart.
        ids = {el.get("id") for el in root.iter() if el.get("id")}
        for el in root.iter():
            for attr in ("fill", "stroke"):
                ref = re.fullmatch(r"url\(#(.+)\)", el.get(attr, ""))
                assert ref is None or ref.group(1) in ids


def test_charts_on_one_page_never_share_ids() -> None:
    ids: list[str] = []
    for text in ("one", "two"):
        for svg in every_chart(text):
            ids += [el.get("id", "") for el in ET.fromstring(str(svg)).iter() if el.get("id")]
    assert ids and len(ids) == len(set(ids))
