"""Feeding constructed fleets through the real ingest route: one sample per device per step, values from a
function of (device uuid, interval start), so every expected figure can be worked out by hand."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.factories import batch

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
