"""The dashboard's pages over HTTP, checked with HTML selectors, on stories posted through the ingest route."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

from app.web.templating import DASH
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, held, idle, unknown

H = timedelta(hours=1)
PAGES = ["/", "/gpus/idle", "/mig", "/waste", "/instances"]


def page(client: TestClient, url: str, status: int = 200, **headers: str) -> BeautifulSoup:
    r = client.get(url, headers=headers)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"].startswith("text/html")
    return BeautifulSoup(r.text, "html.parser")


def recent_start(hours: float) -> datetime:
    """A start such that `hours` of one-minute intervals end just before now."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return now - timedelta(hours=hours)


@pytest.fixture
def story(feeder: Feeder) -> dict[str, Any]:
    """A forgotten g5 idle for three hours, a busy p4d, an A100 MIG node with one unknown slice and free
    capacity, and a team tag on each."""
    start = recent_start(3)
    forgotten = gpu(0, uid="GPU-forgotten", name="NVIDIA A10G")
    feeder.feed(
        [forgotten],
        start=start,
        hours=3,
        fn=idle,
        instance_id="i-forgotten",
        instance_type="g5.xlarge",
        tags={"team": "vision", "Name": "forgotten-box"},
    )
    feeder.feed([gpu(0, uid="GPU-busy")], start=start, hours=3, fn=busy(85), instance_id="i-busy", tags={"team": "nlp"})
    node = gpu(
        0,
        uid="GPU-mig",
        mig=True,
        slices=[mig_slice(1, "3g.20gb", uid="MIG-a"), mig_slice(2, "2g.10gb", uid="MIG-b")],
        unpartitioned=2,
    )
    feeder.feed(
        [node],
        start=start,
        hours=3,
        fn={"GPU-mig": unknown, "MIG-a": unknown, "MIG-b": held},
        instance_id="i-mig",
        tags={"team": "nlp"},
    )
    return {"start": start}


@pytest.mark.parametrize("url", PAGES)
def test_pages_say_what_to_do_without_agents(client: TestClient, engine: Any, url: str) -> None:
    doc = page(client, url)
    empty = doc.select_one(".empty-state")
    assert empty is not None
    assert "gpufleet-agent install" in empty.get_text()


@pytest.mark.parametrize("url", [*PAGES, "/instances/i-forgotten", "/waste?group_by=tag:team"])
def test_every_page_renders_the_story(client: TestClient, story: dict[str, Any], url: str) -> None:
    doc = page(client, url)
    assert doc.select_one("nav a[aria-current=page]") is not None
    assert doc.select_one("#live") is not None


def test_overview_counts_and_dollars(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/?window=24h")
    assert doc.select_one("[data-figure=instances]").get_text(strip=True) == "3"
    assert doc.select_one("[data-figure=gpus]").get_text(strip=True) == "3"
    assert doc.select_one("[data-figure=idle-now]").get_text(strip=True) == "1"
    assert doc.select_one("svg.state-bar, svg[class*=state]") is not None
    assert "forgotten-box" in doc.select_one("#live").get_text()


def test_idle_list_prices_the_forgotten_gpu(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/gpus/idle")
    rows = doc.select("#idle-gpus tbody tr")
    assert [r["data-gpu"] for r in rows] == ["GPU-forgotten"]
    text = rows[0].get_text(" ", strip=True)
    assert "forgotten-box" in text and "g5.xlarge" in text
    # 3 hours of a g5.xlarge (1 GPU) at its list price.
    assert doc.select_one("[data-figure=burned]") is not None


def test_mig_page_shows_layout_unknown_and_free_capacity(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/mig")
    assert doc.select_one("[data-figure=mig-gpus]").get_text(strip=True) == "1"
    figure = doc.select_one("figure.mig-gpu[data-gpu=GPU-mig]")
    assert figure is not None and figure.select_one("svg") is not None
    svg_text = figure.get_text(" ")
    assert "3g.20gb" in svg_text and "2 free" in svg_text
    underused = doc.select("#underused tbody tr")
    assert len(underused) == 2  # both slices: no process (3g) and idle-held at 0% (2g)
    assert [r.select("td")[1].get_text(" ", strip=True).split()[0] for r in doc.select("#unpartitioned tbody tr")]


def test_waste_groups_and_totals(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/waste?group_by=tag:team&window=24h")
    labels = [r.select_one("td").get_text(strip=True) for r in doc.select("#waste-table tbody tr")]
    assert set(labels) == {"vision", "nlp"}
    assert doc.select_one("[data-figure=total-waste]").get_text(strip=True).startswith("$")
    select = doc.select_one("select[name=group_by] option[selected]")
    assert select is not None and select["value"] == "tag:team"


def test_sorting_follows_the_query_string(client: TestClient, story: dict[str, Any]) -> None:
    asc = page(client, "/instances?sort=name&dir=asc")
    names = [r["data-instance"] for r in asc.select("#instances tbody tr")]
    # By display name: the Name tag where there is one, else the instance id.
    assert names == ["i-forgotten", "i-busy", "i-mig"]
    desc = page(client, "/instances?sort=name&dir=desc")
    assert [r["data-instance"] for r in desc.select("#instances tbody tr")] == list(reversed(names))
    th = desc.select_one("th[aria-sort]")
    assert th is not None and th["aria-sort"] == "descending"


def test_filters_live_in_the_query_string(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/instances?tag=team:nlp&window=6h")
    assert {r["data-instance"] for r in doc.select("#instances tbody tr")} == {"i-busy", "i-mig"}
    form = doc.select_one("form.filter-bar")
    assert form is not None
    assert form.select_one("select[name=window] option[selected]")["value"] == "6h"
    assert form.select_one("input[name=tag][value='team:nlp']") is not None


def test_htmx_request_gets_the_live_block_only(client: TestClient, story: dict[str, Any]) -> None:
    r = client.get("/", headers={"HX-Request": "true"})
    assert r.status_code == 200
    assert "<html" not in r.text and "<nav" not in r.text
    assert 'data-figure="waste"' in r.text
    full = page(client, "/")
    live = full.select_one("#live")
    assert live["hx-get"] and live["hx-trigger"] == "every 30s"


def test_instance_page_charts_and_sources(client: TestClient, story: dict[str, Any]) -> None:
    doc = page(client, "/instances/i-mig?window=6h")
    assert "i-mig" in doc.select_one("h1").get_text(" ", strip=True)
    # One strip of states and one chart per metric for the whole instance, not one set per GPU.
    assert len(doc.select("section#charts svg")) == 4
    assert not doc.select("section.gpu svg")
    text = doc.select_one("section.gpu").get_text(" ", strip=True)
    assert "A100 MIG" in text  # the reason utilization is absent
    assert "none" in text  # the source of the slices' utilization


def test_unknown_instance_is_404_page(client: TestClient, engine: Any) -> None:
    doc = page(client, "/instances/i-nothere", status=404)
    assert "No such instance" in doc.get_text()


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/?window=2w", "window"),
        ("/waste?group_by=color", "group_by"),
        ("/instances?lifecycle=reserved", "lifecycle"),
        ("/?start=yesterday", "start"),
        ("/gpus/idle?dir=sideways", "dir"),
        ("/instances?page=0", "page"),
        ("/mig?page=two", "page"),
    ],
)
def test_bad_query_is_400_naming_the_parameter(client: TestClient, engine: Any, url: str, param: str) -> None:
    doc = page(client, url, status=400)
    assert doc.select_one(".error")["data-param"] == param


def test_agent_values_are_escaped(client: TestClient, feeder: Feeder) -> None:
    evil = '<script>alert("x")</script><b>bold</b>'
    feeder.feed(
        [gpu(0)],
        start=recent_start(2),
        hours=2,
        fn=idle,
        instance_id="i-evil",
        tags={"team": evil, "Name": evil},
        hostname=evil,
    )
    for url in [*PAGES, "/instances/i-evil", "/waste?group_by=tag:team", "/waste?group_by=instance"]:
        r = client.get(url)
        assert r.status_code == 200
        assert "<script>alert" not in r.text, url
        assert "<b>bold</b>" not in r.text, url
        doc = BeautifulSoup(r.text, "html.parser")
        assert not doc.select("b"), url
        if url in ("/", "/instances", "/instances/i-evil", "/gpus/idle"):
            assert evil in doc.get_text(), url


def test_price_file_problem_is_visible(client: TestClient, feeder: Feeder) -> None:
    feeder.feed(
        [gpu(0)], start=recent_start(2), hours=2, fn=idle, instance_id="i-capacity-block", instance_type="p5e.48xlarge"
    )
    doc = page(client, "/waste?group_by=instance")
    assert "no price" in doc.select_one("#waste-table").get_text()
    assert doc.select_one(".unpriced") is not None
    assert P4D_PER_GPU_HOUR > 0


def test_paginate_clamps_to_the_last_page() -> None:
    from app.web.views.common import paginate

    rows = list(range(250))
    first, pager = paginate(rows, 1)
    assert first == list(range(100)) and (pager.pages, pager.total) == (3, 250)
    last, pager = paginate(rows, 9)
    assert last == list(range(200, 250)) and pager.page == 3 and (pager.first, pager.last) == (200, 250)
    assert paginate([], 1)[1].pages == 1


REFUSED = [
    {"figure": "mem_used_mib", "call": "nvmlDeviceGetMemoryInfo", "grant": "mig-monitor"},
    {"figure": "procs", "call": "nvmlDeviceGetComputeRunningProcesses_v3", "grant": "mig-monitor"},
    {"figure": "gr_active", "call": "nvmlGpmSampleGet", "grant": "cap-sys-admin"},
    {"figure": "fan_speed", "call": "nvmlDeviceGetFanSpeed_v2", "grant": "root-of-all"},
]


@pytest.fixture
def gaps(feeder: Feeder) -> dict[str, Any]:
    """A p4d whose agent lacks privileges: GPU 0 passthrough and fine; GPU 1 in MIG mode with a 3g slice, a
    slice of unknown size and 2 compute slices it calls free, and figures NVML refused; GPU 2 in MIG mode with
    an incomplete layout. Beside it, a plain p4d."""
    start = recent_start(3)
    one = gpu(
        1,
        uid="GPU-gaps-1",
        mig=True,
        slices=[mig_slice(1, "3g.20gb", uid="MIG-sized"), unsized_slice(2, uid="MIG-unsized")],
        unpartitioned=2,
    )
    one["permission_denied"] = REFUSED
    two = gpu(2, uid="GPU-gaps-2", mig=True, slices=[mig_slice(1, "4g.20gb", uid="MIG-four")], unpartitioned=3)
    two["layout_complete"] = False
    feeder.feed([gpu(0, uid="GPU-gaps-0"), one, two], start=start, hours=3, fn=idle, instance_id="i-gaps")
    feeder.feed([gpu(0, uid="GPU-fine")], start=start, hours=3, fn=busy(70), instance_id="i-fine")
    return {"start": start}


def test_instance_page_says_what_the_agent_could_not_read(client: TestClient, gaps: dict[str, Any]) -> None:
    doc = page(client, "/instances/i-gaps")
    assert doc.select_one("#gpu-0 .note.permission") is None
    note = doc.select_one("#gpu-1 .note.permission")
    assert note is not None
    text = note.get_text(" ", strip=True)
    assert "docs/agent.md, Privileges" in text and "NO_PERMISSION" in text
    items = [li.get_text(" ", strip=True) for li in note.select("li")]
    assert len(items) == 3  # one per grant: the two MIG-monitor figures share theirs
    assert "memory used of the whole GPU ( nvmlDeviceGetMemoryInfo )" in items[0]
    assert "compute processes of the whole GPU" in items[0]
    assert "/dev/nvidia-caps/nvidia-cap2" in items[0] and "nvidia-modprobe -f" in items[0]
    assert "graphics-engine activity" in items[1] and "CAP_SYS_ADMIN" in items[1]
    assert "NVreg_RestrictProfilingToAdminUsers=0" in items[1]
    # Keys this server does not know are shown as sent.
    assert [c.get_text() for c in note.select("li")[2].select("code")] == [
        "fan_speed",
        "nvmlDeviceGetFanSpeed_v2",
        "root-of-all",
    ]


def test_instance_page_shows_unknown_layouts_and_sizes(client: TestClient, gaps: dict[str, Any]) -> None:
    doc = page(client, "/instances/i-gaps")
    assert doc.select_one("#gpu-0 .note.layout-unknown") is None
    for section in ("#gpu-1", "#gpu-2"):
        assert doc.select_one(f"{section} [data-layout=incomplete]") is not None, section
        assert "free capacity unknown" in doc.select_one(f"{section} h2").get_text(" ", strip=True)
    rows = [r.get_text(" ", strip=True) for r in doc.select("#gpu-1 tr.slice")]
    assert rows[0].startswith("3g.20gb") and "size unknown" not in rows[0]
    assert rows[1].startswith("unknown profile") and "size unknown" in rows[1]
    assert doc.select_one(".note.unsized") is not None
    fine = page(client, "/instances/i-fine")
    assert not fine.select(".note.permission, .note.layout-unknown, .note.unsized")


def test_mig_page_draws_unknown_sizes_and_no_free_capacity_for_them(client: TestClient, gaps: dict[str, Any]) -> None:
    doc = page(client, "/mig")
    one = doc.select_one("figure.mig-gpu[data-gpu=GPU-gaps-1]")
    assert "free capacity unknown" in one.select_one("figcaption").get_text(" ", strip=True)
    blocks = [(g["class"], g.select_one("title").get_text()) for g in one.select("svg g.slot")]
    assert [c for c, _t in blocks] == [["slot", "state-idle"], ["slot", "state-unknown"]]
    assert "size unknown" in blocks[1][1] and one.select_one("svg g.slot.state-unknown text").get_text() == "?"
    assert not one.select("g.state-unpartitioned") and "2 free" not in one.select_one("svg").get_text(" ")
    two = doc.select_one("figure.mig-gpu[data-gpu=GPU-gaps-2]")
    assert not two.select("g.state-unpartitioned") and "3 free" not in two.select_one("svg").get_text(" ")
    assert "free capacity unknown" in two.select_one("svg")["aria-label"]
    # Neither GPU is listed as having free capacity, nor priced as such.
    assert doc.select_one("#unpartitioned") is None
    assert "Not listed: 2 GPUs whose free capacity is unknown" in " ".join(doc.get_text().split())
    assert doc.select_one("[data-figure=free-rate]").get_text(strip=True) == "$0.000/h"
    assert doc.select_one("[data-figure=free-unknown]").get_text(strip=True) == "2"
    # The unsized slice had no process: under-used, but its cost is unknown, not $0.
    [row] = [r for r in doc.select("#underused tbody tr") if "unknown profile" in r.get_text()]
    cells = [td.get_text(strip=True) for td in row.select("td")]
    assert cells[-3:] == [DASH, DASH, DASH]
    assert doc.select_one(".note.unsized") is not None


def test_waste_and_overview_leave_unknown_sizes_out_of_the_dollars(client: TestClient, gaps: dict[str, Any]) -> None:
    doc = page(client, "/waste?group_by=slice&window=24h")
    rows = {r.select_one("td").get_text(strip=True): r for r in doc.select("#waste-table tbody tr")}
    unsized = next(r for label, r in rows.items() if "unknown profile" in label)
    cells = [td.get_text(strip=True) for td in unsized.select("td")]
    assert cells[1] == cells[5] == cells[9] == DASH
    free = next(r for label, r in rows.items() if label.endswith("GPU 1 unpartitioned"))
    assert "size-unknown" in free["class"]
    assert doc.select_one(".note.unsized") is not None
    overview = page(client, "/?window=24h")
    assert overview.select_one(".note.unsized") is not None


def test_instance_list_marks_missing_privileges(client: TestClient, gaps: dict[str, Any]) -> None:
    doc = page(client, "/instances")
    marked = {r["data-instance"] for r in doc.select("#instances tbody tr") if r.select_one(".privileges")}
    assert marked == {"i-gaps"}
