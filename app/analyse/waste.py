"""Cost and waste over a window: per unit of capacity (app/analyse/figures.py), grouped any way
(app/analyse/grouping.py), with totals. The pages, their htmx fragments, the report and the charts over time
(app/analyse/timeline.py, by the same rules) all read these same figures.

A slice whose size the agent could not read is worth an unknown share of its GPU: it adds no GPU-hours and no
money, only its hours as `unsized_slice_h`. A GPU whose layout is not known in full (`layout_known`) has no
unpartitioned time: what its known slices leave may be in a slice nobody could size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Event
from .figures import GPU, HOURS_PER_MONTH, SLICE, Figures, Unit, usage_figures
from .fleet import Fleet, GpuInfo, SliceInfo, layout_known
from .grouping import GroupRow, by_value, group_rows, instance_group, per_instance, summarise
from .holder_groups import HeldValues, held_values
from .holders import Part, held_usage, holder_columns, split_units
from .states import UNPARTITIONED, Thresholds
from .usage import DeviceUsage, hourly_split, window_usage
from .window import Window


def _free_figures(free_s: float, rate: float | None, offline_s: float) -> Figures:
    """Unpartitioned capacity of a MIG GPU: idle, with no process and 0% utilization, s."""
    h = free_s / 3600
    offline_h = offline_s / 3600
    if rate is None:
        return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, unpriced_gpu_hours=h)
    return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, h * rate, h * rate, 0.0, h * rate, h * rate)


def _unsized_unit(gpu: GpuInfo, sl: SliceInfo, u: DeviceUsage, rate: float | None) -> Unit:
    """A slice of unknown size: its hours count apart, never as GPU-hours, money or free capacity."""
    device = usage_figures(u, 1.0, None, 0.0)
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
            slice_units.append(Unit(SLICE, gpu, sl, weight, rate, usage_figures(found, weight, rate, 0.0)))
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
            units.append(Unit(GPU, gpu, None, 1.0, rate, usage_figures(passthrough, 1.0, rate, offline)))
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


@dataclass
class WasteAnalysis:
    window: Window
    thresholds: Thresholds
    units: list[Unit]
    totals: Figures
    fleet: Fleet

    by_instance: dict[int, GroupRow] = field(default_factory=dict)
    """Figures per instance (by its row id): the building block of every instance-level grouping."""
    parts: list[Part] | None = None
    """The units split among their holders: the building block of groupings by holder; None when the analysis
    was not asked for them."""
    values: HeldValues | None = None
    """What each value of a grouping by holder held per group of instances: the building block of that grouping
    alone or with groupings by something of the instance (grouping.by_value); None when not asked for."""

    def group(self, by: str) -> list[GroupRow]:
        """Rows per group, largest waste first; KeyError for an unknown group-by name."""
        return self.group_by([by])

    def group_by(self, names: Sequence[str]) -> list[GroupRow]:
        """Rows per combination of the named groupings (keys and labels joined by " / "), largest waste
        first. KeyError for an unknown name; ValueError for a grouping by holder the analysis was not made for."""
        return group_rows(self.by_instance, self.units, names, self.parts, self.values)

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


def analyse_waste(
    session: Session,
    fleet: Fleet,
    window: Window,
    thresholds: Thresholds,
    *,
    by_holder: bool = False,
    holder_groups: Sequence[str] | None = None,
) -> WasteAnalysis:
    """Figures for every unit of `fleet` over `window`, from the rollups. With `by_holder`, also what groupings by
    holder need: for `holder_groups` (the names a report or page will group by) with one grouping by holder and
    otherwise only groupings by something of the instance, what each value held per group of instances (`values`,
    from the holder groups); else the units split among their holders (`parts`, from the holder rollups), a part
    per value of what `holder_groups` read, or, with None, per process."""
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
    parts = None
    values = None
    single = None if holder_groups is None else by_value(holder_groups)
    if by_holder and holder_groups is not None and single is not None:
        groups = [
            (pk, inst.price.usd_per_gpu_hour, instance_group(holder_groups, inst))
            for pk, inst in fleet.instances.items()
        ]
        sums = held_values(session, window, single, idle_util_pct=thresholds.idle_util_pct, instances=groups)
        values = HeldValues(single, tuple(holder_groups), sums)
    elif by_holder:
        columns = None if holder_groups is None else holder_columns(holder_groups)
        held, holders = held_usage(
            session, window, idle_util_pct=thresholds.idle_util_pct, device_ids=ids, columns=columns
        )
        parts = split_units(units, held, holders)
    return WasteAnalysis(
        window=window,
        thresholds=thresholds,
        units=units,
        totals=summarise(instances.values()),
        fleet=fleet,
        by_instance=instances,
        parts=parts,
        values=values,
    )
