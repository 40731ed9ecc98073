"""The idle GPUs page as JSON: the same GPUs and figures as its table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.window import floor_hour
from app.web.templating import usd, usd_rate
from tests.app.analyse.test_price_now import bill
from tests.app.web.views.pages import fragment, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import Feeder, busy, held, idle

NOTEBOOK = {
    "id": 0,
    "pid": 31337,
    "executable": "<script>alert(1)</script>",
    "uid": 1003,
    "user": "asmith",
    "started_at": "2026-11-20T08:00:00Z",
    "namespace": "research",
    "pod": "jupyter-asmith",
}


def held_by_notebook(uid: str, t: datetime) -> dict[str, Any]:
    return {**held(uid, t), "holders": [{"ref": 0, "used_mib": 30000}]}


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
        fn={"GPU-b": held_by_notebook, "GPU-c": busy(70)},
        instance_id="i-b",
        holders=[NOTEBOOK],
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


def test_an_idle_held_gpu_names_who_holds_it(client: TestClient, idle_fleet: None) -> None:
    rows = {r["gpu_uuid"]: r for r in get_json(client, "/gpus/idle")["rows"]}
    [holder] = rows["GPU-b"]["holders"]
    assert (holder["user"], holder["pid"], holder["used_mib"]) == ("asmith", 31337, 30000)
    assert (holder["namespace"], holder["pod"]) == ("research", "jupyter-asmith")
    assert rows["GPU-a"]["holders"] == []  # idle with no process: nobody holds it
    doc = get_html(client, "/gpus/idle")
    [line] = doc.select('tr[data-gpu="GPU-b"] .holder')
    # The agent's strings are shown as text, never as markup.
    assert line.get_text(" ", strip=True).startswith("asmith · <script>alert(1)</script> · research/jupyter-asmith")
    assert doc.select("script") == [s for s in doc.select("script") if "alert" not in s.get_text()]


def test_idle_json_follows_sort_and_filters(client: TestClient, idle_fleet: None) -> None:
    view = get_json(client, "/gpus/idle?sort=instance&dir=asc&instance_type=g5.xlarge")
    assert [r["gpu_uuid"] for r in view["rows"]] == ["GPU-a"]
    assert view["filters"]["instance_types"] == ["g5.xlarge"]


def test_the_rate_is_the_price_now_with_its_source(
    client: TestClient, sessions: sessionmaker[Session], idle_fleet: None
) -> None:
    hour = floor_hour(datetime.now(UTC))
    # i-b billed at $40/h ($5 per GPU-hour) over its stretch and the hour in progress; i-a keeps the catalog's.
    bill(sessions, "i-b", [hour - timedelta(hours=h) for h in range(5)], 40.0)
    rows = {r["gpu_uuid"]: r for r in get_json(client, "/gpus/idle")["rows"]}
    b, a = rows["GPU-b"], rows["GPU-a"]
    assert (b["usd_per_hour"], b["price_source"], b["burned_sources"]) == (pytest.approx(5.0), "billed", ["billed"])
    assert b["burned_usd"] == pytest.approx(b["idle_hours"] * 5.0)
    assert b["usd_per_day"] == pytest.approx(120.0)
    assert b["instance"]["usd_per_gpu_hour"] == pytest.approx(5.0) and b["instance"]["price_kind"] == "billed"
    assert (a["usd_per_hour"], a["price_source"]) == (pytest.approx(1.006), "catalog")
    doc = get_html(client, "/gpus/idle")
    rates = {tr["data-gpu"]: tr.select("td")[-3].get_text(strip=True) for tr in doc.select("#idle-gpus tbody tr")}
    assert rates == {"GPU-b": usd_rate(5.0) + "billed", "GPU-a": usd_rate(1.006) + "catalog"}
