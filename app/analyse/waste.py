"""Cost and waste over a window: per unit of capacity, grouped any way, with totals.

A unit is a passthrough GPU, a MIG slice (worth compute slices / 7 of its GPU), or the unpartitioned
capacity of a MIG-mode GPU. Units carry seconds per state; money is seconds x the unit's price. The pages,
their htmx fragments and the report all read these same figures.

A slice whose size the agent could not read is worth an unknown share of its GPU: it adds no GPU-hours and no
money, only its hours as `unsized_slice_h`. A GPU whose layout is not known in full (`layout_known`) has no
unpartitioned time: what its known slices leave may be in a slice nobody could size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Event
from .fleet import Fleet, GpuInfo, InstanceInfo, SliceInfo, layout_known
from .states import UNPARTITIONED, Thresholds
from .usage import DeviceUsage, hourly_split, window_usage
from .window import Window

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
    __slots__ = ("_device", "_figures", "gpu", "kind", "slice", "usd_per_gpu_hour", "weight")

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

    def figures(self) -> Figures:
        """What this unit adds to its groups and to the totals."""
        return self._figures

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


def _figures(u: DeviceUsage | None, weight: float, rate: float | None, offline_s: float) -> Figures:
    """A device's usage as figures: covered seconds split into states (docs/waste.md, "States"), weighted by
    its share of a GPU, and priced at `rate` USD per GPU-hour."""
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


def _free_figures(free_s: float, rate: float | None, offline_s: float) -> Figures:
    """Unpartitioned capacity of a MIG GPU: idle, with no process and 0% utilization, s."""
    h = free_s / 3600
    offline_h = offline_s / 3600
    if rate is None:
        return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, unpriced_gpu_hours=h)
    return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, h * rate, h * rate, 0.0, h * rate, h * rate)


def _unsized_unit(gpu: GpuInfo, sl: SliceInfo, u: DeviceUsage, rate: float | None) -> Unit:
    """A slice of unknown size: its hours count apart, never as GPU-hours, money or free capacity."""
    device = _figures(u, 1.0, None, 0.0)
    return Unit(SLICE, gpu, sl, None, rate, Figures(unsized_slice_h=device.gpu_hours), device)


def _expected_s(gpu: GpuInfo, window: Window) -> float:
    """Seconds of the window in which this GPU should have sent data."""
    start = max(window.start, gpu.first_seen)
    end = min(window.end, window.now, gpu.instance.tracked_until)
    return max(0.0, (end - start).total_seconds())


def build_units(
    fleet: Fleet,
    usage: dict[int, DeviceUsage],
    window: Window,
    split: dict[int, tuple[DeviceUsage, DeviceUsage]] | None = None,
) -> list[Unit]:
    """Units of the fleet from per-device usage.

    A GPU's time is MIG time when it is in MIG mode now or has slices in the window; `split` gives the MIG
    and passthrough parts of GPUs whose mode changed in the window. In MIG time the slices carry the use,
    and what they leave (GPU time minus each slice's time x its share) is unpartitioned capacity. Offline
    time is the GPU's expected time minus its covered time.

    Where the GPU's layout is not known in full (it is incomplete now, or a slice of the window has no size),
    its MIG time has no unpartitioned part: it counts as `free_unknown_h` instead.
    """
    split = split or {}
    units: list[Unit] = []
    slices_by_gpu = fleet.slices_by_gpu
    for gpu in fleet.gpus.values():
        rate = gpu.instance.price.usd_per_gpu_hour
        slices = slices_by_gpu.get(gpu.pk, ())
        slice_units = []
        sliced = 0.0
        for sl in slices:
            found = usage.get(sl.pk)
            if found is None:
                continue
            if sl.compute_slices is None:
                slice_units.append(_unsized_unit(gpu, sl, found, rate))
                continue
            weight = sl.compute_slices / 7
            slice_units.append(Unit(SLICE, gpu, sl, weight, rate, _figures(found, weight, rate, 0.0)))
            sliced += found.covered_s * weight
        mig_mode = gpu.mig_mode or bool(slice_units)
        own = usage.get(gpu.pk)
        if gpu.pk in split:
            mig_part: DeviceUsage | None
            mig_part, passthrough = split[gpu.pk]
        elif mig_mode:
            mig_part, passthrough = own, None
        else:
            mig_part, passthrough = None, own
        covered = own.covered_s if own is not None else 0.0
        offline = max(0.0, _expected_s(gpu, window) - covered)
        if (passthrough is not None and passthrough.covered_s > 0) or not mig_mode:
            units.append(Unit(GPU, gpu, None, 1.0, rate, _figures(passthrough, 1.0, rate, offline)))
            offline = 0.0
        if mig_mode:
            mig_s = mig_part.covered_s if mig_part is not None else 0.0
            if layout_known(gpu, slices):
                free_figures = _free_figures(max(0.0, mig_s - sliced), rate, offline)
            else:
                free_figures = _free_figures(0.0, rate, offline)
                free_figures.free_unknown_h = mig_s / 3600
            units.append(Unit(UNPARTITIONED, gpu, None, 1.0, rate, free_figures))
        units.extend(slice_units)
    return units


InstanceKey = Callable[[InstanceInfo], tuple[str, str]]
UnitKey = Callable[[Unit], tuple[str, str]]


def _tag_key(tag: str) -> InstanceKey:
    def key(i: InstanceInfo) -> tuple[str, str]:
        value = i.tags.get(tag)
        return (value, value) if value is not None else ("", f"(no {tag} tag)")

    return key


def _field_key(name: str, missing: str) -> InstanceKey:
    def key(i: InstanceInfo) -> tuple[str, str]:
        value = getattr(i, name)
        return (value, value) if value else ("", missing)

    return key


def _instance_key(i: InstanceInfo) -> tuple[str, str]:
    return i.instance_id, i.name


def _gpu_key(u: Unit) -> tuple[str, str]:
    return str(u.gpu.pk), u.gpu.label


def _slice_key(u: Unit) -> tuple[str, str]:
    return u.key, u.label


def _model_key(u: Unit) -> tuple[str, str]:
    model = u.instance.gpu_model or u.gpu.name
    return model, model


# Groupings by something of the instance add up per-instance figures; the others go unit by unit.
INSTANCE_GROUPS: dict[str, InstanceKey] = {
    "instance": _instance_key,
    "instance_type": _field_key("instance_type", "(no instance type)"),
    "region": _field_key("region", "(no region)"),
    "availability_zone": _field_key("availability_zone", "(no zone)"),
    "lifecycle": _field_key("lifecycle", "(no lifecycle)"),
}
UNIT_GROUPS: dict[str, UnitKey] = {"gpu_model": _model_key, "gpu": _gpu_key, "slice": _slice_key}
GROUPS = (*INSTANCE_GROUPS, *UNIT_GROUPS)
"""Every group-by name, besides `tag:<key>`."""


def is_group_name(name: str) -> bool:
    return name in GROUPS or (name.startswith("tag:") and len(name) > 4)


def _instance_level(name: str) -> InstanceKey | None:
    """The instance key of a grouping by something of the instance; None for a unit-level one."""
    if name.startswith("tag:") and len(name) > 4:
        return _tag_key(name[4:])
    if name in UNIT_GROUPS:
        return None
    return INSTANCE_GROUPS[name]


def _unit_level(name: str) -> UnitKey:
    if name in UNIT_GROUPS:
        return UNIT_GROUPS[name]
    key = _instance_level(name)
    assert key is not None
    return lambda u: key(u.instance)


@dataclass
class GroupRow:
    key: str
    label: str
    figures: Figures = field(default_factory=Figures)
    units: list[Unit] = field(default_factory=list)
    gpus: set[int] = field(default_factory=set)
    prices: set[str] = field(default_factory=set)
    """Sources of the prices of this row's units."""
    parts: list[tuple[str, str]] = field(default_factory=list)
    """(key, label) per grouping, in the order asked for."""

    @property
    def sample(self) -> Unit:
        return self.units[0]


@dataclass
class WasteAnalysis:
    window: Window
    thresholds: Thresholds
    units: list[Unit]
    totals: Figures
    fleet: Fleet

    by_instance: dict[int, GroupRow] = field(default_factory=dict)
    """Figures per instance (by its row id): the building block of every instance-level grouping."""

    def group(self, by: str) -> list[GroupRow]:
        """Rows per group, largest waste first; KeyError for an unknown group-by name."""
        return self.group_by([by])

    def group_by(self, names: Sequence[str]) -> list[GroupRow]:
        """Rows per combination of the named groupings (keys and labels joined by " / "), largest waste
        first. Groupings by something of the instance add up per-instance figures; the others go unit by
        unit. KeyError for an unknown name."""
        instance_keys = [_instance_level(n) for n in names]
        rows: dict[str, GroupRow] = {}

        def row_for(parts: list[tuple[str, str]]) -> GroupRow:
            key = " / ".join(k for k, _l in parts)
            row = rows.get(key)
            if row is None:
                row = rows[key] = GroupRow(key, " / ".join(label for _k, label in parts))
                row.parts = parts
            return row

        if all(k is not None for k in instance_keys):
            for inst_row in self.by_instance.values():
                inst = inst_row.sample.instance
                row = row_for([k(inst) for k in instance_keys if k is not None])
                row.figures.add(inst_row.figures)
                row.units.extend(inst_row.units)
                row.gpus |= inst_row.gpus
                row.prices |= inst_row.prices
        else:
            unit_keys = [_unit_level(n) for n in names]
            for unit in self.units:
                row = row_for([k(unit) for k in unit_keys])
                row.figures.add(unit.figures())
                row.units.append(unit)
                row.gpus.add(unit.gpu.pk)
                row.prices.add(unit.instance.price.source)
        return sorted(rows.values(), key=lambda r: (-r.figures.waste, -r.figures.cost, r.label))

    def monthly(self, usd: float) -> float:
        """USD over the window scaled to a 730-hour month at the same rate."""
        hours = self.window.hours
        return usd / hours * HOURS_PER_MONTH if hours > 0 else 0.0

    @property
    def projected_monthly_waste(self) -> float:
        return self.monthly(self.totals.waste)

    @property
    def has_data(self) -> bool:
        return self.totals.all_hours > 0


def per_instance(units: Iterable[Unit]) -> dict[int, GroupRow]:
    rows: dict[int, GroupRow] = {}
    for unit in units:
        inst = unit.instance
        row = rows.get(inst.pk)
        if row is None:
            row = rows[inst.pk] = GroupRow(inst.instance_id, inst.name)
            row.prices.add(inst.price.source)
        row.figures.add(unit.figures())
        row.units.append(unit)
        row.gpus.add(unit.gpu.pk)
    return rows


def summarise(rows: Iterable[GroupRow]) -> Figures:
    total = Figures()
    for row in rows:
        total.add(row.figures)
    return total


def analyse_waste(session: Session, fleet: Fleet, window: Window, thresholds: Thresholds) -> WasteAnalysis:
    """Figures for every unit of `fleet` over `window`, from the rollups."""
    ids: list[int] | None = fleet.device_ids()
    if ids is not None and len(ids) > 500:
        # Reading every device and dropping what the filters exclude is cheaper than a long id list.
        ids = None
    usage = window_usage(session, window, idle_util_pct=thresholds.idle_util_pct, device_ids=ids)
    changes: dict[int, list[tuple[datetime, bool]]] = {}
    for device_id, at, details in session.execute(
        select(Event.device_id, Event.ts, Event.details)
        .where(Event.kind == "mig_mode_changed", Event.ts > window.start, Event.ts < window.end)
        .order_by(Event.ts)
    ):
        if device_id in fleet.gpus:
            changes.setdefault(device_id, []).append((at, bool(details.get("mig_mode"))))
    split = hourly_split(session, window, list(changes), idle_util_pct=thresholds.idle_util_pct, mode_at=changes)
    units = build_units(fleet, usage, window, split)
    instances = per_instance(units)
    return WasteAnalysis(
        window=window,
        thresholds=thresholds,
        units=units,
        totals=summarise(instances.values()),
        fleet=fleet,
        by_instance=instances,
    )
