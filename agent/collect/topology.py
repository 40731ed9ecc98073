"""Which GPUs and MIG slices exist right now.

GPU handles live as long as NVML is initialised. MIG handles die with their instance, so slices are
re-enumerated every interval; a slice is recognised by its UUID, and only a new UUID costs the calls that
describe it (ids, attributes).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..nvml import Absent, Nvml, text

MIG_SLICES = 7  # compute slices per MIG-capable GPU
ARCH_HOPPER = 9
_MIB = 1024 * 1024


@dataclass(eq=False)
class SliceDevice:
    """A live MIG device and what the sources remember about it between intervals."""

    handle: Any
    uuid: str
    parent: GpuDevice
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    compute_slices: int
    gpu_instance_slices: int
    memory_total_mib: int | None
    util_reason: str | None = None
    memo: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class GpuDevice:
    """A physical GPU: its handle, what it is, what it cannot do, and per-source memory between intervals."""

    index: int
    handle: Any
    uuid: str
    name: str
    architecture: int | None
    memory_total_mib: int | None
    mig_capable: bool
    mig_mode: bool = False
    slices: dict[str, SliceDevice] = field(default_factory=dict)
    unpartitioned_slices: int | None = None
    util_reason: str | None = None
    lost: str | None = None
    unsupported: set[str] = field(default_factory=set)
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def is_hopper_or_newer(self) -> bool:
        return self.architecture is not None and self.architecture >= ARCH_HOPPER


class Topology:
    """Finds GPUs once and their MIG slices every interval."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.gpus: list[GpuDevice] = []

    def discover(self) -> list[GpuDevice]:
        lib, nvml = self.nvml.lib, self.nvml
        count = nvml.call(lib.nvmlDeviceGetCount)
        self.gpus = []
        for index in range(0 if isinstance(count, Absent) else count):
            handle = nvml.call(lib.nvmlDeviceGetHandleByIndex, index)
            if isinstance(handle, Absent):
                continue
            uuid = nvml.call(lib.nvmlDeviceGetUUID, handle)
            if isinstance(uuid, Absent):
                continue
            name = nvml.call(lib.nvmlDeviceGetName, handle)
            arch = nvml.quiet(lib.nvmlDeviceGetArchitecture, handle)
            memory = _memory_info(nvml, handle)
            mig = nvml.quiet(lib.nvmlDeviceGetMigMode, handle)
            gpu = GpuDevice(
                index=index,
                handle=handle,
                uuid=text(uuid),
                name=text(name) if not isinstance(name, Absent) else "unknown GPU",
                architecture=None if isinstance(arch, Absent) else int(arch),
                memory_total_mib=None if isinstance(memory, Absent) else int(memory.total) // _MIB,
                mig_capable=not isinstance(mig, Absent),
                mig_mode=not isinstance(mig, Absent) and int(mig[0]) == 1,
            )
            self.gpus.append(gpu)
        for gpu in self.gpus:
            self.refresh(gpu)
        return self.gpus

    def refresh(self, gpu: GpuDevice) -> None:
        """Re-read MIG mode and the slice layout of one GPU."""
        if gpu.lost or not gpu.mig_capable:
            return
        lib, nvml = self.nvml.lib, self.nvml
        mode = nvml.call(lib.nvmlDeviceGetMigMode, gpu.handle)
        if isinstance(mode, Absent):
            if mode.reason == "gpu_lost":
                gpu.lost = mode.reason
            return
        gpu.mig_mode = int(mode[0]) == 1
        if not gpu.mig_mode:
            gpu.slices.clear()
            gpu.unpartitioned_slices = None
            return
        count = nvml.call(lib.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        if isinstance(count, Absent):
            return
        seen: dict[str, SliceDevice] = {}
        for j in range(count):
            # Indices can be sparse: an empty one answers NotFound or InvalidArgument, which is not an error.
            handle = nvml.quiet(lib.nvmlDeviceGetMigDeviceHandleByIndex, gpu.handle, j)
            if isinstance(handle, Absent):
                if handle.reason not in ("not_found", "invalid_argument"):
                    nvml.errors[f"nvmlDeviceGetMigDeviceHandleByIndex:{handle.reason}"] += 1
                continue
            uuid = nvml.call(lib.nvmlDeviceGetUUID, handle)
            if isinstance(uuid, Absent):
                continue
            key = text(uuid)
            known = gpu.slices.get(key)
            if known is not None:
                known.handle = handle
                seen[key] = known
                continue
            described = self._describe_slice(gpu, handle, key)
            if described is not None:
                seen[key] = described
        gpu.slices = seen
        used: dict[int, int] = {}
        for s in seen.values():
            used[s.gpu_instance_id] = s.gpu_instance_slices
        gpu.unpartitioned_slices = max(0, MIG_SLICES - sum(used.values()))

    def _describe_slice(self, gpu: GpuDevice, handle: Any, uuid: str) -> SliceDevice | None:
        lib, nvml = self.nvml.lib, self.nvml
        gi = nvml.call(lib.nvmlDeviceGetGpuInstanceId, handle)
        ci = nvml.call(lib.nvmlDeviceGetComputeInstanceId, handle)
        attrs = nvml.call(lib.nvmlDeviceGetAttributes, handle)
        if isinstance(gi, Absent) or isinstance(ci, Absent) or isinstance(attrs, Absent):
            return None
        gi_slices = int(attrs.gpuInstanceSliceCount)
        ci_slices = int(attrs.computeInstanceSliceCount) or gi_slices
        memory_mib = int(attrs.memorySizeMB) or None
        profile = profile_name(gpu.name, gpu.memory_total_mib, gi_slices, memory_mib)
        if ci_slices < gi_slices:
            # Several compute instances share this GPU instance (and its memory); name it as nvidia-smi does.
            profile = f"{ci_slices}c.{profile}"
        return SliceDevice(
            handle=handle,
            uuid=uuid,
            parent=gpu,
            gpu_instance_id=int(gi),
            compute_instance_id=int(ci),
            profile=profile,
            compute_slices=ci_slices,
            gpu_instance_slices=gi_slices,
            memory_total_mib=memory_mib,
        )


def _memory_info(nvml: Nvml, handle: Any) -> Any:
    """v2 memory info (`used` excludes driver-reserved memory); v1 where the driver lacks v2."""
    lib = nvml.lib
    info = nvml.quiet(lib.nvmlDeviceGetMemoryInfo, handle, version=lib.nvmlMemory_v2)
    if isinstance(info, Absent):
        info = nvml.call(lib.nvmlDeviceGetMemoryInfo, handle)
    return info


@cache
def _profile_table() -> dict[str, list[tuple[int, int, str]]]:
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


def _gpu_model(name: str, memory_total_mib: int | None) -> str | None:
    if "H200" in name:
        return "H200-141GB"
    if "H100" in name:
        return "H100-80GB"
    if "A100" in name:
        return "A100-40GB" if memory_total_mib is not None and memory_total_mib < 60 * 1024 else "A100-80GB"
    return None


def profile_name(gpu_name: str, gpu_memory_mib: int | None, compute_slices: int, memory_mib: int | None) -> str:
    """The MIG profile name (`3g.40gb`) from what NVML tells without privileges: slices and memory size.

    The exact profile id needs root, so the name is matched against the known profiles of the GPU model by
    slice count and nearest memory size; an unknown model gets memory rounded up to whole GB.
    """
    if memory_mib is None:
        return f"{compute_slices}g"
    gb = memory_mib / 1024
    model = _gpu_model(gpu_name, gpu_memory_mib)
    candidates = [c for c in _profile_table().get(model or "", []) if c[0] == compute_slices]
    if candidates:
        return min(candidates, key=lambda c: abs(c[1] - gb))[2]
    return f"{compute_slices}g.{math.ceil(gb)}gb"
