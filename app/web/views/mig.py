"""The MIG page: every GPU in MIG mode with its layout now, the slices under-used over the window and the
capacity that is in no slice.

The layout drawing is not part of the view: the view gives each GPU's blocks (`MigSlotView`, the fields of
`app.web.charts.MigSlot`) and the template draws them with `mig_layout_svg`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...analyse.fleet import GpuInfo
from ...analyse.mig import (
    MigGpuView,
    UnderusedSlice,
    mig_gpus,
    mig_instances,
    underused_slices,
    unit_priced,
    unpartitioned,
)
from ...analyse.now import current_state, latest_samples
from ...analyse.price_now import PriceNow, prices_now
from ...analyse.states import OFFLINE, UNKNOWN, UNPARTITIONED
from ...analyse.waste import analyse_waste
from ..charts import MigSlot
from .common import FiguresView, FilterView, InstanceRef, PagerView, ThresholdView, WindowView, paginate
from .holders import HolderView, holders_by_device
from .inputs import PageInputs

TOP_MIG = 50
"""Rows of the under-used and unpartitioned tables: the most expensive ones."""
COLUMNS = 7
"""Compute slices of a MIG GPU."""


@dataclass(frozen=True)
class GpuRef:
    """A GPU as the MIG page names it."""

    instance: InstanceRef
    gpu_index: int
    uuid: str
    name: str
    """The model as NVML names it."""

    @classmethod
    def of(cls, gpu: GpuInfo, price: PriceNow) -> GpuRef:
        """The GPU, its instance with `price` (its price now)."""
        return cls(InstanceRef.of(gpu.instance, price), gpu.gpu_index, gpu.uuid, gpu.name)


@dataclass(frozen=True)
class MigSlotView:
    """A block of a layout drawing: a slice, or compute slices in no slice. The fields of
    `app.web.charts.MigSlot`, which the template's `mig_layout_svg` reads."""

    start: int
    """First compute-slice column, 0-6."""
    size: int
    """Compute slices it spans, 1-7."""
    label: str
    state: str
    """active, idle-held, idle, unknown, offline; unpartitioned for free capacity."""
    detail: str
    """Tooltip text."""


@dataclass(frozen=True)
class MigSliceView:
    """A live slice now, with its figures over the window."""

    profile: str
    """The profile (`3g.20gb`), or "unknown profile" where the agent could not read it."""
    gpu_instance_id: int
    compute_slices: int | None
    """Its size, compute slices of 7; None when unknown."""
    state: str
    """Its state now."""
    avg_util_pct: float | None
    """Mean utilization over the window, %; None when it reports none (A100 slices)."""
    underuse_reason: str
    """Why it is under-used over the window; empty when it is not."""
    holders: list[HolderView]
    """Who holds it now."""


@dataclass(frozen=True)
class MigLayoutView:
    """A GPU in MIG mode: its slices now and the capacity in none."""

    gpu: GpuRef
    offline: bool
    free_slices: int | None
    """Compute slices (of 7) in no slice now; None when the layout is not known in full."""
    free_unknown: bool
    """The free capacity is unknown (a MIG device the agent could not size)."""
    free_usd_per_hour: float | None
    """What the free capacity costs at the price now, USD/h; None without a price or a known layout."""
    slices: list[MigSliceView]
    slots: list[MigSlotView]
    """The layout drawing's blocks: slices side by side in GPU-instance order, then the free capacity."""
    title: str
    """The drawing's title."""


@dataclass(frozen=True)
class UnderusedRow:
    """A slice under-used over the window."""

    gpu: GpuRef
    profile: str
    gpu_instance_id: int
    sized: bool
    """False for a slice of unknown size: its cost is unknown."""
    state: str
    """Its state now."""
    reason: str
    avg_util_pct: float | None
    """Mean utilization over the window, %."""
    no_process_pct: float
    """Share of its covered time with no compute process, %."""
    cost_usd: float | None
    """Its cost over the window at the prices in force hour by hour, USD; None without a price or a known size."""
    no_process_cost_usd: float | None
    """Cost of its time with no process, USD, at its mean price over the window; None without a price or a known
    size."""
    usd_per_hour: float | None
    """What it costs per hour at the price now, USD/h."""
    holders: list[HolderView]
    """Who holds it now."""


@dataclass(frozen=True)
class FreeRow:
    """A GPU with compute slices in no slice now."""

    gpu: GpuRef
    free_slices: int
    """Compute slices (of 7) in no slice."""
    usd_per_hour: float | None
    """What they cost at the price now, USD/h."""
    window_cost_usd: float | None
    """Cost of the GPU's unpartitioned capacity over the window, USD; None without a price."""


@dataclass(frozen=True)
class MigView:
    window: WindowView
    filters: FilterView
    thresholds: ThresholdView
    no_agents: bool
    """Nothing has reported to this server yet."""
    mig_gpus: int
    """GPUs in MIG mode, or with slices in the window, matching the filters (every page)."""
    gpus: list[MigLayoutView]
    """The GPUs of this page of layouts."""
    pager: PagerView
    underused_count: int
    """Under-used slices in all."""
    underused: list[UnderusedRow]
    """The most expensive under-used slices (up to 50)."""
    free_count: int
    """Online GPUs with known free capacity now."""
    free: list[FreeRow]
    """The most expensive of them (up to 50)."""
    free_unknown_count: int
    """Online GPUs whose free capacity is unknown (not listed, not priced)."""
    free_usd_per_hour: float
    """What the free capacity now costs at the price now, USD/h (priced GPUs)."""
    unpartitioned_cost_usd: float
    """Cost of unpartitioned capacity over the window, USD."""
    totals: FiguresView
    """Figures of every unit matching the filters over the window (for the unknown-size note)."""


def layout_slots(v: MigGpuView) -> list[MigSlot]:
    """Slices side by side in GPU-instance order, then the free capacity: NVML placement is not reported, so
    the columns show shares of the GPU, not physical slice positions. A slice of unknown size is one hatched
    column marked "?"; a GPU whose free capacity is unknown gets no free block."""
    slots: list[MigSlot] = []
    column = 0
    for slot in v.slots:
        sl = slot.slice
        size = min(sl.compute_slices or 1, COLUMNS - column)
        if size <= 0:
            break
        util = slot.unit.avg_util if slot.unit is not None else None
        name = f"{sl.profile_label} (GI {sl.gpu_instance_id})"
        if sl.compute_slices is None:
            name += ", size unknown"
        detail = f"{name}: {slot.state} now"
        detail += f", {util:.1f}% average" if util is not None else ", utilization unknown"
        if slot.reason:
            detail += f"; under-used: {slot.reason}"
        if sl.compute_slices is None:
            slots.append(MigSlot(column, size, "?", UNKNOWN, detail))
        else:
            slots.append(MigSlot(column, size, sl.profile, slot.state, detail))
        column += size
    if v.free_slices is None:
        return slots
    free = min(v.free_slices, COLUMNS - column)
    if free > 0:
        state = OFFLINE if v.offline else UNPARTITIONED
        slots.append(MigSlot(column, free, f"{free} free", state, f"{free} of 7 compute slices in no slice"))
    return slots


def _layout(v: MigGpuView, holders: dict[int, list[HolderView]]) -> MigLayoutView:
    # Built as MigSlot first: it checks that every block fits the 7 columns.
    slots = [MigSlotView(s.start, s.size, s.label, s.state, s.detail) for s in layout_slots(v)]
    slices = [
        MigSliceView(
            s.slice.profile_label,
            s.slice.gpu_instance_id,
            s.slice.compute_slices,
            s.state,
            s.unit.avg_util if s.unit is not None else None,
            s.reason,
            holders.get(s.slice.pk, []),
        )
        for s in v.slots
    ]
    return MigLayoutView(
        gpu=GpuRef.of(v.gpu, v.price),
        offline=v.offline,
        free_slices=v.free_slices,
        free_unknown=v.free_unknown,
        free_usd_per_hour=v.free_usd_per_hour,
        slices=slices,
        slots=slots,
        title="MIG layout, free capacity unknown" if v.free_unknown else "MIG layout",
    )


def _underused(s: UnderusedSlice, holders: dict[int, list[HolderView]]) -> UnderusedRow:
    unit = s.unit
    priced = unit.sized and unit_priced(unit)
    return UnderusedRow(
        gpu=GpuRef.of(s.gpu, s.price),
        profile=s.slot.slice.profile_label,
        gpu_instance_id=s.slot.slice.gpu_instance_id,
        sized=unit.sized,
        state=s.slot.state,
        reason=s.slot.reason,
        avg_util_pct=unit.avg_util,
        no_process_pct=unit.no_proc_s / unit.covered_s * 100 if unit.covered_s > 0 else 0.0,
        cost_usd=unit.figures().cost if priced else None,
        no_process_cost_usd=s.no_process_cost,
        usd_per_hour=s.usd_per_hour,
        holders=holders.get(s.slot.slice.pk, []),
    )


def _free(v: MigGpuView) -> FreeRow:
    assert v.free_slices is not None  # unpartitioned() lists only GPUs whose free capacity is known
    priced = v.capacity is not None and unit_priced(v.capacity)
    cost = v.capacity.figures().unpartitioned_cost if v.capacity is not None and priced else None
    return FreeRow(GpuRef.of(v.gpu, v.price), v.free_slices, v.free_usd_per_hour, cost)


def build_mig(p: PageInputs) -> MigView:
    q = p.query
    fleet = p.fleet()
    analysis = analyse_waste(p.session, fleet, q.window, p.thresholds)
    latest = latest_samples(p.session, now=p.now, thresholds=p.thresholds)
    gpus = mig_gpus(analysis, current_state(fleet, latest), prices_now(p.session, mig_instances(fleet), p.now))
    free = unpartitioned(gpus)
    underused = underused_slices(gpus)
    shown, pager = paginate(gpus, q.page)
    top = underused[:TOP_MIG]
    slice_ids = {s.slice.pk for v in shown for s in v.slots} | {s.slot.slice.pk for s in top}
    holders = holders_by_device(p.session, sorted(slice_ids))
    return MigView(
        window=WindowView.of(q.window),
        filters=FilterView.of(q.filters),
        thresholds=ThresholdView.of(p.thresholds),
        no_agents=fleet.total_instances == 0,
        mig_gpus=len(gpus),
        gpus=[_layout(v, holders) for v in shown],
        pager=pager,
        underused_count=len(underused),
        underused=[_underused(s, holders) for s in top],
        free_count=len(free),
        free=[_free(v) for v in free[:TOP_MIG]],
        free_unknown_count=sum(1 for v in gpus if v.free_unknown and not v.offline),
        free_usd_per_hour=sum(v.free_usd_per_hour or 0.0 for v in free),
        unpartitioned_cost_usd=analysis.totals.unpartitioned_cost,
        totals=FiguresView.of(analysis.totals),
    )
