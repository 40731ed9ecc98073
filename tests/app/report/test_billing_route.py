"""GET /api/v1/billing: the billing page's figures as JSON (the page's own shape) and CSV, for a read token."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from sqlalchemy.orm import Session, sessionmaker

from app.db import session_scope
from app.web.views.billing import CSV_COLUMNS, BillingView
from tests.app.billing.test_reconcile import bill, record_export
from tests.conftest import make_token
from tests.factories import gpu
from tests.feeding import Feeder, busy

H = timedelta(hours=1)
URL = "/api/v1/billing"
VIEW_FIELDS = {
    "window",
    "imported",
    "newest_hour",
    "billed_until",
    "billed_instances",
    "billed_h",
    "billed_usd",
    "unmonitored",
    "unmonitored_h",
    "unmonitored_usd",
    "tolerance_pct",
    "compared_since",
    "disagreements",
    "exports",
    "spot_prices_on",
    "spot_reads",
}


@pytest.fixture
def read_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "read")


@pytest.fixture
def billed(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """Two billed hours from feeder.t0: i-half reported one of them, and a billed instance with no agent whose id a
    spreadsheet would run as a formula."""
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=1, step_s=600, fn=busy(50), instance_id="i-half", tags={"Name": "half"})
    with session_scope(sessions) as s:
        bill(s, "i-half", t0, 2, usd=3.0)
        bill(s, "=HYPERLINK(1)", t0, 2, usd=7.125, instance_type="p5.48xlarge")
        record_export(s, t0 + H)
    return t0


def get(client: TestClient, token: str, **params: Any) -> Any:
    return client.get(URL, params=params, headers={"Authorization": f"Bearer {token}"})


def test_json_is_the_pages_view(client: TestClient, read_token: str, billed: datetime) -> None:
    r = get(client, read_token)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == VIEW_FIELDS
    TypeAdapter(BillingView).validate_python(body)
    [unmonitored] = body["unmonitored"]
    assert set(unmonitored) == {
        "instance_id",
        "instance_type",
        "availability_zone",
        "usage_account",
        "purchase",
        "billed_h",
        "usd",
        "first_hour",
        "last_hour",
    }
    assert (unmonitored["instance_id"], unmonitored["billed_h"], unmonitored["usd"]) == ("=HYPERLINK(1)", 2.0, 14.25)
    [half] = body["disagreements"]
    assert set(half) == {
        "instance_id",
        "name",
        "instance_type",
        "first_hour",
        "last_hour",
        "billed_h",
        "reported_h",
        "difference_h",
        "difference_pct",
        "usd",
    }
    assert (half["instance_id"], half["billed_h"], half["reported_h"], half["usd"]) == ("i-half", 2.0, 1.0, 6.0)
    assert datetime.fromisoformat(body["billed_until"]) == billed + 2 * H
    assert body["window"]["label"] == "30d"
    # The same figures as the page's JSON.
    page = client.get("/billing", headers={"Authorization": f"Bearer {read_token}", "Accept": "application/json"})
    assert {k: v for k, v in page.json().items() if k != "window"} == {k: v for k, v in body.items() if k != "window"}


def test_csv_lists_the_instances(client: TestClient, read_token: str, billed: datetime) -> None:
    r = get(client, read_token, format="csv")
    assert r.status_code == 200 and r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"].startswith('attachment; filename="gpufleet-billing-')
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [(x["finding"], x["instance_id"]) for x in rows] == [
        ("unmonitored", "'=HYPERLINK(1)"),
        ("hours differ", "i-half"),
    ]
    unmonitored, half = rows
    assert (unmonitored["billed_h"], unmonitored["usd"], unmonitored["reported_h"]) == ("2", "14.25", "")
    assert (half["name"], half["billed_h"], half["reported_h"], half["difference_pct"]) == ("half", "2", "1", "-50")
    assert datetime.fromisoformat(half["first_hour"]) == billed
    assert get(client, read_token, format="csv", window="1h").text.splitlines() == [",".join(CSV_COLUMNS)]


def test_accept_chooses_csv(client: TestClient, read_token: str) -> None:
    headers = {"Authorization": f"Bearer {read_token}", "Accept": "text/csv"}
    assert client.get(URL, headers=headers).headers["content-type"].startswith("text/csv")
    assert client.get(URL, params={"format": "json"}, headers=headers).headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("params", "field"),
    [({"format": "xml"}, "format"), ({"window": "2d"}, "window"), ({"end": "2026-11-01"}, "start")],
)
def test_bad_parameters_are_400_naming_the_field(
    client: TestClient, read_token: str, params: dict[str, str], field: str
) -> None:
    r = get(client, read_token, **params)
    assert r.status_code == 400
    assert r.json()["error"] == "bad billing parameter" and r.json()["detail"][0]["field"] == field


def test_reading_needs_a_read_token(client: TestClient, ingest_token: str, read_token: str) -> None:
    assert client.get(URL).status_code == 401
    assert get(client, ingest_token).status_code == 403
    assert get(client, read_token).status_code == 200


def test_openapi_describes_the_endpoint(client: TestClient) -> None:
    op = client.get("/openapi.json").json()["paths"][URL]["get"]
    assert {p["name"] for p in op["parameters"]} == {"start", "end", "window", "format"}
    assert {"bearerToken": ["read"]} in op["security"]
    ok = op["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/BillingView")
    assert ok["text/csv"]["example"].startswith(",".join(CSV_COLUMNS))
