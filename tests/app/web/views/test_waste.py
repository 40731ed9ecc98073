"""The waste page's view: its HTML, its htmx fragment and its JSON show the same figures."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

import pytest
from bs4 import BeautifulSoup, Tag
from fastapi.testclient import TestClient

from app.web.templating import DASH, num, pct, usd
from tests.app.web.views.pages import assert_bad_parameter, get_html, get_json, recent_start
from tests.factories import gpu
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, held, holders_story, idle

URL = "/waste?group_by=tag:team&window=24h"


@pytest.fixture
def fleet(feeder: Feeder) -> None:
    """A forgotten g5 idle for two hours (team vision), a busy p4d (team nlp) and an unpriced p5e (team nlp)."""
    start = recent_start(2)
    feeder.feed(
        [gpu(0, uid="GPU-forgotten", name="NVIDIA A10G")],
        start=start,
        hours=2,
        fn=idle,
        instance_id="i-forgotten",
        instance_type="g5.xlarge",
        tags={"team": "vision"},
    )
    feeder.feed([gpu(0, uid="GPU-busy")], start=start, hours=2, fn=busy(85), instance_id="i-busy", tags={"team": "nlp"})
    feeder.feed(
        [gpu(0, uid="GPU-unpriced")],
        start=start,
        hours=2,
        fn=idle,
        instance_id="i-unpriced",
        instance_type="p5e.48xlarge",
        tags={"team": "nlp"},
    )


def row_cells(doc: BeautifulSoup | Tag, key: str) -> list[str]:
    row = doc.select_one(f"#waste-table tbody tr[data-key='{key}']")
    assert row is not None, key
    return [td.get_text(strip=True) for td in row.select("td")]


def expected_cells(row: dict[str, Any]) -> list[str]:
    """A row as the HTML shows it, from its JSON."""
    f = row["figures"]
    unknown = pct(f["unknown_share"] * 100) if f["unknown_share"] is not None else DASH
    cost = usd(f["cost"]) if f["unpriced_gpu_hours"] < f["gpu_hours"] or f["gpu_hours"] == 0 else usd(None)
    money = [usd(f[k]) for k in ("idle_cost", "idle_held_cost", "unused_cost", "waste")]
    return [
        row["label"],
        num(f["gpu_hours"], 1),
        pct(f["avg_util_pct"]),
        unknown,
        num(f["offline_h"], 1),
        cost,
        *money,
        usd(row["waste_per_month_usd"]),
        "; ".join(row["prices"]),
    ]


def _same_cell(got: str, want: str) -> bool:
    """The same text, or, for figures, the same number to the precision shown: the page and its JSON are two
    requests, and figures that grow with the clock (offline hours, monthly rates) may move in the last digit."""
    if got == want:
        return True
    try:
        a, b = (float(t.strip("$%h ").replace(",", "")) for t in (got, want))
    except ValueError:
        return False
    return a == pytest.approx(b, rel=0.01, abs=0.11)


def assert_same_figures(doc: BeautifulSoup, data: dict[str, Any]) -> None:
    assert [r["data-key"] for r in doc.select("#waste-table tbody tr")] == [r["key"] for r in data["rows"]]
    for row in data["rows"]:
        got, want = row_cells(doc, row["key"]), expected_cells(row)
        assert len(got) == len(want) and all(_same_cell(g, w) for g, w in zip(got, want, strict=True)), (got, want)
    totals = data["totals"]
    assert doc.select_one("[data-figure=total-waste]").get_text(strip=True) == usd(totals["waste"])
    assert doc.select_one("[data-figure=total-cost]").get_text(strip=True) == usd(totals["cost"])
    month = doc.select_one("[data-figure=total-waste-month]").get_text(strip=True)
    assert _same_cell(month, usd(data["waste_per_month_usd"]))


def test_json_has_the_figures_of_the_page(client: TestClient, fleet: None) -> None:
    data = get_json(client, URL)
    assert data["group_by"] == "tag:team" and data["group_label"] == "Tag team"
    assert {r["key"] for r in data["rows"]} == {"vision", "nlp"}
    vision = next(r for r in data["rows"] if r["key"] == "vision")
    # Two idle hours of a g5.xlarge: all of its cost is waste.
    assert vision["figures"]["gpu_hours"] == pytest.approx(2.0, abs=0.05)
    assert vision["figures"]["waste"] == pytest.approx(vision["figures"]["cost"]) and vision["figures"]["waste"] > 0
    assert data["totals"]["unpriced_gpu_hours"] == pytest.approx(2.0, abs=0.05)
    assert data["sorting"] == {"sort": "waste", "dir": "desc"}
    assert data["pager"]["total"] == 2 and data["no_agents"] is False
    assert data["window"]["label"] == "24h" and data["filters"]["tags"] == []

    doc = get_html(client, URL)
    assert_same_figures(doc, data)
    assert doc.select_one(".note.unpriced") is not None
    options = [(o["value"], o.get_text(strip=True)) for o in doc.select("select[name=group_by] option")]
    assert options == [(c["value"], c["label"]) for c in data["choices"]]
    assert ("tag:team", "Tag team") in options
    assert doc.select_one("select[name=group_by] option[selected]")["value"] == "tag:team"
    assert f"Total ({data['pager']['total']})" in doc.select_one("#waste-table tfoot").get_text(" ", strip=True)


def test_htmx_fragment_has_the_same_figures(client: TestClient, fleet: None) -> None:
    data = get_json(client, URL)
    r = client.get(URL, headers={"HX-Request": "true"})
    assert r.status_code == 200
    assert "<html" not in r.text and "<nav" not in r.text and "<select" not in r.text
    assert_same_figures(BeautifulSoup(r.text, "html.parser"), data)


def test_sorting_is_the_same_in_json_and_html(client: TestClient, fleet: None) -> None:
    url = "/waste?group_by=instance&sort=label&dir=asc"
    data = get_json(client, url)
    assert data["sorting"] == {"sort": "label", "dir": "asc"}
    labels = [r["label"] for r in data["rows"]]
    assert labels == sorted(labels, key=str.lower) and len(labels) == 3
    doc = get_html(client, url)
    assert [r.select_one("td").get_text(strip=True) for r in doc.select("#waste-table tbody tr")] == labels
    assert doc.select_one("th[aria-sort]")["aria-sort"] == "ascending"


def test_a_tag_no_instance_has_stays_chosen(client: TestClient, fleet: None) -> None:
    url = "/waste?group_by=tag:cost-centre"
    data = get_json(client, url)
    assert {"value": "tag:cost-centre", "label": "Tag cost-centre"} in data["choices"]
    assert [r["label"] for r in data["rows"]] == ["(no cost-centre tag)"]
    doc = get_html(client, url)
    assert doc.select_one("select[name=group_by] option[selected]")["value"] == "tag:cost-centre"


@pytest.mark.parametrize(
    ("query", "param"),
    [("group_by=nope", "group_by"), ("dir=sideways", "dir"), ("group_by=region,lifecycle", "group_by")],
)
def test_bad_parameter_is_400_naming_it(client: TestClient, engine: Any, query: str, param: str) -> None:
    assert_bad_parameter(client, f"/waste?{query}", param)


def test_json_without_agents_says_so(client: TestClient, engine: Any) -> None:
    data = get_json(client, "/waste")
    assert data["no_agents"] is True and data["rows"] == [] and data["group_by"] == "instance_type"


def test_grouped_by_user_names_who_left_gpus_idle(client: TestClient, feeder: Feeder) -> None:
    story = holders_story(feeder)
    url = f"/waste?group_by=user&start={quote(story['start'].isoformat())}&end={quote(story['end'].isoformat())}"
    data = get_json(client, url)
    assert data["group_by"] == "user" and data["group_label"] == "User"
    rows = {r["label"]: r for r in data["rows"]}
    assert set(rows) == {"ana", "root", "mchen", "(none)"}
    assert rows["ana"]["figures"]["idle_held_cost"] == pytest.approx(P4D_PER_GPU_HOUR, abs=0.01)
    doc = get_html(client, url)
    assert_same_figures(doc, data)
    assert doc.select_one("select[name=group_by] option[selected]")["value"] == "user"
    labels = {c.get_text(strip=True) for c in doc.select("#waste-table tbody tr td:first-child")}
    assert {"ana", "root", "mchen", "(none)"} <= labels


def test_a_holder_named_like_markup_is_text(client: TestClient, feeder: Feeder) -> None:
    evil = {"id": 0, "pid": 1, "executable": "<script>alert(1)</script>", "user": "<b>eve</b>"}

    def held_by_evil(uid: str, t: datetime) -> dict[str, Any]:
        return {**held(uid, t), "holders": [{"ref": 0}]}

    feeder.feed([gpu(0)], start=recent_start(1), hours=1, fn=held_by_evil, holders=[evil])
    r = client.get("/waste?group_by=process")
    assert "<script>alert(1)</script>" not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    r = client.get("/waste?group_by=user")
    assert "<b>eve</b>" not in r.text and "&lt;b&gt;eve&lt;/b&gt;" in r.text
