"""The simulation's live objects: GPUs, GPU instances, MIG devices, processes, GPM samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .curves import Curve
from .hardware import Model, Profile

MIB = 1024 * 1024
NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
MIG_SLICES = 7  # compute slices of a MIG-capable GPU
GPM_METRICS = ("graphics", "sm", "occ", "tensor", "dram")


@dataclass(frozen=True, slots=True)
class Owner:
    """What a simulated process's /proc entry says (`procfs`): executable name (at most 15 characters), uid and
    user name, arguments, how long before the epoch it started (s), its cgroup file, and for a pod process
    kubelet's log folder of the pod and the container's name."""

    comm: str
    uid: int
    user: str
    cmdline: tuple[str, ...]
    age_s: float
    cgroup: str
    pod_dir: str | None = None
    container: str | None = None


@dataclass(eq=False, slots=True)
class Proc:
    pid: int
    used_bytes: int
    gi_id: int = NO_ID
    ci_id: int = NO_ID
    unit: Curve | None = None  # the work it belongs to: the process exists while that unit is working
    owner: Owner | None = None  # None: no /proc entry (a process a test added)


@dataclass(eq=False, slots=True)
class GpmCounters:
    """Activity integrated since the counters started (percent-seconds per metric). A GPU instance's counters
    start at zero when the instance is made: a remade instance is a new set of counters, which is why
    nvidia_gpu_exporter (docs/METRICS.md) starts its GPM sampling again when a GPU instance is remade."""

    t: float
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPM_METRICS, 0.0))


@dataclass(eq=False, slots=True)
class GpuInstance:
    gi_id: int
    profile: str
    spec: Profile
    counters: GpmCounters
    cis: list[MigDevice] = field(default_factory=list)
    weights: list[tuple[float, Curve]] = field(default_factory=list)  # CI share of this GI's compute


@dataclass(eq=False, slots=True)
class MigDevice:
    parent: Gpu
    index: int
    gi: GpuInstance
    ci_id: int
    ci_slices: int
    name: str
    uuid: str
    curve: Curve
    handle: Any  # a c_nvmlDevice_t to copy for callers
    attrs: tuple[int, ...]


@dataclass(eq=False, slots=True)
class Gpu:
    index: int
    model: Model
    name: str
    uuid: str
    bus: int
    device: int
    ecc: bool
    handle: Any
    curve: Curve | None  # None in MIG mode: the compute instances carry the load
    sample_phase_us: int
    energy_t: float
    energy_mj: float
    counters: GpmCounters
    mig_pending: bool | None = None  # a requested MIG mode that needs a GPU reset
    mig: dict[int, MigDevice] = field(default_factory=dict)  # MIG device index -> device
    gis: dict[int, GpuInstance] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    weights: list[tuple[float, Curve]] = field(default_factory=list)  # share of the whole GPU's compute

    @property
    def mig_mode(self) -> bool:
        return self.curve is None


class Truth(NamedTuple):
    """What one GPU or MIG device did over a span of clock time, exactly.

    `util` and `sm_active` are means over the span in %: of a whole GPU, of a MIG device's GPU instance (what
    GPM reports for each of its devices), or of a MIG-mode GPU weighted by compute slices (GPM's whole-GPU
    figure). Memory in use (MiB, without driver-reserved memory; a MIG device: its GPU instance's) and the
    processes are those running at the middle of the span. Power (mean, W), temperature (°C) and SM clock
    (MHz) describe the board and are None for a MIG device.
    """

    util: float
    sm_active: float
    mem_used_mib: int
    procs: int
    procs_mem_mib: int
    power_w: float | None
    temp_c: int | None
    sm_clock_mhz: int | None


def running(node: Gpu | MigDevice, t: float) -> list[Proc]:
    """The processes on a GPU (its MIG devices' included) or on one MIG device at clock time `t`."""
    if isinstance(node, Gpu):
        return [p for p in node.procs if p.unit is None or p.unit.working(t)]
    gi_id, ci_id = node.gi.gi_id, node.ci_id
    return [
        p for p in node.parent.procs if p.gi_id == gi_id and p.ci_id == ci_id and (p.unit is None or p.unit.working(t))
    ]


def memory(node: Gpu | MigDevice, t: float) -> tuple[int, int, int]:
    """(total, reserved, used by processes) in bytes at clock time `t`; a MIG device has its GPU instance's."""
    if isinstance(node, Gpu):
        used = sum(p.used_bytes for p in node.procs if p.unit is None or p.unit.working(t))
        return node.model.total_mib * MIB, node.model.reserved_mib * MIB, used
    gi_id = node.gi.gi_id
    used = sum(p.used_bytes for p in node.parent.procs if p.gi_id == gi_id and (p.unit is None or p.unit.working(t)))
    return node.gi.spec.memory_mb * MIB, 0, used


@dataclass(slots=True)
class Failure:
    function: str
    error: int
    gpu: int | None
    slice_index: int | None
    times: int | None
    gpu_only: bool = False  # on GPU `gpu` itself, not its MIG devices


@dataclass(eq=False, slots=True)
class GpmSample:
    """A GPM sample buffer: after nvmlGpmSampleGet, a snapshot of one GPU's (or one GPU instance's) counters."""

    buffer: Any
    gpu: Gpu | None = None
    gi_id: int | None = None
    t: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)
