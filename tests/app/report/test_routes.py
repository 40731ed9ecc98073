"""GET /api/v1/report on constructed data: known answers in JSON and CSV, the same numbers as the dashboard."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import make_token
from tests.factories import gpu
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, idle

H = timedelta(hours=1)
URL = "/api/v1/report"


@pytest.fixture
def read_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "read")


@pytest.fixture
def story(feeder: Feeder) -> dict[str, Any]:
    """Two whole past hours: an idle p4d GPU (team vision) and a g5 at 40% (team nlp, spot)."""
    start = feeder.t0
    feeder.feed([gpu(0)], start=start, hours=2, fn=idle, instance_id="i-p4d", tags={"team": "vision"})
    feeder.feed(
        [gpu(0)], start=start, hours=2, fn=busy(40), instance_id="i-g5", instance_type="g5.xlarge", tags={"team": "nlp"}
    )
    return {"start": start, "end": start + 2 * H}


def get(client: TestClient, token: str, **params: Any) -> Any:
    return client.get(URL, params=params, headers={"Authorization": f"Bearer {token}"})


def test_json_known_answers(client: TestClient, read_token: str, story: dict[str, Any]) -> None:
    r = get(client, read_token, start=story["start"].isoformat(), end=story["end"].isoformat(), group_by="tag:team")
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {row["group"]["tag:team"]: row for row in body["rows"]}
    vision = rows["vision"]
    assert vision["gpu_hours"] == pytest.approx(2.0)
    assert vision["idle_h"] == pytest.approx(2.0)
    assert vision["idle_cost"] == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)
    assert vision["currency"] == "USD" and vision["price_source"] == "catalog on-demand"
    nlp = rows["nlp"]
    assert nlp["avg_util_pct"] == pytest.approx(40.0)
    assert nlp["unused_cost"] == pytest.approx(0.6 * nlp["cost"], abs=1e-5)
    assert body["totals"]["cost"] == pytest.approx(vision["cost"] + nlp["cost"], abs=1e-5)


def test_csv_has_a_header_one_row_per_group_and_totals(
    client: TestClient, read_token: str, story: dict[str, Any]
) -> None:
    r = get(
        client,
        read_token,
        start=story["start"].isoformat(),
        end=story["end"].isoformat(),
        group_by="instance_type,region",
        format="csv",
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [t["instance_type"] for t in table] == ["p4d.24xlarge", "g5.xlarge", "TOTAL"]
    assert table[0]["region"] == "us-east-1"
    assert float(table[0]["idle_cost"]) == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)
    assert datetime.fromisoformat(table[0]["start"]) == story["start"]
    # Accept: text/csv chooses CSV too.
    r2 = client.get(
        URL,
        params={"start": story["start"].isoformat(), "end": story["end"].isoformat()},
        headers={"Authorization": f"Bearer {read_token}", "Accept": "text/csv"},
    )
    assert r2.headers["content-type"].startswith("text/csv")


def test_report_equals_dashboard(client: TestClient, read_token: str, story: dict[str, Any]) -> None:
    params = {"window": "24h", "group_by": "instance_type"}
    body = get(client, read_token, **params).json()
    doc = BeautifulSoup(client.get("/waste", params=params).text, "html.parser")
    shown = doc.select_one("[data-figure=total-waste]").get_text(strip=True)
    waste = body["totals"]["idle_cost"] + body["totals"]["idle_held_cost"]
    assert shown == f"${waste:,.2f}"
    shown_cost = doc.select_one("[data-figure=total-cost]").get_text(strip=True)
    assert shown_cost == f"${body['totals']['cost']:,.2f}"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-11-20T00:00:00Z", "end": "2026-11-19T00:00:00Z"}, "end"),
        ({"group_by": "colour"}, "group_by"),
        ({"group_by": "region,region"}, "group_by"),
        ({"format": "xml"}, "format"),
        ({"tag": "novalue"}, "tag"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    client: TestClient, read_token: str, params: dict[str, str], field: str
) -> None:
    r = get(client, read_token, **params)
    assert r.status_code == 400
    assert r.json()["detail"][0]["field"] == field


def test_reading_needs_a_read_token(client: TestClient, ingest_token: str, read_token: str) -> None:
    assert client.get(URL).status_code == 401
    assert get(client, ingest_token).status_code == 403
    assert get(client, read_token).status_code == 200


def test_default_window_is_the_last_seven_days(client: TestClient, read_token: str) -> None:
    body = get(client, read_token).json()
    start = datetime.fromisoformat(body["start"])
    assert datetime.now(UTC) - start < timedelta(days=7, hours=1)
    assert datetime.now(UTC) - start > timedelta(days=6)
