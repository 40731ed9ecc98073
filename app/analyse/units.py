"""Units of capacity from per-device usage (docs/waste.md, "States"): a passthrough GPU, a MIG slice, and the
unpartitioned capacity of a MIG-mode GPU, each with its figures over a window at a price.

A slice whose size the agent could not read is worth an unknown share of its GPU: it adds no GPU-hours and no
money, only its hours as `unsized_slice_h`. A GPU whose layout is not known in full (`layout_known`) has no
unpartitioned time: what its known slices leave may be in a slice nobody could size.
"""

from __future__ import annotations

from collections.abc import Mapping

from .figures import GPU, SLICE, Figures, Unit, usage_figures
from .fleet import Fleet, GpuInfo, SliceInfo, layout_known
from .states import UNPARTITIONED
from .usage import DeviceUsage
from .window import Window


def _free_figures(free_s: float, rate: float | None, offline_s: float) -> Figures:
    """Unpartitioned capacity of a MIG GPU: idle, with no process and 0% utilization, s. A MIG GPU's offline
    time is counted here."""
    h = free_s / 3600
    offline_h = offline_s / 3600
    if rate is None:
        return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, unpriced_gpu_hours=h)
    usd = h * rate
    return Figures(h, 0.0, 0.0, h, 0.0, offline_h, h, h, h, 0.0, usd, usd, 0.0, usd, usd)


def _unsized_unit(gpu: GpuInfo, sl: SliceInfo, u: DeviceUsage, rate: float | None) -> Unit:
    """A slice of unknown size: its hours count apart, never as GPU-hours, money or free capacity."""
    device = usage_figures(u, 1.0, None, 0.0)
    return Unit(SLICE, gpu, sl, None, rate, Figures(unsized_slice_h=device.gpu_hours), device)


def expected_s(gpu: GpuInfo, window: Window) -> float:
    """Seconds of the window in which this GPU should have sent data."""
    start = max(window.start, gpu.first_seen)
    end = min(window.end, window.now, gpu.instance.tracked_until)
    return max(0.0, (end - start).total_seconds())


def build_units(
    fleet: Fleet,
    usage: Mapping[int, DeviceUsage],
    window: Window,
    split: dict[int, tuple[DeviceUsage, DeviceUsage]] | None = None,
    *,
    expected: Mapping[int, float] | None = None,
) -> list[Unit]:
    """Units of the fleet from per-device usage.

    A GPU's time is MIG time when it is in MIG mode now or has slices in the window; `split` gives the MIG
    and passthrough parts of GPUs whose mode changed in the window. In MIG time the slices carry the use,
    and what they leave (GPU time minus each slice's time x its share) is unpartitioned capacity. Offline
    time is the GPU's expected time minus its covered time.

    Where the GPU's layout is not known in full (it is incomplete now, or a slice of the window has no size),
    its MIG time has no unpartitioned part: it counts as `free_unknown_h` instead.

    `expected` gives GPUs (by pk) other expected seconds: in paid capacity a GPU is expected even after its instance
    was taken for gone (app/analyse/priced.py, which also prices that time).
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
        due = expected[gpu.pk] if expected is not None and gpu.pk in expected else expected_s(gpu, window)
        offline = max(0.0, due - covered)
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
