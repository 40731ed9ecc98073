"""The overview over time: GPU-hours by state and wasted dollars per bucket, the change against the previous
window, and the same figures in its HTML, its fragment and its JSON."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.window import floor_hour
from tests.app.analyse.test_price_now import bill
from tests.app.web.views.pages import JSON, fragment, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import Feeder, busy, idle

STATES = ["active", "idle-held", "idle", "unpartitioned", "unknown", "offline"]


@pytest.fixture
def two_days(feeder: Feeder) -> None:
    """A g5 idle for 30 hours (6 of them in the previous 24 h window), a p4d GPU busy for the last 3 hours."""
    feeder.feed(
        [gpu(0, uid="GPU-idle", name="NVIDIA A10G")],
        start=recent_start(30),
        hours=30,
        step_s=300,
        fn=idle,
        instance_id="i-idle",
        instance_type="g5.xlarge",
        tags={"team": "vision"},
    )
    feeder.feed([gpu(0, uid="GPU-busy")], start=recent_start(3), hours=3, step_s=300, fn=busy(80), instance_id="i-busy")


def test_the_trend_adds_up_to_the_window(client: TestClient, two_days: None) -> None:
    view = get_json(client, "/?window=24h")
    trend = view["trend"]
    assert trend["step_s"] == 3600 and len(trend["starts"]) == 24
    assert set(trend["hours"]) == set(STATES)
    by_state = {r["state"]: r["gpu_hours"] for r in view["states"]}
    for state in STATES:
        assert sum(trend["hours"][state]) == pytest.approx(by_state[state], abs=1e-6), state
    assert sum(trend["waste_usd"]) == pytest.approx(view["totals"]["waste"], rel=1e-9)
    # The idle hours are where the idle GPU was idle: every bucket of the window but the last holds them.
    assert all(h > 0.9 for h in trend["hours"]["idle"][:-1])
    month = get_json(client, "/?window=30d")["trend"]
    assert month["step_s"] == 86400 and len(month["starts"]) == 30


def test_change_against_the_previous_window(client: TestClient, two_days: None) -> None:
    view = get_json(client, "/?window=24h")
    waste = view["changes"]["waste"]
    # Previous 24 h: 6 idle hours of the g5; this window: about 24 hours of it, and no more waste from the p4d.
    assert waste["previous"] == pytest.approx(view["changes"]["idle_cost"]["previous"])
    assert waste["previous"] > 0 and waste["current"] > waste["previous"]
    hours, previous_hours = view["window"]["hours"], view["previous"]["hours"]
    expected = (waste["current"] / hours) / (waste["previous"] / previous_hours) * 100 - 100
    assert waste["change_pct"] == pytest.approx(expected)
    assert view["changes"]["idle_held_cost"]["change_pct"] is None  # nothing held in either window
    doc = get_html(client, "/?window=24h")
    card = doc.select_one(".card [data-figure=waste]").parent
    badge = card.select_one(".change")
    assert badge["data-change"] == f"{waste['change_pct']:.1f}" and "up" in badge["class"]
    assert "vs previous 24h" in card.get_text(" ", strip=True)


def test_the_overview_html_holds_the_charts_over_time(client: TestClient, two_days: None) -> None:
    for doc in (get_html(client, "/?window=24h"), fragment(client, "/?window=24h")):
        trend = doc.select_one("section#trend")
        assert trend is not None
        stacked = trend.select_one("svg.chart-stacked")
        bars = trend.select_one("svg.chart-bars")
        assert stacked is not None and bars is not None
        # Hover text: a bucket's time and its GPU-hours by state.
        titles = [t.get_text() for t in stacked.select("title")]
        assert any("UTC" in t and "idle" in t for t in titles)
        assert any("$" in t.get_text() for t in bars.select("title"))


def test_json_keeps_the_page_access_rules(client: TestClient, two_days: None) -> None:
    token = client.headers.pop("Authorization")
    try:
        r = client.get("/", headers=JSON)
        assert r.status_code == 401 and r.json()["error"]
        r = client.get("/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
    finally:
        client.headers["Authorization"] = token


@pytest.mark.parametrize(("url", "param"), [("/?window=2w", "window"), ("/?dir=up", "dir")])
def test_bad_parameter_as_json(client: TestClient, engine: Any, url: str, param: str) -> None:
    body = get_json(client, url, status=400)
    assert body["detail"][0]["field"] == param


def test_top_wasters_show_their_mean_price_over_the_window(
    client: TestClient, sessions: sessionmaker[Session], two_days: None
) -> None:
    """The idle g5 billed $0.50/h for the last 12 of its 24 hours in the window: its rate is the mean of the bill and
    the catalog's price, as its dollars are."""
    start = floor_hour(datetime.now(UTC)) - timedelta(hours=12)
    bill(sessions, "i-idle", [start + timedelta(hours=h) for h in range(13)], 0.5, instance_type="g5.xlarge")
    view = get_json(client, "/?window=24h")
    [row] = [u for u in view["top_wasters"] if u["instance_id"] == "i-idle"]
    idle_h = row["idle_h"] + row["idle_held_h"]
    assert row["usd_per_hour"] == pytest.approx(row["waste"] / idle_h, rel=1e-6)
    assert 0.5 < row["usd_per_hour"] < 1.006
