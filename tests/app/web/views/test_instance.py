"""The instance page: all its GPUs and slices on one chart per metric with hover text, a state strip per device,
and the same figures as JSON."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

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
    # Not the last span's state: in the first minutes of an hour, that hour is mostly without data yet.
    assert "idle" in {span["state"] for s in view["strips"] if s["key"] == "gpu-1" for span in s["spans"]}
    assert [g["index"] for g in view["gpus"]] == [0, 1, 2]
    assert view["gpus"][2]["slices"][0]["now"]["state"] == "idle-held"
    assert view["figures"]["gpu_hours"] > 0


def test_unknown_instance(client: TestClient, node: None) -> None:
    assert get_json(client, "/instances/i-nothere", status=404)["error"] == "no such instance"
    assert "No such instance" in get_html(client, "/instances/i-nothere", status=404).get_text()


def test_holders_of_each_device_over_the_window(client: TestClient, feeder: Feeder) -> None:
    """A notebook held a slice idle for two hours, and a training job kept GPU 0 busy for the last hour."""
    notebook = {"id": 0, "pid": 31337, "executable": "python3", "uid": 1003, "user": "asmith"}
    job = {"id": 1, "pid": 5120, "executable": "<torchrun>", "uid": 1002, "user": "mchen", "job_id": "48213"}
    start = recent_start(2)

    def gpu0(uid: str, t: datetime) -> dict[str, Any] | None:
        if t < start + timedelta(hours=1):
            return idle(uid, t)
        return {**busy(80)(uid, t), "holders": [{"ref": 1, "used_mib": 30000}]}

    def slice1(uid: str, t: datetime) -> dict[str, Any]:
        return {**held(uid, t), "holders": [{"ref": 0, "used_mib": 9000}]}

    layout = [gpu(0, uid="GPU-0"), gpu(1, uid="GPU-1", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-1")])]
    feeder.feed(
        layout,
        start=start,
        hours=2,
        step_s=60,
        fn={"GPU-0": gpu0, "GPU-1": idle, "MIG-1": slice1},
        holders=[notebook, job],
        instance_id="i-held",
    )
    view = get_json(client, "/instances/i-held?window=6h")
    by_gpu = {g["index"]: g["holders"] for g in view["gpus"]}
    [trainer] = by_gpu[0]
    assert (trainer["user"], trainer["job_id"], trainer["device_key"]) == ("mchen", "48213", "gpu-0")
    assert trainer["gpu_hours"] == pytest.approx(1.0, abs=0.02) and trainer["idle_held_h"] == 0.0
    assert trainer["avg_util_pct"] == pytest.approx(80.0) and trainer["avg_mem_mib"] == pytest.approx(30000)
    [nb] = by_gpu[1]
    assert (nb["user"], nb["device_key"], nb["device_label"]) == ("asmith", "gpu-1-gi1", "GPU 1 3g.20gb GI 1")
    # Two hours of a 3g slice: 3/7 of a GPU-hour per hour, all of it idle.
    assert nb["gpu_hours"] == pytest.approx(2 * 3 / 7, abs=0.02)
    assert nb["idle_held_h"] == pytest.approx(nb["gpu_hours"]) and nb["idle_held_usd"] > 0

    doc = get_html(client, "/instances/i-held?window=6h")
    rows = doc.select("section#gpu-1 table.holders tbody tr")
    assert [r["data-device"] for r in rows] == ["gpu-1-gi1"]
    assert "asmith" in rows[0].get_text(" ", strip=True)
    cell = doc.select_one("section#gpu-0 table.holders tbody tr").get_text(" ", strip=True)
    assert "<torchrun>" in cell and "job 48213" in cell  # text, not markup
    assert "<torchrun>" not in client.get("/instances/i-held?window=6h").text
