"""Hour-by-hour prices on a fleet whose bill, spot prices and states are worked out by hand: the analysis, the
report (JSON and CSV) and /waste give the same dollars, over a window that spans price changes."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from app.billing.prices import remake_billed_prices
from app.billing.tables import billed_hours, billing_exports, spot_prices
from app.db import session_scope
from tests.app.analyse.conftest import Analyst, Feeder, busy, idle
from tests.conftest import make_token
from tests.factories import gpu

H = timedelta(hours=1)
P4D, SPOT, BLOCK = "i-0a00000000000000a", "i-0b00000000000000b", "i-0c00000000000000c"
P5_HOUR = 31.464  # USD per instance-hour of the Capacity Block


def bill(session: Session, instance_id: str, instance_type: str, hours: dict[Any, float], kind: str | None) -> None:
    for hour, usd in hours.items():
        session.execute(
            insert(billed_hours).values(
                instance_id=instance_id,
                hour=hour,
                payer_account="123456789012",
                billing_period=hour.date().replace(day=1),
                instance_type=instance_type,
                purchase="capacity block" if kind else "savings plan",
                usage_h=1.0,
                usd=usd,
                reservation_id="cr-0123" if kind else None,
                reservation_kind=kind,
            )
        )


@pytest.fixture
def fleet(feeder: Feeder, sessions: sessionmaker[Session]) -> dict[str, float]:
    """Four hours from t0. p4d: idle 2 h at $24/h, then 40 % busy 2 h at $16/h (billed). g5.xlarge on spot: idle,
    its pool at $0.40/h until t0 + 1.5 h, then $0.50/h. p5 in a Capacity Block: 50 % busy 1 h, then its agent
    stops; billed at hours 0 and 3 only, the block paid throughout. One GPU each."""
    t0 = feeder.t0
    g = gpu(0)
    feeder.feed([g], start=t0, hours=2, fn=idle, instance_id=P4D)
    feeder.feed([g], start=t0 + 2 * H, hours=2, fn=busy(40.0), instance_id=P4D)
    feeder.feed(
        [gpu(0, name="NVIDIA A10G")],
        start=t0,
        hours=3,
        fn=idle,
        instance_id=SPOT,
        instance_type="g5.xlarge",
        lifecycle="spot",
        availability_zone="us-east-1b",
    )
    feeder.feed(
        [gpu(0, name="NVIDIA H100 80GB HBM3")],
        start=t0,
        hours=1,
        fn=busy(50.0),
        instance_id=BLOCK,
        instance_type="p5.48xlarge",
    )
    with session_scope(sessions) as s:
        bill(s, P4D, "p4d.24xlarge", {t0: 24.0, t0 + H: 24.0, t0 + 2 * H: 16.0, t0 + 3 * H: 16.0}, None)
        bill(s, BLOCK, "p5.48xlarge", {t0: P5_HOUR, t0 + 3 * H: P5_HOUR}, "capacity block")
        s.execute(
            insert(billing_exports).values(
                payer_account="123456789012",
                billing_period=t0.date().replace(day=1),
                files=[],
                digest="",
                lines=6,
                instance_hours=6.0,
                usd=2 * 24 + 2 * 16 + 2 * P5_HOUR,
                newest_hour=t0 + 3 * H,
            )
        )
        remake_billed_prices(s)
        s.execute(
            insert(spot_prices),
            [
                {
                    "instance_type": "g5.xlarge",
                    "availability_zone": "us-east-1b",
                    "ts": t0 - 24 * H,
                    "usd_per_hour": 0.4,
                },
                {
                    "instance_type": "g5.xlarge",
                    "availability_zone": "us-east-1b",
                    "ts": t0 + 1.5 * H,
                    "usd_per_hour": 0.5,
                },
            ],
        )
    p5 = P5_HOUR / 8
    return {
        "p4d_cost": 2 * 24 / 8 + 2 * 16 / 8,
        "p4d_waste": 2 * 24 / 8,
        "spot_cost": 0.40 + 0.45 + 0.50,
        "block_cost": 4 * p5,  # one hour run, three paid while offline
        "block_waste": 3 * p5,
    }


def test_each_hour_is_priced_at_the_price_in_force_then(
    feeder: Feeder, analyst: Analyst, fleet: dict[str, float]
) -> None:
    t0 = feeder.t0
    a = analyst.waste(t0, t0 + 4 * H)
    rows = {r.key: r for r in a.group("instance")}
    p4d, spot, block = rows[P4D], rows[SPOT], rows[BLOCK]
    assert p4d.figures.cost == pytest.approx(fleet["p4d_cost"])
    assert p4d.figures.waste == pytest.approx(fleet["p4d_waste"])
    assert p4d.figures.unused_cost == pytest.approx(fleet["p4d_waste"] + 2 * 0.6 * 16 / 8)
    assert spot.figures.cost == pytest.approx(fleet["spot_cost"]) and spot.figures.waste == pytest.approx(
        fleet["spot_cost"]
    )
    assert spot.figures.offline_h == pytest.approx(1.0)  # the hour after its data stopped: not paid
    assert block.figures.cost == pytest.approx(fleet["block_cost"])
    assert block.figures.waste == pytest.approx(fleet["block_waste"])
    assert block.figures.offline_h == pytest.approx(3.0) and block.figures.active_h == pytest.approx(1.0)
    assert p4d.source_shares == {"billed": 1.0} and block.source_shares == {"billed": 1.0}
    assert spot.source_shares == {"spot history": 1.0} and spot.prices == {"spot history"}
    # Hours are what they are without the bill.
    assert a.totals.gpu_hours == pytest.approx(4 + 3 + 1)


def test_report_json_csv_and_waste_page_give_the_same_dollars(
    client: TestClient, sessions: sessionmaker[Session], feeder: Feeder, fleet: dict[str, float]
) -> None:
    t0 = feeder.t0
    span = {"start": t0.isoformat(), "end": (t0 + 4 * H).isoformat()}
    headers = {"Authorization": f"Bearer {make_token(sessions, 'read')}"}
    cost = fleet["p4d_cost"] + fleet["spot_cost"] + fleet["block_cost"]
    waste = fleet["p4d_waste"] + fleet["spot_cost"] + fleet["block_waste"]
    r = client.get("/api/v1/report", params={**span, "group_by": "instance"}, headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {row["group"]["instance"]: row for row in body["rows"]}
    assert rows[SPOT]["price_sources"] == {"spot history": 1.0} and rows[P4D]["price_sources"] == {"billed": 1.0}
    assert body["totals"]["cost"] == pytest.approx(cost, abs=1e-5)
    assert body["totals"]["idle_cost"] + body["totals"]["idle_held_cost"] == pytest.approx(waste, abs=1e-5)
    r = client.get("/api/v1/report", params={**span, "group_by": "instance", "format": "csv"}, headers=headers)
    [total] = [row for row in csv.DictReader(io.StringIO(r.text)) if row["instance"] == "TOTAL"]
    assert float(total["cost"]) == pytest.approx(cost, abs=1e-5)
    assert total["price_source_shares"].startswith("billed ")
    r = client.get("/waste", params=span, headers={**headers, "Accept": "application/json"})
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["totals"]["cost"] == pytest.approx(cost, abs=1e-5)
    assert page["price_sources"].keys() == {"billed", "spot history"}
    billed_until = t0 + 4 * H  # the block's last billed hour ends there
    assert datetime.fromisoformat(page["billed_until"]) == datetime.fromisoformat(body["billed_until"]) == billed_until
    html = client.get("/waste", params=span, headers=headers).text
    assert "The bill is imported up to" in html and "spot history" in html
    assert page["totals"]["waste"] == pytest.approx(waste, abs=1e-5)
