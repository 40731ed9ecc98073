"""Feeding constructed fleets through the real ingest route: one sample per device per step, values from a
function of (device uuid, interval start), so every expected figure can be worked out by hand."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.factories import batch, gpu

P4D_PER_GPU_HOUR = 21.957642 / 8
SampleFn = Callable[[str, datetime], dict[str, Any] | None]


def idle(uid: str, _t: datetime) -> dict[str, Any]:
    return {"uuid": uid, "util": 0.0, "util_source": "nvml.samples", "mem_used_mib": 0, "procs": 0}


def held(uid: str, _t: datetime) -> dict[str, Any]:
    return {"uuid": uid, "util": 0.0, "util_source": "nvml.samples", "mem_used_mib": 30000, "procs": 1}


def busy(util: float) -> SampleFn:
    def fn(uid: str, _t: datetime) -> dict[str, Any]:
        return {"uuid": uid, "util": util, "util_source": "nvml.samples", "mem_used_mib": 20000, "procs": 1}

    return fn


def unknown(uid: str, _t: datetime) -> dict[str, Any]:
    return {"uuid": uid, "util": None, "util_source": "none", "mem_used_mib": 0, "procs": 0}


@dataclass
class Feeder:
    client: TestClient
    token: str
    t0: datetime

    def feed(
        self,
        gpus: list[dict[str, Any]],
        *,
        start: datetime,
        hours: float,
        step_s: float = 60.0,
        fn: SampleFn | dict[str, SampleFn] = idle,
        holders: list[dict[str, Any]] | None = None,
        **instance: Any,
    ) -> None:
        """Post one sample per device every `step_s` over [start, start + hours); `fn` may be per device uuid.
        A function returning None leaves that device out of that interval. `holders` is every batch's holders
        table (docs/ingest-protocol.md, "Holders"), which samples may refer to."""
        devices = [g["uuid"] for g in gpus] + [s["uuid"] for g in gpus for s in g["slices"]]
        n = round(hours * 3600 / step_s)
        done = 0
        while done < n:
            count = min(120, n - done)
            b = batch(
                gpus, start=start + timedelta(seconds=step_s * done), intervals=count, duration_s=step_s, **instance
            )
            for iv in b["intervals"]:
                t = datetime.fromisoformat(iv["start"])
                samples = []
                for d in devices:
                    f = fn[d] if isinstance(fn, dict) else fn
                    s = f(d, t)
                    if s is not None:
                        samples.append(s)
                iv["samples"] = samples
            b["intervals"] = [iv for iv in b["intervals"] if iv["samples"]]
            if holders:
                b["holders"] = holders
            if b["intervals"]:
                r = self.client.post(
                    "/api/v1/ingest",
                    content=json.dumps(b).encode(),
                    headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
                )
                assert r.status_code == 200, r.text
            done += count


_H = timedelta(hours=1)
G5_PER_GPU_HOUR = 1.006
ANA = {"id": 0, "pid": 4242, "executable": "python3", "uid": 1000, "user": "ana"}
BOB = {
    "id": 1,
    "pid": 977,
    "executable": "vllm",
    "uid": 0,
    "user": "root",
    "container_id": "c0ffee" * 10 + "abcd",
    "pod_uid": "8f2b6c1e-0d6a-4b8e-9a53-3c1f0e7d2a11",
    "namespace": "inference",
    "pod": "vllm-0",
}
MCHEN = {"id": 0, "pid": 5120, "executable": "python", "uid": 1002, "user": "mchen", "job_id": "48213"}


def _p4d_sample(uid: str, t: datetime, start: datetime) -> dict[str, Any]:
    """GPU-0: its first hour held idle by ana's notebook, its second at 60% shared by ana and bob's pod."""
    if t < start + _H:
        return {**held(uid, t), "holders": [{"ref": 0, "used_mib": 30000}]}
    refs = [{"ref": 0, "used_mib": 2000}, {"ref": 1, "used_mib": 18000}]
    return {**busy(60)(uid, t), "procs": 2, "holders": refs}


def holders_story(feeder: Feeder) -> dict[str, datetime]:
    """Two whole hours: a p4d whose GPU 0 ana and bob hold and whose GPU 1 nobody holds (idle), and a g5 that
    mchen's Slurm job keeps at 40%."""
    start = feeder.t0
    feeder.feed(
        [gpu(0, uid="GPU-0"), gpu(1, uid="GPU-1")],
        start=start,
        hours=2,
        fn={"GPU-0": lambda u, t: _p4d_sample(u, t, start), "GPU-1": idle},
        holders=[ANA, BOB],
        instance_id="i-p4d",
    )

    def job(uid: str, t: datetime) -> dict[str, Any]:
        return {**busy(40)(uid, t), "holders": [{"ref": 0, "used_mib": 20000}]}

    feeder.feed(
        [gpu(0, uid="GPU-g5", name="NVIDIA A10G")],
        start=start,
        hours=2,
        fn=job,
        holders=[MCHEN],
        instance_id="i-g5",
        instance_type="g5.xlarge",
    )
    return {"start": start, "end": start + 2 * _H}
