"""The instance page: all its GPUs and slices on one chart per metric with hover text, a state strip per device,
and the same figures as JSON."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.app.web.views.pages import fragment, get_html, get_json, recent_start
from tests.factories import gpu, mig_slice
from tests.feeding import Feeder, busy, held, idle


@pytest.fixture
def node(feeder: Feeder) -> None:
    """A p4d with a busy GPU, an idle GPU and a MIG GPU whose one slice is held, for three hours."""
    feeder.feed(
        [
            gpu(0, uid="GPU-0"),
            gpu(1, uid="GPU-1"),
            gpu(2, uid="GPU-2", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-1")], unpartitioned=4),
        ],
        start=recent_start(3),
        hours=3,
        step_s=60,
        fn={"GPU-0": busy(60), "GPU-1": idle, "GPU-2": idle, "MIG-1": held},
        instance_id="i-node",
    )


def test_one_chart_per_metric_for_every_device(client: TestClient, node: None) -> None:
    doc = get_html(client, "/instances/i-node?window=6h")
    charts = doc.select("section#charts svg")
    assert len(charts) == 4  # the state strip, then utilization, memory and power
    util = charts[1]
    assert len(util.select("polyline, path.line, .line")) >= 4  # GPU 0, 1, 2 and the slice
    legend = util.get_text(" ", strip=True)
    for name in ("GPU 0", "GPU 1", "GPU 2", "GPU 2 3g.20gb GI 1"):
        assert name in legend
    # Hover: each time step lists every device's value at that time.
    hover = [t.get_text() for t in util.select(".hover title")]
    assert hover and any("GPU 0: 60.0" in t and "UTC" in t for t in hover)
    power = charts[3].get_text(" ", strip=True)
    assert "3g.20gb" not in power  # slices have no power
    strip = [t.get_text() for t in charts[0].select("title")]
    assert any(t.startswith("GPU 1 · idle") for t in strip)
    assert any(t.startswith("GPU 0 · active") for t in strip)
    assert any(t.startswith("GPU 2 3g.20gb GI 1 · idle-held") or "idle, held" in t for t in strip)
    assert len(fragment(client, "/instances/i-node?window=6h").select("section#charts svg")) == 4


def test_instance_json(client: TestClient, node: None) -> None:
    view = get_json(client, "/instances/i-node?window=6h")
    assert view["instance"]["ref"]["instance_id"] == "i-node" and not view["missing"]
    assert [d["key"] for d in view["series"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-2-gi1"]
    gpu0 = view["series"][0]["points"]
    assert len(gpu0["ts"]) == len(gpu0["util"]) == len(gpu0["mem_used_mib"]) == len(gpu0["power_w"]) > 0
    assert all(u == pytest.approx(60.0) for u in gpu0["util"] if u is not None)
    assert set(view["series"][3]["points"]["power_w"]) == {None}  # a slice has no power of its own
    assert {s["key"]: s["spans"][-1]["state"] for s in view["strips"]}["gpu-1"] == "idle"
    assert [g["index"] for g in view["gpus"]] == [0, 1, 2]
    assert view["gpus"][2]["slices"][0]["now"]["state"] == "idle-held"
    assert view["figures"]["gpu_hours"] > 0


def test_unknown_instance(client: TestClient, node: None) -> None:
    assert get_json(client, "/instances/i-nothere", status=404)["error"] == "no such instance"
    assert "No such instance" in get_html(client, "/instances/i-nothere", status=404).get_text()
