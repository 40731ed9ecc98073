"""MIG profile names (`3g.40gb`, `1c.2g.10gb`) from what NVML tells an unprivileged caller.

Best is the MIG device's own name, which ends in its profile on current drivers ("NVIDIA A100-SXM4-40GB MIG
1g.5gb"; nvidia-smi -L and HTCondor's condor_gpu_discovery show the same suffix). Next is the slice's size
(compute slices and memory, from its attributes), matched against the shipped profile table of the GPU model,
which the GPU's name tells (the exact profile id needs root). Where the model cannot be told, the profile is
named from the size itself (`1g.5gb` from 4864 MiB); a model is never assumed.
"""

from __future__ import annotations

import math
import os
import re
from functools import cache
from typing import NamedTuple

_MIG_SUFFIX = re.compile(r"\bMIG\s+(?:(\d)c\.)?(\d)g\.(\d+)gb(\+me)?\s*$", re.IGNORECASE)
_SIZE_IN_NAME = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_NEAR = 0.15  # a slice within 15 % of a profile's nominal memory has that profile


class Profile(NamedTuple):
    """A slice's profile name, its compute slices and its GPU instance's compute slices (of 7)."""

    name: str
    compute_slices: int
    gpu_instance_slices: int


def from_device_name(name: str) -> Profile | None:
    """The profile a MIG device's name ends in: "... MIG 1c.3g.71gb" is 1 compute slice of a 3g.71gb."""
    found = _MIG_SUFFIX.search(name)
    if found is None:
        return None
    ci, gi, gb = found.group(1), int(found.group(2)), found.group(3)
    profile = f"{gi}g.{gb}gb"
    if ci is not None and int(ci) < gi:
        return Profile(f"{ci}c.{profile}", int(ci), gi)
    return Profile(profile, gi, gi)


def from_size(gpu_name: str, gpu_memory_mib: int | None, gi_slices: int, memory_mib: int | None) -> str:
    """The GPU-instance profile from its compute slices and memory (MiB), for a GPU of that name."""
    if memory_mib is None:
        return f"{gi_slices}g"
    gb = memory_mib / 1024
    candidates = [c for model in models_of(gpu_name, gpu_memory_mib) for c in _table().get(model, [])]
    candidates = [c for c in candidates if c[0] == gi_slices]
    if candidates:
        best = min(candidates, key=lambda c: abs(c[1] - gb))
        if abs(best[1] - gb) <= _NEAR * best[1]:
            return best[2]
    return f"{gi_slices}g.{math.ceil(gb)}gb"


def models_of(gpu_name: str, gpu_memory_mib: int | None) -> list[str]:
    """Models in the profile table a GPU of this name can be. An A100 whose name carries no size and whose
    memory is unknown can be either: its slices' memory then tells the profiles apart."""
    name = gpu_name.upper()
    size = _SIZE_IN_NAME.search(name)
    gb = int(size.group(1)) if size else (round(gpu_memory_mib / 1024) if gpu_memory_mib else None)
    if "H200" in name:
        return ["H200-141GB"]
    if "H100" in name:
        return ["H100-80GB"] if gb is None or 75 <= gb <= 85 else []
    if "A100" in name:
        if gb is None:
            return ["A100-40GB", "A100-80GB"]
        return ["A100-40GB"] if gb < 60 else ["A100-80GB"]
    return []


@cache
def _table() -> dict[str, list[tuple[int, int, str]]]:
    """GPU model -> [(compute slices, nominal GB, profile name)] from the shipped MIG profile table."""
    # A plain read: importlib.resources and csv would cost the agent more memory than the table itself.
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "mig-profiles.csv")
    with open(path, encoding="utf-8") as f:
        header, *rows = (line.strip().split(",") for line in f if line.strip())
    col = {name: i for i, name in enumerate(header)}
    table: dict[str, list[tuple[int, int, str]]] = {}
    for row in rows:
        if row[col["profile"]].endswith("+me"):
            continue  # media-extension profiles look the same through NVML's attributes
        table.setdefault(row[col["gpu_model"]], []).append(
            (int(row[col["compute_slices_of_7"]]), int(row[col["memory_gb"]]), row[col["profile"]])
        )
    return table
