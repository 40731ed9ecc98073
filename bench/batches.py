"""Simulated agents' batches, as `POST /api/v1/ingest` takes them: deterministic from an agent's spec and the
batch's number, so any process can build any batch.

The dense spec (`make_spec`) is a p4d.24xlarge-like instance: 4 plain A100s and 4 in MIG mode with seven 1g.5gb
slices each, 36 devices. bench/instances.py makes the realistic ones (the agent at its defaults). With holders,
each device has three processes of its own, and a sample with N processes refers to the first N of them, as the
agent sends them (docs/ingest-protocol.md, "Holders"): each process described once per batch.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

INGEST_PATH = "/api/v1/ingest"
INTERVAL_S = 10.0
PLAIN_GPUS = 4
MIG_GPUS = 4
SLICES_PER_GPU = 7
DEVICES = PLAIN_GPUS + MIG_GPUS * (1 + SLICES_PER_GPU)
GPU_NAME = "NVIDIA A100-SXM4-40GB"
GPU_MEM_MIB = 40960
SLICE_MEM_MIB = 4864
MIG_REASON = "A100 MIG: NVML gives no utilization for MIG devices or their parent GPU"
# The server refuses intervals more than 300 s ahead of its clock; stay well inside that.
FUTURE_MARGIN_S = 240.0


@dataclass(frozen=True)
class AgentSpec:
    """One simulated agent: its instance and devices (the same in every batch) and the time its batches cover."""

    index: int
    seed: int
    start: float  # epoch seconds of its first interval
    intervals: int
    limit: int  # batches it may send before its clock would pass the server's future-skew bound
    static: dict[str, Any]  # agent, instance and gpus: the same in every batch
    plain: tuple[str, ...]
    mig: tuple[tuple[str, tuple[str, ...]], ...]
    processes: dict[str, list[dict[str, Any]]] | None = None
    """Per device uuid, its processes as the batch's `holders` describe them (ids unique in the agent); None:
    the batches have no holders."""


SliceLayout = tuple[str, int, int, int]
"""profile, compute slices, memory MiB, GPU instance id: one MIG slice as agents report it."""

# A100 places 1g.5gb GPU instances at ids 7..13.
DENSE_SLICES: tuple[SliceLayout, ...] = tuple(("1g.5gb", 1, SLICE_MEM_MIB, 7 + k) for k in range(SLICES_PER_GPU))


def gpu_inventory(
    plain: tuple[str, ...], mig: tuple[tuple[str, tuple[str, ...]], ...], layout: tuple[SliceLayout, ...]
) -> list[dict[str, Any]]:
    """The batch's `gpus`: the plain GPUs first, then the MIG GPUs, each split as `layout` says."""
    gpus: list[dict[str, Any]] = [
        {"uuid": u, "index": i, "name": GPU_NAME, "memory_total_mib": GPU_MEM_MIB, "mig_mode": False}
        for i, u in enumerate(plain)
    ]
    for j, (gpu_uuid, slices) in enumerate(mig):
        gpus.append(
            {
                "uuid": gpu_uuid,
                "index": len(plain) + j,
                "name": GPU_NAME,
                "memory_total_mib": GPU_MEM_MIB,
                "mig_mode": True,
                "unpartitioned_slices": 0,
                "util_unavailable_reason": MIG_REASON,
                "slices": [
                    {
                        "uuid": s,
                        "gpu_instance_id": gi,
                        "compute_instance_id": 0,
                        "profile": profile,
                        "compute_slices": compute,
                        "memory_total_mib": mem,
                        "util_unavailable_reason": MIG_REASON,
                    }
                    for s, (profile, compute, mem, gi) in zip(slices, layout, strict=True)
                ],
            }
        )
    return gpus


PROCESSES_PER_DEVICE = 3
_USERS = ("ana", "bob", "mchen", "asmith", "jlee", "priya")


def _processes(rng: random.Random, devices: list[str], start: float) -> dict[str, list[dict[str, Any]]]:
    started = datetime.fromtimestamp(start - 3600.0, UTC).isoformat()
    out: dict[str, list[dict[str, Any]]] = {}
    for d, device in enumerate(devices):
        procs = []
        for k in range(PROCESSES_PER_DEVICE):
            user = rng.choice(_USERS)
            procs.append(
                {
                    "id": d * PROCESSES_PER_DEVICE + k,
                    "pid": 10_000 + d * 10 + k,
                    "executable": rng.choice(("python3", "torchrun", "vllm")),
                    "uid": 1000 + _USERS.index(user),
                    "user": user,
                    "started_at": started,
                    **(
                        {"namespace": "inference", "pod": f"vllm-{d}", "pod_uid": str(uuid.UUID(int=d + 1))}
                        if k
                        else {}
                    ),
                }
            )
        out[device] = procs
    return out


def make_spec(index: int, seed: int, now: float, intervals: int, *, holders: bool = False) -> AgentSpec:
    """Dense agent `index`: 36 devices; its first interval a day back, so it has room to send before it reaches
    the server's clock. With `holders`, its samples say which processes hold each device."""
    rng = random.Random(seed * 7919 + index)
    # A day back, so each agent has ~1440 batches of room before reaching the present.
    start = math.floor((now - 86400.0) / INTERVAL_S) * INTERVAL_S + rng.uniform(0.0, INTERVAL_S)
    batch_s = intervals * INTERVAL_S
    last_offset = (intervals - 1) * INTERVAL_S
    limit = max(0, math.floor((now + FUTURE_MARGIN_S - start - last_offset) / batch_s) + 1)

    def uid(prefix: str) -> str:
        return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128), version=4)}"

    plain = tuple(uid("GPU") for _ in range(PLAIN_GPUS))
    mig = tuple((uid("GPU"), tuple(uid("MIG") for _ in range(SLICES_PER_GPU))) for _ in range(MIG_GPUS))
    gpus = gpu_inventory(plain, mig, DENSE_SLICES)
    octets = (index // 250, index % 250 + 2)
    static: dict[str, Any] = {
        "agent": {"version": "0.1.0", "interval_s": INTERVAL_S, "dropped_batches": 0},
        "instance": {
            "instance_id": f"i-0{rng.getrandbits(64):016x}",
            "hostname": f"ip-10-0-{octets[0]}-{octets[1]}.ec2.internal",
            "instance_type": "p4d.24xlarge",
            "region": "us-east-1",
            "availability_zone": f"us-east-1{'abcd'[index % 4]}",
            "lifecycle": "spot" if index % 3 == 0 else "on-demand",
            "ami_id": "ami-0123456789abcdef0",
            "tags": {"Name": f"bench-{index}", "team": f"team-{index % 5}", "env": "bench"},
        },
        "gpus": gpus,
    }
    devices = [*plain, *(u for g, slices in mig for u in (g, *slices))]
    processes = _processes(rng, devices, start) if holders else None
    return AgentSpec(index, seed, start, intervals, limit, static, plain, mig, processes)


def make_batch(spec: AgentSpec, n: int) -> dict[str, Any]:
    """Batch `n` of this agent: deterministic, so it can be built in any process."""
    rng = random.Random(spec.seed * 1_000_003 + spec.index * 100_003 + n)
    t0 = spec.start + n * spec.intervals * INTERVAL_S
    intervals: list[dict[str, Any]] = []
    for k in range(spec.intervals):
        start = datetime.fromtimestamp(t0 + k * INTERVAL_S, UTC).isoformat(timespec="milliseconds")
        samples: list[dict[str, Any]] = []
        for u in spec.plain:
            util = round(rng.uniform(0.0, 100.0), 1)
            busy = util >= 5.0
            samples.append(
                {
                    "uuid": u,
                    "util": util,
                    "util_source": "nvml.samples",
                    "mem_used_mib": rng.randint(8000, GPU_MEM_MIB - 512) if busy else rng.choice((0, 0, 418)),
                    "power_w": round(55.0 + util * 3.4 + rng.uniform(-5.0, 5.0), 1),
                    "temp_c": round(31.0 + util * 0.35 + rng.uniform(-2.0, 2.0), 1),
                    "procs": rng.randint(1, 3) if busy else 0,
                }
            )
        for gpu_uuid, slices in spec.mig:
            slice_samples: list[dict[str, Any]] = []
            mem_total = 0
            procs_total = 0
            for s in slices:
                procs = rng.choice((0, 1, 1, 2))
                mem = rng.randint(300, SLICE_MEM_MIB - 64) if procs else 0
                mem_total += mem
                procs_total += procs
                slice_samples.append(
                    {"uuid": s, "util": None, "util_source": "none", "mem_used_mib": mem, "procs": procs}
                )
            samples.append(
                {
                    "uuid": gpu_uuid,
                    "util": None,
                    "util_source": "none",
                    "mem_used_mib": mem_total,
                    "power_w": round(rng.uniform(70.0, 330.0), 1),
                    "temp_c": round(rng.uniform(33.0, 68.0), 1),
                    "procs": procs_total,
                }
            )
            samples.extend(slice_samples)
        intervals.append({"start": start, "duration_s": INTERVAL_S, "samples": samples})
    batch = {"schema_version": 1, "batch_id": str(uuid.uuid4()), **spec.static, "intervals": intervals}
    if spec.processes is not None:
        batch["holders"] = _refer(spec.processes, intervals)
    return batch


def _refer(processes: dict[str, list[dict[str, Any]]], intervals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sample with N processes refers to its device's first N (the memory split among them); the processes
    referred to, described once."""
    described: dict[int, dict[str, Any]] = {}
    for interval in intervals:
        for sample in interval["samples"]:
            n = min(sample["procs"], PROCESSES_PER_DEVICE)
            if not n:
                continue
            mine = processes[sample["uuid"]][:n]
            used = sample["mem_used_mib"] // n
            sample["holders"] = [{"ref": p["id"], "used_mib": used} for p in mine]
            for p in mine:
                described[p["id"]] = p
    return list(described.values())


def make_body(spec: AgentSpec, n: int) -> bytes:
    return gzip.compress(orjson.dumps(make_batch(spec, n)), compresslevel=6, mtime=0)


def spec_devices(spec: AgentSpec) -> int:
    """Samples per interval of this agent: every GPU, and every slice of a MIG GPU."""
    return len(spec.plain) + sum(1 + len(slices) for _gpu, slices in spec.mig)


def build_bodies(spec: AgentSpec, count: int) -> list[bytes]:
    return [make_body(spec, n) for n in range(min(count, spec.limit))]


class BodySource:
    """An agent's batches in order: pre-built ones first, then built on the spot (counted, as it costs CPU)."""

    def __init__(self, spec: AgentSpec, bodies: list[bytes]) -> None:
        self.spec = spec
        self.bodies = bodies
        self.next_n = 0
        self.built_live = 0

    def next(self) -> bytes | None:
        n = self.next_n
        if n >= self.spec.limit:
            return None
        self.next_n = n + 1
        if n < len(self.bodies):
            body = self.bodies[n]
            self.bodies[n] = b""  # the memory can go once sent
            return body
        self.built_live += 1
        return make_body(self.spec, n)


# --------------------------------------------------------------------------------------------------------------
# Answers, read off a raw stream (the load clients speak HTTP/1.1 themselves)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool, float | None]:
    """Status, body, whether the server keeps the connection open (HTTP/1.1, no `Connection: close`), and its
    Retry-After in seconds, if any."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    if "content-length" in headers:
        data = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:  # no trailers are expected
                break
        data = b"".join(p[:-2] for p in parts)
    else:
        data = await reader.read()
    retry_after = headers.get("retry-after", "")
    return status, data, headers.get("connection") != "close", float(retry_after) if retry_after.isdigit() else None
