"""MIG: each MIG-mode GPU with its live slices and free capacity, and the slices that are under-used.

What the free capacity costs per hour is at its instance's price now (app/analyse/price_now.py); what a slice cost
over the window is at the prices in force hour by hour (app/analyse/priced.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .figures import SLICE, Unit
from .fleet import Fleet, GpuInfo, InstanceInfo, SliceInfo, free_slices
from .price_now import PriceNow, price_of
from .states import OFFLINE, UNPARTITIONED
from .waste import WasteAnalysis

NO_PROCESS_SHARE = 0.99
"""A slice with no process for this share of its hours counts as holding nothing."""


@dataclass
class SlotView:
    """A live slice on the layout: its state now and its figures over the window."""

    slice: SliceInfo
    unit: Unit | None
    state: str
    underused: bool
    reason: str
    """Why it is under-used, empty if it is not."""


@dataclass
class MigGpuView:
    gpu: GpuInfo
    slots: list[SlotView]
    free_slices: int | None
    """Compute slices (of 7) in no GPU instance now; None when the layout is not known in full."""
    capacity: Unit | None
    """The GPU's unpartitioned capacity over the window (and its offline time)."""
    offline: bool
    price: PriceNow
    """Its instance's price now."""
    history: list[Unit] = field(default_factory=list)
    """Slices retired during the window."""

    @property
    def free_unknown(self) -> bool:
        """Whether the GPU's free capacity now is unknown (a MIG device the agent could not size)."""
        return self.free_slices is None

    @property
    def free_usd_per_hour(self) -> float | None:
        """What its free capacity costs per hour at the price now, USD/h; None without a price or a known layout."""
        rate = self.price.usd_per_gpu_hour
        return None if rate is None or self.free_slices is None else rate * self.free_slices / 7


def unit_priced(unit: Unit) -> bool:
    """Whether any of the unit's money over the window is known: it has a price of its own, or a price piece
    priced some of it."""
    return unit.usd_per_gpu_hour is not None or bool(unit.sources)


def underuse_reason(unit: Unit, underused_util_pct: float) -> str:
    """Why a slice counts as under-used over the window, or "" if it does not."""
    if unit.covered_s <= 0:
        return ""
    if unit.no_proc_s >= NO_PROCESS_SHARE * unit.covered_s:
        return "no process all window"
    avg = unit.avg_util
    if avg is not None and avg < underused_util_pct:
        return f"average utilization {avg:.1f}% < {underused_util_pct:g}%"
    return ""


def mig_instances(fleet: Fleet) -> list[InstanceInfo]:
    """The instances with a GPU that `mig_gpus` lists: in MIG mode now, or with slices."""
    out = {g.instance.pk: g.instance for g in fleet.gpus.values() if g.mig_mode or fleet.slices_by_gpu.get(g.pk)}
    return list(out.values())


def mig_gpus(
    analysis: WasteAnalysis, states: dict[int, str], prices: Mapping[int, PriceNow] | None = None
) -> list[MigGpuView]:
    """Every GPU in MIG mode now, or with slices in the window, ordered by instance and index; `prices` are the
    instances' prices now by pk (app/analyse/price_now.py, `prices_now`), their own prices where it has none."""
    fleet = analysis.fleet
    slice_units = {u.slice.pk: u for u in analysis.units if u.kind == SLICE and u.slice is not None}
    capacity = {u.gpu.pk: u for u in analysis.units if u.kind == UNPARTITIONED}
    limit = analysis.thresholds.underused_util_pct
    views = []
    for gpu in fleet.gpus.values():
        slices = fleet.slices_by_gpu.get(gpu.pk, [])
        if not gpu.mig_mode and not slices:
            continue
        offline = states.get(gpu.pk, OFFLINE) == OFFLINE
        live = fleet.live_slices(gpu.pk) if gpu.mig_mode else []
        slots = []
        for sl in live:
            unit = slice_units.get(sl.pk)
            reason = underuse_reason(unit, limit) if unit is not None else ""
            state = OFFLINE if offline else states.get(sl.pk, OFFLINE)
            slots.append(SlotView(sl, unit, state, bool(reason), reason))
        free = free_slices(gpu, live)
        history = [slice_units[s.pk] for s in slices if s.retired_at is not None and s.pk in slice_units]
        price = price_of(gpu.instance, prices)
        views.append(MigGpuView(gpu, slots, free, capacity.get(gpu.pk), offline, price, history))
    views.sort(key=lambda v: (v.gpu.instance.name, v.gpu.gpu_index))
    return views


@dataclass(frozen=True)
class UnderusedSlice:
    slot: SlotView
    gpu: GpuInfo
    price: PriceNow
    """Its instance's price now."""

    @property
    def unit(self) -> Unit:
        assert self.slot.unit is not None
        return self.slot.unit

    @property
    def no_process_cost(self) -> float | None:
        """Cost of the slice's hours with no process at all, USD, at its mean price over the window
        (`Unit.mean_usd_per_gpu_hour`); priced even where utilization is unknown, since a slice with no process
        cannot be working. None without a price or a known size."""
        rate = self.unit.mean_usd_per_gpu_hour
        return None if rate is None or not self.unit.sized else rate * self.unit.figures().no_proc_h

    @property
    def usd_per_hour(self) -> float | None:
        """What the slice costs per hour at the price now, USD/h; None without a price or a known size."""
        rate, weight = self.price.usd_per_gpu_hour, self.unit.weight
        return None if rate is None or weight is None else rate * weight


def underused_slices(views: list[MigGpuView]) -> list[UnderusedSlice]:
    out = [UnderusedSlice(slot, v.gpu, v.price) for v in views for slot in v.slots if slot.underused and slot.unit]
    out.sort(key=lambda s: -(s.unit.figures().cost))
    return out


def unpartitioned(views: list[MigGpuView]) -> list[MigGpuView]:
    """MIG GPUs with free capacity now, most expensive first; a GPU whose free capacity is unknown is not one."""
    out = [v for v in views if v.free_slices is not None and v.free_slices > 0 and not v.offline]
    out.sort(key=lambda v: -(v.free_usd_per_hour or 0.0))
    return out
