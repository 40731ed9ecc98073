"""The MIG page's view: its HTML, its htmx fragment and its JSON show the same figures; the layout drawing is
made from the view's slots and never travels in the JSON."""

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
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import Feeder, busy, held, idle, unknown


@pytest.fixture
def fleet(feeder: Feeder) -> None:
    """An A100 in MIG mode with a 3g slice that never had a process, a 2g slice held at 0% and 2 compute slices
    free; beside it a busy passthrough p4d."""
    start = recent_start(2)
    node = gpu(
        0,
        uid="GPU-mig",
        mig=True,
        slices=[mig_slice(1, "3g.20gb", uid="MIG-a"), mig_slice(2, "2g.10gb", uid="MIG-b")],
        unpartitioned=2,
    )
    pod = {"id": 0, "pid": 977, "executable": "vllm", "uid": 0, "user": "root", "namespace": "inference",
           "pod": "vllm-0", "container_id": "c0ffee" * 10 + "abcd"}  # fmt: skip

    def held_by_pod(uid: str, t: datetime) -> dict[str, Any]:
        return {**held(uid, t), "holders": [{"ref": 0, "used_mib": 9000}]}

    feeder.feed(
        [node],
        start=start,
        hours=2,
        fn={"GPU-mig": unknown, "MIG-a": unknown, "MIG-b": held_by_pod},
        instance_id="i-mig",
        holders=[pod],
    )
    feeder.feed([gpu(0, uid="GPU-busy")], start=start, hours=2, fn=busy(85), instance_id="i-busy")


@pytest.fixture
def gaps(feeder: Feeder) -> None:
    """A GPU with a slice of unknown size (its free capacity unknown) and a GPU whose layout is incomplete."""
    one = gpu(1, uid="GPU-gaps-1", mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    two = gpu(2, uid="GPU-gaps-2", mig=True, slices=[mig_slice(1, "4g.20gb")], unpartitioned=3)
    two["layout_complete"] = False
    feeder.feed([one, two], start=recent_start(2), hours=2, fn=idle, instance_id="i-gaps")


def assert_same_figures(doc: BeautifulSoup, data: dict[str, Any]) -> None:
    def figure(name: str) -> str:
        return doc.select_one(f"[data-figure={name}]").get_text(strip=True)

    assert figure("mig-gpus") == str(data["mig_gpus"])
    assert figure("underused") == str(data["underused_count"])
    assert figure("free-rate") == usd_rate(data["free_usd_per_hour"])
    assert figure("unpartitioned-cost") == usd(data["unpartitioned_cost_usd"])
    figures = doc.select("figure.mig-gpu")
    assert [f["data-gpu"] for f in figures] == [g["gpu"]["uuid"] for g in data["gpus"]]
    for fig, g in zip(figures, data["gpus"], strict=True):
        blocks = fig.select("svg g.slot")
        assert [b.select_one("text").get_text() for b in blocks] == [s["label"] for s in g["slots"]]
        assert [b["class"] for b in blocks] == [["slot", f"state-{s['state']}"] for s in g["slots"]]
        assert [b.select_one("title").get_text() for b in blocks] == [s["detail"] for s in g["slots"]]
        assert g["gpu"]["instance"]["name"] in fig.select_one("figcaption").get_text()
    rows = doc.select("#underused tbody tr")
    assert len(rows) == len(data["underused"])
    for tr, s in zip(rows, data["underused"], strict=True):
        assert (tr["data-gpu"], tr["data-gi"]) == (s["gpu"]["uuid"], str(s["gpu_instance_id"]))
        cells = [td.get_text(strip=True) for td in tr.select("td")]
        money = [usd(s["cost_usd"]), usd(s["no_process_cost_usd"])] if s["sized"] else [DASH, DASH]
        assert cells[3:] == [
            s["reason"],
            pct(s["avg_util_pct"]),
            pct(s["no_process_pct"]),
            *money,
            usd_rate(s["usd_per_hour"]) + (s["gpu"]["instance"]["price_kind"] if s["usd_per_hour"] is not None else ""),
        ]
    rows = doc.select("#unpartitioned tbody tr")
    assert len(rows) == len(data["free"])
    for tr, f in zip(rows, data["free"], strict=True):
        cells = [td.get_text(strip=True) for td in tr.select("td")]
        assert tr["data-gpu"] == f["gpu"]["uuid"]
        rate = usd_rate(f["usd_per_hour"]) + (f["gpu"]["instance"]["price_kind"] or "")
        assert cells[1:] == [str(f["free_slices"]), rate, usd(f["window_cost_usd"])]


def test_json_has_the_figures_of_the_page(client: TestClient, fleet: None) -> None:
    data = get_json(client, "/mig")
    assert data["mig_gpus"] == 1 and data["no_agents"] is False and data["pager"]["total"] == 1
    [g] = data["gpus"]
    assert g["gpu"]["uuid"] == "GPU-mig" and g["free_slices"] == 2 and not g["free_unknown"]
    assert [(s["start"], s["size"], s["label"]) for s in g["slots"]] == [
        (0, 3, "3g.20gb"),
        (3, 2, "2g.10gb"),
        (5, 2, "2 free"),
    ]
    assert g["slots"][2]["state"] == "unpartitioned"
    assert [(s["profile"], s["compute_slices"]) for s in g["slices"]] == [("3g.20gb", 3), ("2g.10gb", 2)]
    assert data["underused_count"] == 2
    reasons = {s["profile"]: s["reason"] for s in data["underused"]}
    assert reasons["3g.20gb"] == "no process all window" and reasons["2g.10gb"].startswith("average utilization")
    [free] = data["free"]
    # Two free compute slices of a p4d GPU: 2/7 of its price per GPU-hour.
    assert free["usd_per_hour"] == pytest.approx(g["gpu"]["instance"]["usd_per_gpu_hour"] * 2 / 7)
    assert data["free_usd_per_hour"] == pytest.approx(free["usd_per_hour"])
    assert data["unpartitioned_cost_usd"] > 0 and free["window_cost_usd"] == pytest.approx(
        data["unpartitioned_cost_usd"]
    )
    assert data["thresholds"]["underused_util_pct"] > 0
    assert_same_figures(get_html(client, "/mig"), data)


def test_htmx_fragment_has_the_same_figures(client: TestClient, fleet: None) -> None:
    data = get_json(client, "/mig")
    r = client.get("/mig", headers={"HX-Request": "true"})
    assert r.status_code == 200
    assert "<html" not in r.text and "<nav" not in r.text
    assert_same_figures(BeautifulSoup(r.text, "html.parser"), data)


def test_unknown_sizes_are_unknown_in_json_and_html(client: TestClient, gaps: None) -> None:
    data = get_json(client, "/mig")
    one, two = data["gpus"]
    assert one["free_unknown"] and one["free_slices"] is None and one["free_usd_per_hour"] is None
    assert [(s["label"], s["state"]) for s in one["slots"]][1] == ("?", "unknown")
    assert not any(s["state"] == "unpartitioned" for s in one["slots"] + two["slots"])
    assert two["free_unknown"] and two["title"] == "MIG layout, free capacity unknown"
    assert data["free"] == [] and data["free_count"] == 0 and data["free_unknown_count"] == 2
    [unsized] = [s for s in data["underused"] if not s["sized"]]
    assert unsized["cost_usd"] is None and unsized["usd_per_hour"] is None
    assert data["totals"]["capacity_unknown"] is True
    doc = get_html(client, "/mig")
    assert_same_figures(doc, data)
    assert doc.select_one("[data-figure=free-unknown]").get_text(strip=True) == "2"
    assert doc.select_one(".note.unsized") is not None


@pytest.mark.parametrize(("query", "param"), [("page=two", "page"), ("dir=sideways", "dir"), ("window=2w", "window")])
def test_bad_parameter_is_400_naming_it(client: TestClient, engine: Any, query: str, param: str) -> None:
    assert_bad_parameter(client, f"/mig?{query}", param)


def test_json_without_agents_says_so(client: TestClient, engine: Any) -> None:
    data = get_json(client, "/mig")
    assert data["no_agents"] is True and data["gpus"] == [] and data["mig_gpus"] == 0


def test_slices_name_who_holds_them(client: TestClient, fleet: None) -> None:
    data = get_json(client, "/mig?window=24h")
    [layout] = data["gpus"]
    holders = {s["gpu_instance_id"]: s["holders"] for s in layout["slices"]}
    assert holders[1] == [] and [h["pod"] for h in holders[2]] == ["vllm-0"]
    [row] = [r for r in data["underused"] if r["gpu_instance_id"] == 2]
    [holder] = row["holders"]
    assert (holder["namespace"], holder["container"], holder["used_mib"]) == ("inference", "c0ffeec0ffee", 9000)
    line = get_html(client, "/mig?window=24h").select_one('#underused tr[data-gi="2"] .holder')
    assert line is not None and line.get_text(" ", strip=True).startswith("root · vllm · inference/vllm-0 · 8.8 GiB")


def test_rates_are_at_the_price_now(client: TestClient, sessions: sessionmaker[Session], fleet: None) -> None:
    hour = floor_hour(datetime.now(UTC))
    bill(sessions, "i-mig", [hour - timedelta(hours=h) for h in range(4)], 56.0)  # $7 per GPU-hour
    data = get_json(client, "/mig")
    [free] = data["free"]
    assert free["usd_per_hour"] == pytest.approx(7.0 * 2 / 7) and free["gpu"]["instance"]["price_kind"] == "billed"
    assert data["free_usd_per_hour"] == pytest.approx(2.0)
    rates = {s["profile"]: s["usd_per_hour"] for s in data["underused"]}
    assert rates == pytest.approx({"3g.20gb": 3.0, "2g.10gb": 2.0})
    assert_same_figures(get_html(client, "/mig"), data)
