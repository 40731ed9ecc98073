"""The billing page: the bill against the agents as HTML, htmx fragment and JSON, the window, the empty state, and the
bill's and agents' strings shown as text."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db import session_scope
from app.web.templating import usd, utc
from tests.app.billing.test_reconcile import bill, record_export
from tests.app.web.views.pages import fragment, get_html, get_json
from tests.factories import gpu
from tests.feeding import Feeder, busy

H = timedelta(hours=1)
EVIL = '<script>alert("x")</script><b>bold</b>'
SPOT_READ = text(
    "INSERT INTO spot_price_reads (instance_type, availability_zone, failures, last_error) VALUES (:t, :z, 2, :e)"
)


@pytest.fixture
def billed_fleet(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """Three billed hours from feeder.t0: i-agree reported all three, i-short one, i-noagent has no agent. Returns
    the start of the first billed hour."""
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=3, step_s=300, fn=busy(50), instance_id="i-agree")
    feeder.feed([gpu(0)], start=t0, hours=1, step_s=300, fn=busy(50), instance_id="i-short", tags={"Name": "short"})
    with session_scope(sessions) as s:
        bill(s, "i-agree", t0, 3, usd=2.5)
        bill(s, "i-short", t0, 3, usd=1.25, instance_type="g5.xlarge")
        bill(s, "i-noagent", t0, 3, usd=10.0, instance_type="p5.48xlarge", zone="us-east-2b", purchase="spot")
        bill(s, "i-cheap", t0 + H, 1, usd=0.5, instance_type="g6.xlarge")
        record_export(s, t0 + 2 * H)
    return t0


def test_billing_as_json_matches_the_page(client: TestClient, billed_fleet: datetime) -> None:
    t0 = billed_fleet
    view = get_json(client, "/billing")
    assert view["imported"] is True and view["window"]["label"] == "30d"
    assert datetime.fromisoformat(view["billed_until"]) == t0 + 3 * H
    assert [u["instance_id"] for u in view["unmonitored"]] == ["i-noagent", "i-cheap"]
    noagent = view["unmonitored"][0]
    assert (noagent["billed_h"], noagent["usd"], noagent["purchase"]) == (3.0, 30.0, "spot")
    assert (noagent["instance_type"], noagent["availability_zone"]) == ("p5.48xlarge", "us-east-2b")
    assert (view["unmonitored_usd"], view["unmonitored_h"]) == (30.5, 4.0)
    # i-agree reported all its billed hours; i-short one of three.
    [short] = view["disagreements"]
    assert (short["instance_id"], short["name"], short["instance_type"]) == ("i-short", "short", "g5.xlarge")
    assert (short["billed_h"], short["reported_h"], short["usd"]) == (3.0, pytest.approx(1.0), 3.75)
    assert short["difference_h"] == pytest.approx(-2.0) and short["difference_pct"] == pytest.approx(-200 / 3)
    assert view["billed_instances"] == 4 and view["billed_usd"] == pytest.approx(7.5 + 3.75 + 30.5)
    assert [e["payer_account"] for e in view["exports"]] == ["123456789012"]

    for doc in (get_html(client, "/billing"), fragment(client, "/billing")):
        rows = [
            (tr["data-instance"], tr.select("td")[6].get_text(strip=True)) for tr in doc.select("#unmonitored tbody tr")
        ]
        assert rows == [("i-noagent", usd(30.0)), ("i-cheap", usd(0.5))]
        assert doc.select_one("[data-figure=unmonitored-total]").get_text(strip=True) == usd(30.5)
        assert [tr["data-instance"] for tr in doc.select("#disagreements tbody tr")] == ["i-short"]
        assert doc.select_one("[data-figure=billed-until]").get_text(strip=True) == utc(t0 + 3 * H)
    page = get_html(client, "/billing")
    assert page.select_one('nav.nav a[href="/billing"]')["aria-current"] == "page"
    assert page.select_one('#disagreements a[href="/instances/i-short"]').get_text(strip=True) == "short"


def window_url(start: datetime, end: datetime) -> str:
    return f"/billing?start={start.isoformat()}&end={end.isoformat()}".replace("+", "%2B")


def test_the_window_filters_the_billed_hours(client: TestClient, billed_fleet: datetime) -> None:
    t0 = billed_fleet
    # The first hour: i-cheap was not billed yet, and i-short reported it.
    first = get_json(client, window_url(t0, t0 + H))
    assert [(u["instance_id"], u["billed_h"]) for u in first["unmonitored"]] == [("i-noagent", 1.0)]
    assert first["disagreements"] == [] and first["billed_instances"] == 3
    # The second hour: i-short was billed for it but reported nothing.
    second = get_json(client, window_url(t0 + H, t0 + 2 * H))
    assert [(u["instance_id"], u["billed_h"]) for u in second["unmonitored"]] == [("i-noagent", 1.0), ("i-cheap", 1.0)]
    assert [(d["instance_id"], d["billed_h"], d["reported_h"]) for d in second["disagreements"]] == [
        ("i-short", 1.0, 0.0)
    ]
    before = window_url(t0 - 48 * H, t0)
    assert get_json(client, before)["billed_instances"] == 0
    doc = get_html(client, before)
    assert doc.select_one("#nothing-billed") is not None and doc.select_one("#unmonitored") is None
    assert doc.select_one("#exports") is not None  # the exports are listed whatever the window


def test_nothing_imported_says_what_to_do(client: TestClient, engine: Any) -> None:
    view = get_json(client, "/billing")
    assert view["imported"] is False and view["billed_until"] is None and view["exports"] == []
    assert view["unmonitored"] == [] and view["disagreements"] == []
    assert view["spot_prices_on"] is False and view["spot_reads"] == []
    doc = get_html(client, "/billing")
    empty = doc.select_one("#live .empty-state").get_text(" ", strip=True)
    assert "No bill imported yet" in empty
    assert "gpufleet billing import" in empty and "docs/billing.md" in empty
    assert doc.select_one("#exports") is None and doc.select_one("[data-figure=billed-until]") is None
    assert "GPUFLEET_SPOT_PRICES=on" in doc.select_one("#spot-off").get_text()


def test_bill_and_agent_strings_are_text(client: TestClient, feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=1, step_s=600, fn=busy(50), instance_id="i-evil", tags={"Name": EVIL})
    with session_scope(sessions) as s:
        bill(s, EVIL, t0, 2, instance_type=EVIL, zone=None, account=EVIL)
        bill(s, "i-evil", t0, 3)
        record_export(s, t0 + 2 * H)
        s.execute(SPOT_READ, {"t": EVIL, "z": "us-east-1a", "e": EVIL})
    r = client.get("/billing")
    assert r.status_code == 200
    assert "<script>alert" not in r.text and "<b>bold</b>" not in r.text
    doc = get_html(client, "/billing")
    assert not doc.select("b") and not [s for s in doc.select("script") if "alert" in s.get_text()]
    [row] = doc.select("#unmonitored tbody tr")
    assert row["data-instance"] == EVIL
    assert [td.get_text(strip=True) for td in row.select("td")[:2]] == [EVIL, EVIL]
    assert doc.select_one("#disagreements tbody tr a").get_text(strip=True) == EVIL
    assert doc.select_one("#spot-reads tbody tr td.wrap").get_text(strip=True) == EVIL


def test_spot_reading_on_lists_the_pools_read(
    client: TestClient, engine: Any, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = client.app.state.gpufleet  # type: ignore[attr-defined]
    monkeypatch.setattr(state, "settings", state.settings.model_copy(update={"spot_prices": "on"}))
    doc = get_html(client, "/billing")
    assert doc.select_one("#spot-off") is None
    assert "No spot pool read yet" in doc.select_one("#live").get_text()
    with session_scope(sessions) as s:
        s.execute(SPOT_READ, {"t": "p4d.24xlarge", "z": "us-east-1a", "e": "RequestLimitExceeded: slow down"})
    view = get_json(client, "/billing")
    assert view["spot_prices_on"] is True
    [pool] = view["spot_reads"]
    assert (pool["instance_type"], pool["failures"], pool["last_error"]) == (
        "p4d.24xlarge",
        2,
        "RequestLimitExceeded: slow down",
    )
    [row] = get_html(client, "/billing").select("#spot-reads tbody tr")
    assert row["data-pool"] == "p4d.24xlarge/us-east-1a"
