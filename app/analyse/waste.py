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
from .figures import GPU, HOURS_PER_MONTH, SLICE, Figures, Unit
from .fleet import Fleet, GpuInfo, SliceInfo, layout_known
from .grouping import GroupRow, group_rows, per_instance, summarise
from .states import UNPARTITIONED, Thresholds
from .usage import DeviceUsage, hourly_split, window_usage
from .window import Window


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
        first. KeyError for an unknown name."""
        return group_rows(self.by_instance, self.units, names)

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
