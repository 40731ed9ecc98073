"""A synthetic fleet for the dashboard and report benchmarks: inventory and samples, deterministic from a seed.

`make_fleet` lays out the instances (a mix of EC2 GPU types, regions, lifecycles and tags), their GPUs, the
MIG layouts of a quarter of the GPUs (A100 and H100 only; some reconfigured half-way through) and the
workload each device runs; `batch_dict` is an instance's inventory as its agent reports it.
`bench.fleet_samples.SampleMaker.rows` then gives the sample rows of any time range, as
`app.store.samples.write_samples` takes them. Every figure is a function of the device, the hour and the
interval's place in it, so a range can be made in any order, by any process, and made again later (to top
a loaded fleet up to the present) with the same values.

Workloads, decided per device and hour (bench/fleet_samples.py):

- training: busy 85-97 % around the clock, with an idle hour between jobs now and then;
- day-night: busy 9-19 local time on weekdays, idle otherwise;
- inference: always a process and its memory, utilization following the local time of day;
- jobs: bursty, busy in about half of the hours;
- idle: nothing running, no memory used;
- held: nothing computing, but a process holds memory (idle-held).

Every sample with processes refers to that many holders (at most 3), the processes of its device: they live for
a stretch of 3 to 24 hours, then restart with new pids. A third of the instances run Kubernetes pods, a quarter
Slurm jobs, the rest plain processes; 40 users, a few of whom run most jobs (bench/fleet_samples.py, "Holders").

Spot instances drop out for hours at a time (no samples), and a few are gone for good some days before the
end. A100 MIG slices have no utilization (util NULL, source "none"); H100 slices have it from GPM. A MIG
GPU's own row carries the board's power, temperature and the slices' memory and processes.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

SEED = 20261
HOUR = 3600
DAY = 86400
# Samples of one instance for this many intervals sit together, as one agent batch would store them.
BATCH_INTERVALS = 4
AGENT_VERSION = "0.1.0"
SHAPE = 2
"""What the fleet's data is made of; raise it when that changes (2: holders), so a fleet loaded by older code is
reloaded rather than reused (bench/fleet_db.py)."""

# Reasons the agent gives for missing utilization (agent/collect).
MIG_PARENT_REASON = "MIG mode: NVML has no whole-GPU utilization; see the slices"
AMPERE_MIG_REASON = "NVML cannot measure MIG slice utilization before Hopper (needs DCGM profiling metrics)"

# Util source codes (app.sources).
SRC_NONE = 0
SRC_SAMPLES = 1
SRC_GPM = 3


@dataclass(frozen=True)
class Family:
    """A GPU model as NVML names it, with the figures the samples are drawn from."""

    name: str
    nvml_name: str
    memory_mib: int
    idle_w: int
    max_w: int
    idle_clock: int
    busy_clock: int
    gpm: bool  # Hopper: SM and graphics activity from GPM, MIG slices with utilization
    mig: bool


FAMILIES = {
    f.name: f
    for f in (
        Family("A100", "NVIDIA A100-SXM4-40GB", 40960, 55, 400, 210, 1410, False, True),
        Family("H100", "NVIDIA H100 80GB HBM3", 81559, 70, 700, 345, 1980, True, True),
        Family("A10G", "NVIDIA A10G", 23028, 25, 300, 210, 1710, False, False),
        Family("L4", "NVIDIA L4", 23034, 16, 72, 210, 2040, False, False),
        Family("L40S", "NVIDIA L40S", 46068, 35, 350, 210, 2520, False, False),
        Family("T4", "Tesla T4", 15360, 10, 70, 300, 1590, False, False),
    )
}

# Instance type: (GPU family, GPUs), as in the EC2 catalog; and how many of each in 300 instances.
INSTANCE_TYPES: dict[str, tuple[str, int]] = {
    "p4d.24xlarge": ("A100", 8),
    "p5.48xlarge": ("H100", 8),
    "g5.xlarge": ("A10G", 1),
    "g5.12xlarge": ("A10G", 4),
    "g5.48xlarge": ("A10G", 8),
    "g6.xlarge": ("L4", 1),
    "g6.12xlarge": ("L4", 4),
    "g6e.xlarge": ("L40S", 1),
    "g6e.12xlarge": ("L40S", 4),
    "g4dn.xlarge": ("T4", 1),
    "g4dn.12xlarge": ("T4", 4),
    "g4dn.metal": ("T4", 8),
}
MIX: dict[str, int] = {
    "p4d.24xlarge": 90,
    "p5.48xlarge": 55,
    "g5.48xlarge": 55,
    "g4dn.metal": 15,
    "g5.12xlarge": 20,
    "g6.12xlarge": 20,
    "g6e.12xlarge": 20,
    "g4dn.12xlarge": 5,
    "g5.xlarge": 8,
    "g6.xlarge": 6,
    "g6e.xlarge": 6,
}
REGIONS = (("us-east-1", -5, 50), ("us-west-2", -8, 30), ("eu-west-1", 0, 20))  # name, UTC offset h, weight
TEAMS = ("ml-research", "ml-platform", "inference", "vision", "speech")

# MIG profiles per family: size (compute slices) -> (profile name, memory MiB).
MIG_PROFILES: dict[str, dict[int, tuple[str, int]]] = {
    "A100": {
        1: ("1g.5gb", 4864),
        2: ("2g.10gb", 9856),
        3: ("3g.20gb", 19968),
        4: ("4g.20gb", 19968),
        7: ("7g.40gb", 40192),
    },
    "H100": {
        1: ("1g.10gb", 9984),
        2: ("2g.20gb", 20096),
        3: ("3g.40gb", 40320),
        4: ("4g.40gb", 40320),
        7: ("7g.80gb", 80896),
    },
}
# Layouts: (GPU instance id, compute slices) per slice, and their weight. Some leave compute slices free.
LAYOUTS: dict[str, tuple[tuple[tuple[int, int], ...], int]] = {
    "7x1g": (tuple((7 + k, 1) for k in range(7)), 25),
    "3g+2g+1g+1g": (((1, 3), (5, 2), (13, 1), (14, 1)), 20),
    "4g+3g": (((1, 4), (2, 3)), 15),
    "3g+2g+1g": (((1, 3), (5, 2), (13, 1)), 15),
    "4g+2g": (((1, 4), (5, 2)), 10),
    "2g+2g+1g": (((3, 2), (4, 2), (11, 1)), 8),
    "3g+3g": (((1, 3), (2, 3)), 4),
    "7g": (((0, 7),), 3),
}

TRAINING = "training"
DAYNIGHT = "day-night"
INFERENCE = "inference"
JOBS = "jobs"
IDLE = "idle"
HELD = "held"
PATTERNS = (TRAINING, DAYNIGHT, INFERENCE, JOBS, IDLE, HELD)
SLICE_PATTERNS = ((INFERENCE, 35), (DAYNIGHT, 25), (JOBS, 10), (IDLE, 20), (HELD, 10))


@dataclass(frozen=True)
class SliceSpec:
    key: int  # stable number of the device in the fleet, mixed into every figure
    uuid: str
    gpu_instance_id: int
    compute_slices: int
    profile: str
    memory_mib: int
    pattern: str


@dataclass(frozen=True)
class GpuSpec:
    key: int
    uuid: str
    index: int
    family: Family
    pattern: str
    slices: tuple[SliceSpec, ...] = ()
    # A reconfigured MIG GPU: the layout from `reconfigured_at` on (UTC epoch s, on an hour).
    new_slices: tuple[SliceSpec, ...] = ()
    reconfigured_at: int | None = None

    @property
    def mig(self) -> bool:
        return bool(self.slices)

    def layout(self, t: int) -> tuple[SliceSpec, ...]:
        if self.reconfigured_at is not None and t >= self.reconfigured_at:
            return self.new_slices
        return self.slices


@dataclass(frozen=True)
class InstanceSpec:
    key: int
    instance_id: str
    instance_type: str
    region: str
    utc_offset_h: int
    zone: str
    lifecycle: str
    tags: dict[str, str]
    pattern: str
    gpus: tuple[GpuSpec, ...]
    gone_at: int | None = None  # spot instance terminated: no samples from here on (UTC epoch s)
    reconfigured_at: int | None = None

    @property
    def hostname(self) -> str:
        octets = (self.key // 250, self.key % 250 + 2)
        domain = "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"
        return f"ip-10-0-{octets[0]}-{octets[1]}.{domain}"


@dataclass(frozen=True)
class Fleet:
    instances_n: int
    days: int
    interval_s: int
    seed: int
    start: int  # first interval, UTC epoch s
    end: int  # end of the last interval at load time
    instances: tuple[InstanceSpec, ...]
    counts: dict[str, int] = field(default_factory=dict)

    def params(self) -> dict[str, int]:
        """What makes a fleet: equal parameters give the same fleet (`end` fixes the time range)."""
        return {
            "instances": self.instances_n,
            "days": self.days,
            "interval_s": self.interval_s,
            "seed": self.seed,
            "end": self.end,
        }


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix-style), the same in every process and run."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


def frac(*values: int) -> float:
    """A number in [0, 1) from integers, the same in every process and run."""
    return (mix(*values) >> 11) / float(1 << 53)


def _split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` shared out by weight, largest remainders first, so every run of the same size agrees."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[: total - sum(out.values())]:
        out[k] += 1
    return out


def _pick(rng: random.Random, weighted: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([k for k, _ in weighted], [w for _, w in weighted])[0]


def make_fleet(instances: int, days: int, interval_s: int, *, end: int, seed: int = SEED) -> Fleet:
    """The fleet whose data ends at `end` (UTC epoch s, on the interval grid) and covers `days` before it."""
    if HOUR % interval_s:
        raise ValueError("the interval must divide an hour")
    rng = random.Random(seed)
    start = end - days * DAY

    types = [t for t, n in _split(instances, MIX).items() for _ in range(n)]
    rng.shuffle(types)
    # A quarter of all GPUs in MIG mode, on A100 and H100 hosts only.
    mig_left = round(sum(INSTANCE_TYPES[t][1] for t in types) / 4)
    reconfig_mid = (start + days * DAY // 2) // HOUR * HOUR
    out: list[InstanceSpec] = []
    key = 0
    for i, itype in enumerate(types):
        family = FAMILIES[INSTANCE_TYPES[itype][0]]
        ngpus = INSTANCE_TYPES[itype][1]
        region, offset = _pick_region(rng)
        team = TEAMS[rng.randrange(len(TEAMS))] if itype[0] == "g" else rng.choice(TEAMS[:2] + TEAMS[3:])
        if team == "inference" or (itype[0] == "g" and rng.random() < 0.4):
            pattern = _pick(rng, ((INFERENCE, 60), (IDLE, 10), (HELD, 10), (DAYNIGHT, 20)))
        else:
            pattern = _pick(rng, ((TRAINING, 35), (DAYNIGHT, 30), (JOBS, 15), (IDLE, 10), (HELD, 10)))
        env = "prod" if pattern == INFERENCE else rng.choice(("dev", "staging", "research"))
        lifecycle = "spot" if rng.random() < (0.2 if itype[0] == "p" else 0.35) else "on-demand"
        instance_id = f"i-0{rng.getrandbits(64):016x}"
        n_mig = 0
        if family.mig and mig_left > 0:
            n_mig = min(mig_left, rng.choice((8, 8, 4, 2)))
            mig_left -= n_mig
        reconfigure = n_mig > 0 and rng.random() < 0.2 and days >= 2
        at = reconfig_mid + rng.randrange(-12, 13) * HOUR if reconfigure else None
        gpus: list[GpuSpec] = []
        for g in range(ngpus):
            key += 1
            gpu_key = key
            gpu_pattern = pattern if rng.random() < 0.8 else _pick(rng, ((IDLE, 40), (HELD, 35), (DAYNIGHT, 25)))
            if g >= n_mig:
                gpus.append(GpuSpec(gpu_key, _uid(rng, "GPU"), g, family, gpu_pattern))
                continue

            first = _layout(rng, family, key + 1)
            key += len(first)
            if at is not None and g < max(1, n_mig // 4):
                second = _layout(rng, family, key + 1)
                key += len(second)
                gpus.append(GpuSpec(gpu_key, _uid(rng, "GPU"), g, family, gpu_pattern, first, second, at))
            else:
                gpus.append(GpuSpec(gpu_key, _uid(rng, "GPU"), g, family, gpu_pattern, first))
        gone_at = None
        if lifecycle == "spot" and n_mig == 0 and rng.random() < 0.08 and days >= 3:
            gone_at = end - int((1.0 + 2.0 * rng.random()) * DAY) // interval_s * interval_s
        tags = {"Name": f"{team}-{pattern}-{i}", "team": team, "env": env}
        out.append(
            InstanceSpec(
                key=i,
                instance_id=instance_id,
                instance_type=itype,
                region=region,
                utc_offset_h=offset,
                zone=f"{region}{'abcd'[rng.randrange(4)]}",
                lifecycle=lifecycle,
                tags=tags,
                pattern=pattern,
                gpus=tuple(gpus),
                gone_at=gone_at,
                reconfigured_at=at if any(g.reconfigured_at for g in gpus) else None,
            )
        )
    fleet = Fleet(instances, days, interval_s, seed, start, end, tuple(out))
    fleet.counts.update(count_devices(fleet))
    return fleet


def _uid(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _layout(rng: random.Random, family: Family, first_key: int) -> tuple[SliceSpec, ...]:
    """A MIG layout picked by weight, its slices numbered from `first_key`."""
    names = list(LAYOUTS)
    name = rng.choices(names, [LAYOUTS[n][1] for n in names])[0]
    made: list[SliceSpec] = []
    for k, (gi, size) in enumerate(LAYOUTS[name][0]):
        profile, mem = MIG_PROFILES[family.name][size]
        made.append(SliceSpec(first_key + k, _uid(rng, "MIG"), gi, size, profile, mem, _pick(rng, SLICE_PATTERNS)))
    return tuple(made)


def _pick_region(rng: random.Random) -> tuple[str, int]:
    name, offset, _w = rng.choices(REGIONS, [w for _, _, w in REGIONS])[0]
    return name, offset


def count_devices(fleet: Fleet) -> dict[str, int]:
    gpus = [g for inst in fleet.instances for g in inst.gpus]
    slices = sum(len(g.slices) + len(g.new_slices) for g in gpus)
    return {
        "instances": len(fleet.instances),
        "gpus": len(gpus),
        "mig_gpus": sum(g.mig for g in gpus),
        "slices": slices,
        "retired_slices": sum(len(g.slices) for g in gpus if g.reconfigured_at is not None),
        "devices": len(gpus) + slices,
    }


# ----------------------------------------------------------------------------------------------------------------
# Inventory, as an agent reports it


def _slice_dict(s: SliceSpec, family: Family) -> dict[str, Any]:
    return {
        "uuid": s.uuid,
        "gpu_instance_id": s.gpu_instance_id,
        "compute_instance_id": 0,
        "profile": s.profile,
        "compute_slices": s.compute_slices,
        "memory_total_mib": s.memory_mib,
        "util_unavailable_reason": None if family.gpm else AMPERE_MIG_REASON,
    }


def batch_dict(fleet: Fleet, inst: InstanceSpec, at: int) -> dict[str, Any]:
    """An ingest batch (no intervals) with the instance and its hardware as they were at `at`."""
    gpus: list[dict[str, Any]] = []
    for g in inst.gpus:
        gpu: dict[str, Any] = {
            "uuid": g.uuid,
            "index": g.index,
            "name": g.family.nvml_name,
            "memory_total_mib": g.family.memory_mib,
            "mig_mode": g.mig,
        }
        if g.mig:
            layout = g.layout(at)
            gpu["unpartitioned_slices"] = 7 - sum(s.compute_slices for s in layout)
            gpu["util_unavailable_reason"] = None if g.family.gpm else MIG_PARENT_REASON
            gpu["slices"] = [_slice_dict(s, g.family) for s in layout]
        gpus.append(gpu)
    return {
        "schema_version": 1,
        "batch_id": str(uuid.UUID(int=mix(fleet.seed, inst.key, at) << 64 | mix(at, inst.key), version=4)),
        "agent": {"version": AGENT_VERSION, "interval_s": float(fleet.interval_s)},
        "instance": {
            "instance_id": inst.instance_id,
            "hostname": inst.hostname,
            "instance_type": inst.instance_type,
            "region": inst.region,
            "availability_zone": inst.zone,
            "lifecycle": inst.lifecycle,
            "ami_id": "ami-0a1b2c3d4e5f60718",
            "tags": inst.tags,
        },
        "gpus": gpus,
        "intervals": [],
    }
