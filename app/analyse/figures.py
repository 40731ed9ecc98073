"""Units of capacity and their figures over a window: a passthrough GPU, a MIG slice (worth compute slices / 7 of
its GPU), or the unpartitioned capacity of a MIG-mode GPU. Units carry GPU-hours per state; money is hours x the
unit's price.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fleet import GpuInfo, InstanceInfo, SliceInfo
from .states import UNPARTITIONED
from .usage import DeviceUsage

HOURS_PER_MONTH = 730.0
"""8,760 hours a year / 12: the month a projection is given for."""

GPU = "gpu"
SLICE = "slice"
# The third kind of unit, the free capacity of a MIG GPU, shares its name with the state it is in.


@dataclass(slots=True)
class Figures:
    """Additive figures of one unit or a group of units. Hours are GPU-equivalent hours (a 3g slice counts
    3/7 of an hour per hour); money is USD and counts priced units of known size only."""

    gpu_hours: float = 0.0
    active_h: float = 0.0
    idle_held_h: float = 0.0
    idle_h: float = 0.0
    """Includes unpartitioned MIG capacity."""
    unknown_h: float = 0.0
    offline_h: float = 0.0
    unpartitioned_h: float = 0.0
    no_proc_h: float = 0.0
    util_known_h: float = 0.0
    util_sum_h: float = 0.0
    """Utilization x hours over the hours with a figure, %*h."""
    cost: float = 0.0
    idle_cost: float = 0.0
    idle_held_cost: float = 0.0
    unused_cost: float = 0.0
    """Cost x (1 - utilization), over hours with a utilization figure."""
    unpartitioned_cost: float = 0.0
    unpriced_gpu_hours: float = 0.0
    """GPU-hours of units with no price: their money is left out of every USD figure, never counted as 0."""
    unsized_slice_h: float = 0.0
    """Hours (of the clock) of MIG slices of unknown size: their share of a GPU is unknown, so they are left out
    of GPU-hours and of every USD figure, never counted as 0 or as free."""
    free_unknown_h: float = 0.0
    """Hours (of the clock) of MIG GPUs whose layout was not known in full: none of it counts as unpartitioned."""

    def add(self, other: Figures) -> None:
        # Spelled out: this runs for every unit in every grouping, and a loop over fields costs 5x more.
        self.gpu_hours += other.gpu_hours
        self.active_h += other.active_h
        self.idle_held_h += other.idle_held_h
        self.idle_h += other.idle_h
        self.unknown_h += other.unknown_h
        self.offline_h += other.offline_h
        self.unpartitioned_h += other.unpartitioned_h
        self.no_proc_h += other.no_proc_h
        self.util_known_h += other.util_known_h
        self.util_sum_h += other.util_sum_h
        self.cost += other.cost
        self.idle_cost += other.idle_cost
        self.idle_held_cost += other.idle_held_cost
        self.unused_cost += other.unused_cost
        self.unpartitioned_cost += other.unpartitioned_cost
        self.unpriced_gpu_hours += other.unpriced_gpu_hours
        self.unsized_slice_h += other.unsized_slice_h
        self.free_unknown_h += other.free_unknown_h

    @property
    def avg_util(self) -> float | None:
        """Mean utilization over hours with a figure, %; None when no hour had one."""
        return self.util_sum_h / self.util_known_h if self.util_known_h > 0 else None

    @property
    def unknown_share(self) -> float | None:
        """Share of covered GPU-hours whose utilization is unknown, 0-1."""
        return self.unknown_h / self.gpu_hours if self.gpu_hours > 0 else None

    @property
    def waste(self) -> float:
        """Cost while idle or idle-held, USD."""
        return self.idle_cost + self.idle_held_cost

    @property
    def capacity_unknown(self) -> bool:
        """Whether some MIG capacity in these figures is of unknown size (left out of GPU-hours and money)."""
        return self.unsized_slice_h > 0 or self.free_unknown_h > 0

    @property
    def only_unknown(self) -> bool:
        """Whether these figures cover nothing of known size, only MIG capacity of unknown size: their GPU-hours
        and money are unknown, not 0."""
        return self.gpu_hours == 0 and self.capacity_unknown

    @property
    def state_hours(self) -> dict[str, float]:
        """GPU-hours per state, unpartitioned capacity apart from idle (for a state bar)."""
        return {
            "active": self.active_h,
            "idle-held": self.idle_held_h,
            "idle": self.idle_h - self.unpartitioned_h,
            "unpartitioned": self.unpartitioned_h,
            "unknown": self.unknown_h,
            "offline": self.offline_h,
        }

    @property
    def all_hours(self) -> float:
        return self.gpu_hours + self.offline_h

    def share(self, state: str) -> float:
        total = self.all_hours
        return self.state_hours[state] / total if total > 0 else 0.0


class Unit:
    """One unit of capacity over the window: its figures, its price (USD per GPU-hour) and its weight (share of
    a GPU: 1, or compute slices / 7; None for a slice of unknown size)."""

    # A plain slotted class: a fleet builds thousands of units on every page view.
    __slots__ = ("_device", "_figures", "_rated", "gpu", "kind", "slice", "sources", "usd_per_gpu_hour", "weight")

    def __init__(
        self,
        kind: str,
        gpu: GpuInfo,
        slice: SliceInfo | None,
        weight: float | None,
        usd_per_gpu_hour: float | None,
        figures: Figures,
        device: Figures | None = None,
    ) -> None:
        self.kind = kind
        self.gpu = gpu
        self.slice = slice
        self.weight = weight
        self.usd_per_gpu_hour = usd_per_gpu_hour
        self._figures = figures
        # A slice of unknown size: its own figures in hours of the device (weight 1, unpriced), for its seconds
        # and utilization; `figures` then holds only its unsized hours.
        self._device = device
        self.sources: dict[str, float] | None = None
        """USD per price source where the unit was priced from more than one (app/analyse/priced.py); None when
        all of it is at its instance's price."""
        self._rated: float | None = None
        """Repriced: the sum of GPU-hours with data x their price, USD (offline time paid for left out)."""

    def figures(self) -> Figures:
        """What this unit adds to its groups and to the totals."""
        return self._figures

    def usd_by_source(self) -> dict[str, float]:
        """Its cost per price source (app/pricing: `Price.kind`), USD."""
        if self.sources is not None:
            return self.sources
        kind = self.gpu.instance.price.kind
        return {kind: self._figures.cost} if kind is not None and self._figures.cost else {}

    def reprice(self, change: Figures, sources: dict[str, float], rated: float) -> None:
        """Move its money by `change` (app/analyse/priced.py: what hours at other prices change of its own price),
        with its cost per source, USD, and what its hours with data cost, USD (`mean_usd_per_gpu_hour`)."""
        self._figures.add(change)
        # What subtracting sums of floats leaves of nothing is no source.
        self.sources = {k: v for k, v in sources.items() if abs(v) > 1e-9}
        self._rated = rated

    @property
    def mean_usd_per_gpu_hour(self) -> float | None:
        """What its hours with data cost on average, USD per GPU-hour: its price, or, for a unit priced piece by
        piece, the mean over its priced hours; None where none is priced."""
        if self._rated is None:
            return self.usd_per_gpu_hour
        priced_h = self._figures.gpu_hours - self._figures.unpriced_gpu_hours
        return self._rated / priced_h if priced_h > 1e-12 else self.usd_per_gpu_hour

    @property
    def mean_usd_per_hour(self) -> float | None:
        """What this unit cost per hour it ran over the window, on average, USD/h (its share of a GPU at the mean
        price per GPU-hour); None with no price or no known size."""
        rate = self.mean_usd_per_gpu_hour
        return None if rate is None or self.weight is None else rate * self.weight

    @property
    def sized(self) -> bool:
        """False for a slice of unknown size: its GPU-hours and money are unknown."""
        return self.weight is not None

    @property
    def instance(self) -> InstanceInfo:
        return self.gpu.instance

    @property
    def key(self) -> str:
        if self.slice is not None:
            return f"slice:{self.slice.pk}"
        return f"{self.kind}:{self.gpu.pk}"

    @property
    def label(self) -> str:
        if self.slice is not None:
            return self.slice.label
        if self.kind == UNPARTITIONED:
            return f"{self.gpu.label} unpartitioned"
        return self.gpu.label

    @property
    def usd_per_hour(self) -> float | None:
        """What this unit costs per hour it runs, USD/h; None with no price or no known size."""
        if self.usd_per_gpu_hour is None or self.weight is None:
            return None
        return self.usd_per_gpu_hour * self.weight

    @property
    def covered_s(self) -> float:
        """Seconds with data, s."""
        if self._device is not None:
            return self._device.gpu_hours * 3600
        return self._figures.gpu_hours * 3600 / self.weight if self.weight else 0.0

    @property
    def no_proc_s(self) -> float:
        """Seconds with no compute process, s."""
        if self._device is not None:
            return self._device.no_proc_h * 3600
        return self._figures.no_proc_h * 3600 / self.weight if self.weight else 0.0

    @property
    def avg_util(self) -> float | None:
        """Mean utilization over the seconds with a figure, %."""
        return (self._device or self._figures).avg_util


def usage_figures(u: DeviceUsage | None, weight: float, rate: float | None, offline_s: float) -> Figures:
    """A device's usage as figures: covered seconds split into states (docs/waste.md, "States"), weighted by
    its share of a GPU, and priced at `rate` USD per GPU-hour. Offline time costs nothing here (app/analyse/priced.py
    prices what paid capacity costs offline)."""
    h = weight / 3600
    if u is None:
        return Figures(offline_h=offline_s * h)
    _id, covered, known, util_sum, below, free, no_proc = u
    gpu_hours = covered * h
    idle_held_h = max(0.0, below - free) * h
    idle_h = max(0.0, free) * h
    known_h = known * h
    sum_h = util_sum * h
    active_h = max(0.0, known - below) * h
    unknown_h = max(0.0, covered - known) * h
    offline_h = offline_s * h
    no_proc_h = no_proc * h
    f = Figures(gpu_hours, active_h, idle_held_h, idle_h, unknown_h, offline_h, 0.0, no_proc_h, known_h, sum_h)
    if rate is None:
        f.unpriced_gpu_hours = gpu_hours
    else:
        f.cost = gpu_hours * rate
        f.idle_cost = idle_h * rate
        f.idle_held_cost = idle_held_h * rate
        f.unused_cost = max(0.0, known_h - sum_h / 100) * rate
    return f
