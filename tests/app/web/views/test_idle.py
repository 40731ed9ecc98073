"""The idle GPUs page as JSON: the same GPUs and figures as its table."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.web.templating import usd
from tests.app.web.views.pages import fragment, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import Feeder, busy, held, idle


@pytest.fixture
def idle_fleet(feeder: Feeder) -> None:
    start = recent_start(3)
    feeder.feed(
        [gpu(0, uid="GPU-a", name="NVIDIA A10G")],
        start=start,
        hours=3,
        step_s=60,
        fn=idle,
        instance_id="i-a",
        instance_type="g5.xlarge",
    )
    feeder.feed(
        [gpu(0, uid="GPU-b"), gpu(1, uid="GPU-c")],
        start=start,
        hours=3,
        step_s=60,
        fn={"GPU-b": held, "GPU-c": busy(70)},
        instance_id="i-b",
    )


def test_idle_gpus_as_json_match_the_page(client: TestClient, idle_fleet: None) -> None:
    view = get_json(client, "/gpus/idle")
    rows = view["rows"]
    assert [r["gpu_uuid"] for r in rows] == ["GPU-b", "GPU-a"]  # most burned first
    assert view["count"] == 2 and view["sorting"] == {"sort": "burned", "dir": "desc"}
    assert view["burned_usd"] == pytest.approx(sum(r["burned_usd"] for r in rows))
    for doc in (get_html(client, "/gpus/idle"), fragment(client, "/gpus/idle")):
        table = [(tr["data-gpu"], tr.select("td")[-2].get_text(strip=True)) for tr in doc.select("#idle-gpus tbody tr")]
        assert table == [(r["gpu_uuid"], usd(r["burned_usd"])) for r in rows]
        assert doc.select_one("[data-figure=burned]").get_text(strip=True) == usd(view["burned_usd"])
    held_row = rows[0]
    assert held_row["state"] == "idle-held" and held_row["instance"]["instance_id"] == "i-b"
    assert held_row["usd_per_day"] == pytest.approx(held_row["usd_per_hour"] * 24)


def test_idle_json_follows_sort_and_filters(client: TestClient, idle_fleet: None) -> None:
    view = get_json(client, "/gpus/idle?sort=instance&dir=asc&instance_type=g5.xlarge")
    assert [r["gpu_uuid"] for r in view["rows"]] == ["GPU-a"]
    assert view["filters"]["instance_types"] == ["g5.xlarge"]
