"""Which GPUs and MIG slices exist right now, and whether a MIG mode change waits for a GPU reset.

GPU handles live as long as NVML is initialised. MIG handles die with their instance, so slices are
re-enumerated every interval; a slice is recognised by its UUID, and only a new UUID costs the calls that
describe it (ids, name, attributes). A MIG device that cannot be described is still reported, with an unknown
profile; one that cannot even be identified leaves the GPU's layout incomplete. Either way the GPU's free
capacity becomes unknown, never counted free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..nvml import Absent, Nvml, text
from . import profiles

MIG_SLICES = 7  # compute slices per MIG-capable GPU
UNKNOWN_PROFILE = "unknown"
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
    compute_slices: int | None
    gpu_instance_slices: int | None
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
    mig_pending: bool | None = None
    """A MIG mode requested but waiting for a GPU reset; None when none is."""
    slices: dict[str, SliceDevice] = field(default_factory=dict)
    unpartitioned_slices: int | None = None
    layout_complete: bool = True
    util_reason: str | None = None
    lost: str | None = None
    unsupported: set[str] = field(default_factory=set)
    denied: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Figures NVML refused at this privilege in the current interval: figure -> (call, what to grant)."""
    memo: dict[str, Any] = field(default_factory=dict)

    def deny(self, figure: str, call: str, grant: str) -> None:
        self.denied[figure] = (call, grant)

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
        gpu.mig_pending = None if int(mode[1]) == int(mode[0]) else int(mode[1]) == 1
        gpu.layout_complete = True
        if not gpu.mig_mode:
            gpu.slices.clear()
            gpu.unpartitioned_slices = None
            return
        count = nvml.call(lib.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        if isinstance(count, Absent):
            gpu.layout_complete = False
            gpu.unpartitioned_slices = None
            return
        seen: dict[str, SliceDevice] = {}
        for j in range(count):
            # Indices can be sparse: an empty one answers NotFound or InvalidArgument, which is not an error.
            handle = nvml.quiet(lib.nvmlDeviceGetMigDeviceHandleByIndex, gpu.handle, j)
            if isinstance(handle, Absent):
                if handle.reason not in ("not_found", "invalid_argument"):
                    nvml.errors[f"nvmlDeviceGetMigDeviceHandleByIndex:{handle.reason}"] += 1
                    gpu.layout_complete = False
                continue
            uuid = nvml.call(lib.nvmlDeviceGetUUID, handle)
            if isinstance(uuid, Absent):
                gpu.layout_complete = False
                continue
            key = text(uuid)
            known = gpu.slices.get(key)
            if known is not None and known.compute_slices is not None:
                known.handle = handle
                seen[key] = known
                continue
            described = self._describe_slice(gpu, handle, key)
            if described is None:
                gpu.layout_complete = False
                continue
            seen[key] = described
        gpu.slices = seen
        gpu.unpartitioned_slices = _unpartitioned(gpu)

    def _describe_slice(self, gpu: GpuDevice, handle: Any, uuid: str) -> SliceDevice | None:
        """A MIG device's place (GPU and compute instance ids) and size; None when even its place is unknown.

        The profile comes from the device's name where it carries one, else from its attributes; with neither,
        the slice is kept with an unknown profile, since its capacity is in use by something.
        """
        lib, nvml = self.nvml.lib, self.nvml
        gi = nvml.call(lib.nvmlDeviceGetGpuInstanceId, handle)
        ci = nvml.call(lib.nvmlDeviceGetComputeInstanceId, handle)
        if isinstance(gi, Absent) or isinstance(ci, Absent):
            return None
        name = nvml.call(lib.nvmlDeviceGetName, handle)
        attrs = nvml.call(lib.nvmlDeviceGetAttributes, handle)
        memory_mib = None if isinstance(attrs, Absent) else int(attrs.memorySizeMB) or None
        named = None if isinstance(name, Absent) else profiles.from_device_name(text(name))
        if named is not None:
            profile, ci_slices, gi_slices = named
        elif not isinstance(attrs, Absent):
            gi_slices = int(attrs.gpuInstanceSliceCount)
            ci_slices = int(attrs.computeInstanceSliceCount) or gi_slices
            profile = profiles.from_size(gpu.name, gpu.memory_total_mib, gi_slices, memory_mib)
            if ci_slices < gi_slices:
                # Several compute instances share this GPU instance (and its memory); name it as nvidia-smi does.
                profile = f"{ci_slices}c.{profile}"
        else:
            return SliceDevice(handle, uuid, gpu, int(gi), int(ci), UNKNOWN_PROFILE, None, None, None)
        return SliceDevice(handle, uuid, gpu, int(gi), int(ci), profile, ci_slices, gi_slices, memory_mib)


def _unpartitioned(gpu: GpuDevice) -> int | None:
    """Compute slices in no GPU instance; None (unknown) when a slice's size or the layout is not known."""
    if not gpu.layout_complete:
        return None
    used: dict[int, int] = {}
    for s in gpu.slices.values():
        if s.gpu_instance_slices is None:
            return None
        used[s.gpu_instance_id] = s.gpu_instance_slices
    return max(0, MIG_SLICES - sum(used.values()))


def _memory_info(nvml: Nvml, handle: Any) -> Any:
    """v2 memory info (`used` excludes driver-reserved memory); v1 where the driver lacks v2."""
    lib = nvml.lib
    info = nvml.quiet(lib.nvmlDeviceGetMemoryInfo, handle, version=lib.nvmlMemory_v2)
    if isinstance(info, Absent):
        info = nvml.quiet(lib.nvmlDeviceGetMemoryInfo, handle)
    return info
