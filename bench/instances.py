"""Realistic per-instance batches: what one agent at its default settings sends.

Each simulated instance has 8 GPUs. A third have none in MIG mode, a third have 2 MIG GPUs, a third 4, each
MIG GPU split into a 3g.20gb, a 2g.10gb and two 1g.5gb slices (A100 40 GB). A batch carries the agent's
default number of intervals (agent/config.py), gzipped, under a fresh batch id.
"""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

from agent.config import AgentConfig
from bench.batches import FUTURE_MARGIN_S, AgentSpec, SliceLayout, gpu_inventory

GPUS = 8
MIG_GPUS_BY_KIND = (0, 2, 4)
SLICES: tuple[SliceLayout, ...] = (
    ("3g.20gb", 3, 19968, 1),
    ("2g.10gb", 2, 9856, 5),
    ("1g.5gb", 1, 4864, 13),
    ("1g.5gb", 1, 4864, 14),
)
"""profile, compute slices, memory MiB, GPU instance id: one A100 40 GB split as agents report it."""

AGENT_INTERVAL_S = AgentConfig().interval_s
AGENT_BATCH_INTERVALS = AgentConfig().batch_intervals
BATCH_PERIOD_S = AGENT_INTERVAL_S * AGENT_BATCH_INTERVALS
"""Seconds between two batches of one agent at its defaults: a server storing `b` batches/s keeps up with
`b * BATCH_PERIOD_S` instances."""


def realistic_spec(index: int, seed: int, now: float, intervals: int = AGENT_BATCH_INTERVALS) -> AgentSpec:
    """Instance `index` of a mixed fleet; its first interval a day back, so it has room to send before it
    reaches the server's clock."""
    rng = random.Random(seed * 7919 + index)
    start = math.floor((now - 86400.0) / AGENT_INTERVAL_S) * AGENT_INTERVAL_S + rng.uniform(0.0, AGENT_INTERVAL_S)
    batch_s = intervals * AGENT_INTERVAL_S
    limit = max(0, math.floor((now + FUTURE_MARGIN_S - start - (intervals - 1) * AGENT_INTERVAL_S) / batch_s) + 1)

    def uid(prefix: str) -> str:
        return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128), version=4)}"

    mig_count = MIG_GPUS_BY_KIND[index % len(MIG_GPUS_BY_KIND)]
    plain = tuple(uid("GPU") for _ in range(GPUS - mig_count))
    mig = tuple((uid("GPU"), tuple(uid("MIG") for _ in SLICES)) for _ in range(mig_count))
    gpus = gpu_inventory(plain, mig, SLICES)
    static: dict[str, Any] = {
        "agent": {"version": "0.2.0", "interval_s": AGENT_INTERVAL_S, "dropped_batches": 0},
        "instance": {
            "instance_id": f"i-0{rng.getrandbits(64):016x}",
            "hostname": f"ip-10-1-{index // 250}-{index % 250 + 2}.ec2.internal",
            "instance_type": "p4d.24xlarge",
            "region": "us-east-1",
            "availability_zone": f"us-east-1{'abcd'[index % 4]}",
            "lifecycle": "spot" if index % 3 == 0 else "on-demand",
            "ami_id": "ami-0123456789abcdef0",
            "tags": {"Name": f"load-{index}", "team": f"team-{index % 7}"},
        },
        "gpus": gpus,
    }
    return AgentSpec(index, seed, start, intervals, limit, static, plain, mig)
