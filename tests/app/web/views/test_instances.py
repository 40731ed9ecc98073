"""The instances page's view: its HTML, its htmx fragment and its JSON show the same figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.window import floor_hour
from app.web.templating import DASH, pct, usd, usd_rate
from tests.app.analyse.test_price_now import bill
from tests.app.web.views.pages import assert_bad_parameter, get_html, get_json, recent_start
from tests.factories import gpu, mig_slice
from tests.feeding import Feeder, busy, idle

REFUSED = [{"figure": "mem_used_mib", "call": "nvmlDeviceGetMemoryInfo", "grant": "mig-monitor"}]


@pytest.fixture
def fleet(feeder: Feeder) -> None:
    """A forgotten g5 idle for two hours, a busy p4d, an unpriced p5e, and a p4d with a GPU in MIG mode whose
    agent lacks a privilege."""
    start = recent_start(2)
    feeder.feed(
        [gpu(0, uid="GPU-forgotten", name="NVIDIA A10G")],
        start=start,
        hours=2,
        fn=idle,
        instance_id="i-forgotten",
        instance_type="g5.xlarge",
        tags={"team": "vision", "Name": "forgotten-box"},
    )
    feeder.feed([gpu(0, uid="GPU-busy")], start=start, hours=2, fn=busy(85), instance_id="i-busy")
    feeder.feed([gpu(0)], start=start, hours=2, fn=idle, instance_id="i-unpriced", instance_type="p5e.48xlarge")
    node = gpu(1, uid="GPU-mig", mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    node["permission_denied"] = REFUSED
    feeder.feed([gpu(0), node], start=start, hours=2, fn=busy(40), instance_id="i-mig")


def expected_cells(row: dict[str, Any]) -> list[str]:
    """The figures of a row as the HTML shows them, from its JSON: GPUs, price, util, cost, waste."""
    i, f = row["instance"], row["figures"]
    priced = i["usd_per_gpu_hour"] is not None
    money = [usd(f[k]) if f and priced else (usd(None) if not priced else DASH) for k in ("cost", "waste")]
    gpus = str(row["gpus"]) + (f"{row['mig_gpus']} MIG" if row["mig_gpus"] else "")
    return [
        gpus,
        usd_rate(i["usd_per_instance_hour"]) + i["price_source"],
        pct(f["avg_util_pct"]) if f else DASH,
        *money,
    ]


def assert_same_figures(doc: BeautifulSoup, data: dict[str, Any]) -> None:
    rows = doc.select("#instances tbody tr")
    assert [r["data-instance"] for r in rows] == [r["instance"]["instance_id"] for r in data["rows"]]
    for tr, row in zip(rows, data["rows"], strict=True):
        cells = [td.get_text(strip=True) for td in tr.select("td")]
        assert row["instance"]["name"] in cells[0]
        assert [cells[4], *cells[6:]] == expected_cells(row)
        assert (tr.select_one(".privileges") is not None) is row["missing_privileges"]


def test_json_has_the_figures_of_the_page(client: TestClient, fleet: None) -> None:
    data = get_json(client, "/instances")
    assert data["count"] == 4 and data["pager"]["total"] == 4 and data["no_agents"] is False
    assert data["sorting"] == {"sort": "waste", "dir": "desc"}
    rows = {r["instance"]["instance_id"]: r for r in data["rows"]}
    assert rows["i-forgotten"]["instance"]["name"] == "forgotten-box"
    assert rows["i-forgotten"]["figures"]["waste"] == pytest.approx(rows["i-forgotten"]["figures"]["cost"])
    assert rows["i-forgotten"]["figures"]["waste"] > 0
    assert rows["i-unpriced"]["instance"]["usd_per_gpu_hour"] is None
    assert (rows["i-mig"]["gpus"], rows["i-mig"]["mig_gpus"], rows["i-mig"]["missing_privileges"]) == (2, 1, True)
    assert not rows["i-busy"]["missing_privileges"]
    assert_same_figures(get_html(client, "/instances"), data)


def test_htmx_fragment_has_the_same_figures(client: TestClient, fleet: None) -> None:
    data = get_json(client, "/instances")
    r = client.get("/instances", headers={"HX-Request": "true"})
    assert r.status_code == 200
    assert "<html" not in r.text and "<nav" not in r.text
    assert_same_figures(BeautifulSoup(r.text, "html.parser"), data)


def test_sorting_and_filters_are_the_same_in_json_and_html(client: TestClient, fleet: None) -> None:
    url = "/instances?sort=name&dir=asc&instance_type=p4d.24xlarge"
    data = get_json(client, url)
    assert data["sorting"] == {"sort": "name", "dir": "asc"}
    assert data["filters"]["instance_types"] == ["p4d.24xlarge"]
    assert [r["instance"]["instance_id"] for r in data["rows"]] == ["i-busy", "i-mig"]
    doc = get_html(client, url)
    assert_same_figures(doc, data)
    assert doc.select_one("th[aria-sort]")["aria-sort"] == "ascending"


@pytest.mark.parametrize(
    ("query", "param"), [("dir=sideways", "dir"), ("page=0", "page"), ("lifecycle=reserved", "lifecycle")]
)
def test_bad_parameter_is_400_naming_it(client: TestClient, engine: Any, query: str, param: str) -> None:
    assert_bad_parameter(client, f"/instances?{query}", param)


def test_json_without_agents_says_so(client: TestClient, engine: Any) -> None:
    data = get_json(client, "/instances")
    assert data["no_agents"] is True and data["rows"] == [] and data["count"] == 0


def test_the_price_shown_is_the_price_now(client: TestClient, sessions: sessionmaker[Session], fleet: None) -> None:
    """The busy p4d billed $20/h in the current hour: the list and its page show that, not the catalog's price."""
    hour = floor_hour(datetime.now(UTC))
    bill(sessions, "i-busy", [hour - timedelta(hours=1), hour], 20.0)
    rows = {r["instance"]["instance_id"]: r for r in get_json(client, "/instances")["rows"]}
    busy_row = rows["i-busy"]["instance"]
    assert busy_row["usd_per_instance_hour"] == pytest.approx(20.0)
    assert busy_row["price_source"] == "billed"
    assert rows["i-forgotten"]["instance"]["price_source"].startswith("catalog")
    assert_same_figures(get_html(client, "/instances"), get_json(client, "/instances"))
    page = get_json(client, "/instances/i-busy")
    assert page["instance"]["ref"]["usd_per_instance_hour"] == pytest.approx(20.0)
