"""Wasted dollars by hour of week: each idle hour lands in its weekday and hour of day, UTC."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from app.web.templating import usd
from tests.app.web.views.pages import fragment, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, idle


def test_idle_hours_land_in_their_hour_of_week(client: TestClient, feeder: Feeder) -> None:
    start = recent_start(3).replace(minute=0) - timedelta(hours=1)
    feeder.feed([gpu(0, uid="GPU-w")], start=start, hours=3, step_s=300, fn=idle, instance_id="i-w")
    view = get_json(client, "/heatmap/week?window=7d")
    assert view["days"][0] == "Mon"
    for k in range(3):
        t = start + timedelta(hours=k)
        assert view["usd"][t.weekday()][t.hour] == pytest.approx(P4D_PER_GPU_HOUR), t
        assert view["hours"][t.weekday()][t.hour] >= 1
    assert view["total_usd"] == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert view["peak"] is not None and view["peak"]["usd_per_hour"] > 0
    overview = get_json(client, "/?window=7d")
    assert view["total_usd"] == pytest.approx(overview["totals"]["waste"])
    for doc in (get_html(client, "/heatmap/week?window=7d"), fragment(client, "/heatmap/week?window=7d")):
        svg = doc.select_one("section#week svg.chart-week")
        assert svg is not None and len(svg.select("rect title, g title")) >= 7 * 24
        assert doc.select_one("[data-figure=week-total]").get_text(strip=True) == usd(view["total_usd"])


def test_nothing_wasted(client: TestClient, feeder: Feeder) -> None:
    feeder.feed([gpu(0, uid="GPU-x")], start=recent_start(1), hours=1, step_s=300, fn=busy(80), instance_id="i-x")
    view = get_json(client, "/heatmap/week")
    assert view["total_usd"] == 0 and view["peak"] is None
    assert "Nothing wasted" in get_html(client, "/heatmap/week").get_text()
