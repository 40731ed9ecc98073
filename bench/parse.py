"""Parse benchmark: the CPU the ingest route spends turning request bytes into a checked batch (strict schema,
then the rules across fields), without the network or the database.

    .venv/bin/python -m bench.parse [--intervals 360] [--runs 7]
    (or .venv/bin/python bench/parse.py with the same options)

The batch is a p4d-like host as the agent sends it: 4 whole A100s and 4 in MIG mode with seven 1g.5gb slices
each (36 devices), every figure present. Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

INTERVAL_S = 10.0


def _gpu(index: int, mig: bool) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "uuid": f"GPU-{uuid.uuid4()}",
        "index": index,
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_total_mib": 40960,
        "mig_mode": mig,
    }
    if mig:
        gpu["unpartitioned_slices"] = 0
        gpu["util_unavailable_reason"] = "A100 MIG: NVML gives no utilization for MIG devices or their parent GPU"
        gpu["slices"] = [
            {
                "uuid": f"MIG-{uuid.uuid4()}",
                "gpu_instance_id": 7 + k,
                "compute_instance_id": 0,
                "profile": "1g.5gb",
                "compute_slices": 1,
                "memory_total_mib": 4864,
            }
            for k in range(7)
        ]
    return gpu


def _sample(uid: str) -> dict[str, Any]:
    return {
        "uuid": uid,
        "util": 63.5,
        "util_source": "nvml.samples",
        "sm_active": 41.25,
        "mem_used_mib": 30211,
        "power_w": 287.4,
        "temp_c": 58,
        "procs": 2,
        "gr_active": 38.0,
        "sm_clock_mhz": 1410,
        "ecc_uncorrected": 0,
        "procs_mem_mib": 30000,
    }


def build(intervals: int, now: datetime) -> bytes:
    gpus = [_gpu(i, mig=i >= 4) for i in range(8)]
    devices = [g["uuid"] for g in gpus] + [s["uuid"] for g in gpus for s in g.get("slices", [])]
    start = now - timedelta(seconds=INTERVAL_S * (intervals + 1))
    body = {
        "schema_version": 1,
        "batch_id": str(uuid.uuid4()),
        "agent": {"version": "0.1.0", "interval_s": INTERVAL_S, "errors": {"nvmlDeviceGetPowerUsage:timeout": 1}},
        "instance": {
            "instance_id": "i-0a1b2c3d4e5f67890",
            "hostname": "ip-10-0-12-34.ec2.internal",
            "instance_type": "p4d.24xlarge",
            "region": "us-east-1",
            "availability_zone": "us-east-1a",
            "lifecycle": "on-demand",
            "ami_id": "ami-0123456789abcdef0",
            "tags": {"team": "research", "env": "prod"},
        },
        "gpus": gpus,
        "intervals": [
            {
                "start": (start + timedelta(seconds=INTERVAL_S * i)).isoformat().replace("+00:00", "Z"),
                "duration_s": INTERVAL_S,
                "samples": [_sample(d) for d in devices],
            }
            for i in range(intervals)
        ],
        "events": [{"ts": now.isoformat(), "kind": "agent_start", "details": {"version": "0.1.0"}}],
    }
    return json.dumps(body).encode()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", type=int, default=360, help="intervals in the batch (36 samples each)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs; the median is reported")
    args = ap.parse_args(argv)
    from app.ingest.parse import check_batch, decode_body, parse_batch

    now = datetime.now(UTC)
    raw = build(args.intervals, now)
    samples = args.intervals * 36
    times: list[float] = []
    for run in range(args.runs + 1):
        t0 = time.perf_counter()
        batch = parse_batch(decode_body(raw, None, max_bytes=len(raw)))
        check_batch(batch, now=now, max_future_skew_s=300, raw_retention_days=14)
        if run:  # the first run warms caches and is not counted
            times.append(time.perf_counter() - t0)
        print(f"run {run}: {(time.perf_counter() - t0) * 1000:.1f} ms", file=sys.stderr)
    median = statistics.median(times)
    print(
        json.dumps(
            {
                "bench": "parse",
                "bytes": len(raw),
                "samples": samples,
                "runs": args.runs,
                "median_ms": round(median * 1000, 2),
                "min_ms": round(min(times) * 1000, 2),
                "us_per_sample": round(median / samples * 1e6, 3),
                "mb_per_s": round(len(raw) / median / 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
