"""The heatmap: rows per instance, GPU or tag value, columns per hour or day, cells coloured by state; paged; the
same figures as JSON."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.web.views import heatmap
from tests.app.web.views.pages import fragment, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import Feeder, busy, idle


@pytest.fixture
def fleet(feeder: Feeder) -> datetime:
    """Three instances for 4 hours: an idle g5 (team vision), a busy p4d GPU and an idle one (team nlp), a busy g5
    of another team."""
    start = recent_start(4)
    feeder.feed(
        [gpu(0, uid="GPU-v", name="NVIDIA A10G")],
        start=start, hours=4, step_s=300, fn=idle, instance_id="i-vision", instance_type="g5.xlarge",
        tags={"team": "vision"},
    )  # fmt: skip
    feeder.feed(
        [gpu(0, uid="GPU-n0"), gpu(1, uid="GPU-n1")],
        start=start, hours=4, step_s=300, fn={"GPU-n0": busy(90), "GPU-n1": idle}, instance_id="i-nlp",
        tags={"team": "nlp"},
    )  # fmt: skip
    feeder.feed(
        [gpu(0, uid="GPU-u", name="NVIDIA A10G")],
        start=start, hours=4, step_s=300, fn=busy(50), instance_id="i-other", instance_type="g5.xlarge",
    )  # fmt: skip
    return start


def test_rows_per_instance_hour_by_hour(client: TestClient, fleet: datetime) -> None:
    view = get_json(client, "/heatmap?window=24h")
    assert view["step_s"] == 3600 and len(view["starts"]) == 24 and view["rows_by"] == "instance"
    keys = [r["key"] for r in view["rows"]]
    assert keys[:2] == ["i-nlp", "i-vision"]  # the most wasteful first
    rows = {r["key"]: r for r in view["rows"]}
    starts = [datetime.fromisoformat(t) for t in view["starts"]]
    began = starts.index(fleet.replace(minute=0, second=0, microsecond=0))
    first = starts.index(fleet.replace(minute=0) + timedelta(hours=1))

    def span_at(key: str, index: int) -> dict[str, Any]:
        return next(s for s in rows[key]["spans"] if s["first"] <= index < s["first"] + s["count"])

    # Before the data began a row has no span; the hours wholly inside the data hold the instance's state.
    assert min(s["first"] for s in rows["i-vision"]["spans"]) == began
    assert all(span_at("i-vision", h)["state"] == "idle" for h in range(first, first + 3))
    assert all(span_at("i-other", h)["state"] == "active" for h in range(first, first + 3))
    # One busy and one idle GPU: as many active as idle hours, and the tie goes to active.
    nlp = span_at("i-nlp", first)
    assert nlp["state"] == "active" and nlp["active_h"] == pytest.approx(nlp["idle_h"])
    # Runs of one state come as one span, and the spans add up to the row's figures over the window.
    assert len(rows["i-vision"]["spans"]) < 3
    total = sum(s["waste_usd"] for s in rows["i-vision"]["spans"])
    assert total == pytest.approx(rows["i-vision"]["figures"]["waste"], rel=1e-9)
    for doc in (get_html(client, "/heatmap?window=24h"), fragment(client, "/heatmap?window=24h")):
        svg = doc.select_one("section#heatmap svg.chart-heatmap")
        assert svg is not None
        titles = [t.get_text() for t in svg.select("title")]
        assert any(" UTC (" in t and ": idle " in t and "wasted" in t for t in titles)
        assert [tr["data-row"] for tr in doc.select("#heatmap-rows tbody tr")] == keys
        assert svg.select('a[href="/instances/i-vision"]')


def test_rows_per_gpu_and_per_tag_value(client: TestClient, fleet: datetime) -> None:
    gpus = get_json(client, "/heatmap?rows=gpu&window=24h")
    assert len(gpus["rows"]) == 4
    assert gpus["rows"][0]["href"].startswith("/instances/")
    tags = get_json(client, "/heatmap?rows=tag:team&window=24h")
    labels = [r["label"] for r in tags["rows"]]
    assert labels[:2] == ["nlp", "vision"] and len(labels) == 3
    nlp = tags["rows"][0]
    assert nlp["href"] == "/heatmap?rows=gpu&window=24h&tag=team%3Anlp"
    assert [c["value"] for c in tags["row_choices"]] == ["instance", "gpu", "tag:team"]
    # A tag value's link keeps an explicit window and the filters.
    start, end = gpus["window"]["start"], gpus["window"]["end"]
    ranged = get_json(client, f"/heatmap?rows=tag:team&start={start}&end={end}&region=us-east-1".replace("+", "%2B"))
    link = next(r["href"] for r in ranged["rows"] if r["label"] == "nlp")
    assert "start=" in link and "end=" in link and "region=us-east-1" in link and "window=" not in link
    assert len(get_json(client, link)["rows"]) == 2
    # Filters apply as everywhere.
    only = get_json(client, "/heatmap?rows=gpu&window=24h&tag=team:nlp")
    assert len(only["rows"]) == 2


def test_long_windows_go_by_day_and_rows_come_a_page_at_a_time(
    client: TestClient, fleet: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    week = get_json(client, "/heatmap?window=30d")
    assert week["step_s"] == 86400 and len(week["starts"]) == 30
    assert get_json(client, "/heatmap?rows=gpu&window=24h")["rows_per_page"] == heatmap.GPU_ROWS_PER_PAGE
    assert get_json(client, "/heatmap?window=24h")["rows_per_page"] == heatmap.ROWS_PER_PAGE
    monkeypatch.setattr(heatmap, "GPU_ROWS_PER_PAGE", 2)
    first = get_json(client, "/heatmap?rows=gpu&window=24h")
    second = get_json(client, "/heatmap?rows=gpu&window=24h&page=2")
    assert first["pager"]["pages"] == 2 and len(first["rows"]) == 2 and len(second["rows"]) == 2
    assert {r["key"] for r in first["rows"]}.isdisjoint(r["key"] for r in second["rows"])
    doc = get_html(client, "/heatmap?rows=gpu&window=24h")
    assert doc.select_one("nav.pager a[rel=next]") is not None


def test_bad_rows(client: TestClient, fleet: datetime) -> None:
    assert get_json(client, "/heatmap?rows=rack", status=400)["detail"][0]["field"] == "rows"
    assert "rows" in get_html(client, "/heatmap?rows=rack", status=400).get_text()
