"""Builders for ingest batches (plain dicts, as an agent would send them)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any


def now_floor(seconds: int = 10) -> datetime:
    t = datetime.now(UTC).replace(microsecond=0)
    return t - timedelta(seconds=t.second % seconds)


def gpu(
    index: int,
    *,
    uid: str | None = None,
    mig: bool = False,
    slices: list[dict[str, Any]] | None = None,
    name: str = "NVIDIA A100-SXM4-40GB",
    unpartitioned: int | None = None,
) -> dict[str, Any]:
    return {
        "uuid": uid or f"GPU-{uuid.uuid4()}",
        "index": index,
        "name": name,
        "memory_total_mib": 40960,
        "mig_mode": mig,
        "unpartitioned_slices": unpartitioned,
        "util_unavailable_reason": "not supported in MIG mode" if mig else None,
        "slices": slices or [],
    }


def mig_slice(gi: int, profile: str = "3g.20gb", *, uid: str | None = None, ci: int = 0) -> dict[str, Any]:
    return {
        "uuid": uid or f"MIG-{uuid.uuid4()}",
        "gpu_instance_id": gi,
        "compute_instance_id": ci,
        "profile": profile,
        "compute_slices": int(profile.split("g.")[0]),
        "memory_total_mib": 19968,
        "util_unavailable_reason": "A100 MIG: NVML gives no per-slice utilization",
    }


def unsized_slice(gi: int, *, uid: str | None = None, ci: int = 0) -> dict[str, Any]:
    """A MIG device whose size the agent could not read: profile "unknown", compute_slices null."""
    return dict(mig_slice(gi, uid=uid, ci=ci), profile="unknown", compute_slices=None, memory_total_mib=None)


def sample(uid: str, util: float | None = 50.0, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": uid,
        "util": util,
        "util_source": "nvml.samples" if util is not None else "none",
        "mem_used_mib": 1024,
        "power_w": 250.4,
        "temp_c": 51,
        "procs": 1,
    }
    out.update(extra)
    return out


def batch(
    gpus: list[dict[str, Any]],
    *,
    start: datetime | None = None,
    intervals: int = 3,
    duration_s: float = 10.0,
    instance_id: str = "i-0123456789abcdef0",
    sample_fn: Any = None,
    **instance: Any,
) -> dict[str, Any]:
    """A batch with one sample per device per interval; `sample_fn(uuid, interval_index)` overrides values."""
    start = start or now_floor() - timedelta(seconds=duration_s * intervals)
    devices = [g["uuid"] for g in gpus] + [s["uuid"] for g in gpus for s in g["slices"]]
    slice_ids = {s["uuid"] for g in gpus for s in g["slices"]}
    ivs = []
    for i in range(intervals):
        samples = []
        for d in devices:
            if sample_fn is not None:
                samples.append(sample_fn(d, i))
            elif d in slice_ids:
                samples.append(sample(d, None, power_w=None, temp_c=None))
            else:
                samples.append(sample(d))
        ivs.append(
            {
                "start": (start + timedelta(seconds=duration_s * i)).isoformat(),
                "duration_s": duration_s,
                "samples": samples,
            }
        )
    inst = {
        "instance_id": instance_id,
        "hostname": "ip-10-0-0-1",
        "instance_type": "p4d.24xlarge",
        "region": "us-east-1",
        "availability_zone": "us-east-1a",
        "lifecycle": "on-demand",
        "ami_id": "ami-0abc",
        "tags": {"team": "research"},
    }
    inst.update(instance)
    return {
        "schema_version": 1,
        "batch_id": str(uuid.uuid4()),
        "agent": {"version": "0.1.0", "interval_s": duration_s},
        "instance": inst,
        "gpus": gpus,
        "intervals": ivs,
    }
