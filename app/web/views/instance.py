"""One instance: who it is, its figures over the window, every GPU and MIG slice now, all its devices on one chart
per metric, and a state strip per device."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ...analyse.device_states import hourly_states
from ...analyse.figures import GPU, SLICE, Unit
from ...analyse.fleet import GpuInfo, SliceInfo, free_slices
from ...analyse.now import Latest, current_state, latest_samples
from ...analyse.price_now import prices_now
from ...analyse.series import DevicePoints, device_series, series_step
from ...analyse.waste import analyse_waste
from ...sources import SOURCE_NAMES
from ..delivery import Delivery, delivery
from ..privileges import GrantNote, grant_notes
from .common import FiguresView, FilterView, InstanceRef, WindowView
from .holders import HeldOverWindow, held_over_window
from .inputs import PageInputs


@dataclass(frozen=True)
class InstanceDetail:
    ref: InstanceRef
    hostname: str | None
    gpu_model: str | None
    agent_version: str | None
    interval_s: float | None
    """The agent's collection interval, s."""
    agent_errors: dict[str, int]
    """NVML errors the agent reported, by call: count."""


@dataclass(frozen=True)
class DeviceNow:
    """A GPU or slice now and over the window."""

    key: str
    """`gpu-<index>` or `gpu-<index>-gi<id>`: names its series, strip and table row."""
    label: str
    state: str
    """Now."""
    util: float | None
    """Now, %."""
    mem_used_mib: float | None
    power_w: float | None
    util_source: str | None
    util_reason: str | None
    """Why utilization is missing or approximate, from the agent."""
    avg_util: float | None
    """Over the window, %."""


@dataclass(frozen=True)
class SliceView:
    now: DeviceNow
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    size_known: bool


@dataclass(frozen=True)
class GpuView:
    index: int
    name: str
    uuid: str
    memory_total_mib: int | None
    mig_mode: bool
    free_slices: int | None
    """Compute slices in no slice, of 7; None when the layout is not known in full."""
    now: DeviceNow
    slices: list[SliceView]
    grants: list[GrantNote]
    """Figures NVML refused at the agent's privilege, and what to grant."""
    holders: list[HeldOverWindow] = field(default_factory=list)
    """The processes that held the GPU or its slices over the window, device by device."""


@dataclass(frozen=True)
class DeviceSeries:
    key: str
    label: str
    is_gpu: bool
    """Power is a GPU's only: slices have no power line."""
    points: DevicePoints
    """Power is None throughout for a slice."""


@dataclass(frozen=True)
class StripSpan:
    start: datetime
    end: datetime
    state: str


@dataclass(frozen=True)
class DeviceStrip:
    key: str
    label: str
    spans: list[StripSpan]
    """Hour by hour, runs of one state merged; the state is the one that held most of each hour."""


@dataclass(frozen=True)
class InstanceView:
    window: WindowView
    filters: FilterView
    instance_id: str
    missing: bool
    """No agent has reported an instance with this id."""
    no_agents: bool
    instance: InstanceDetail | None = None
    figures: FiguresView | None = None
    priced: bool = False
    delivery: Delivery | None = None
    gpus: list[GpuView] = field(default_factory=list)
    step_s: int = 0
    """Spacing of the chart points, s: raw samples, 5-minute or hourly averages."""
    memory_max_mib: int | None = None
    """Largest GPU memory of the instance, MiB (the memory chart's scale)."""
    series: list[DeviceSeries] = field(default_factory=list)
    strips: list[DeviceStrip] = field(default_factory=list)


def _now(
    key: str, label: str, state: str | None, latest: Latest | None, unit: Unit | None, reason: str | None
) -> DeviceNow:
    return DeviceNow(
        key,
        label,
        state or "offline",
        latest.util if latest else None,
        float(latest.mem_used_mib) if latest and latest.mem_used_mib is not None else None,
        float(latest.power_w) if latest and latest.power_w is not None else None,
        SOURCE_NAMES.get(latest.util_source) if latest else None,
        reason,
        unit.avg_util if unit else None,
    )


def _slice_key(gpu: GpuInfo, sl: SliceInfo) -> str:
    return f"gpu-{gpu.gpu_index}-gi{sl.gpu_instance_id}"


def _slice_label(gpu: GpuInfo, sl: SliceInfo) -> str:
    return f"GPU {gpu.gpu_index} {sl.profile_label} GI {sl.gpu_instance_id}"


def build_instance(p: PageInputs, instance_id: str) -> InstanceView:
    q, t, session = p.query.scoped(instance_id), p.thresholds, p.session
    window = q.window
    fleet = p.fleet(q.filters)
    window_view, filters = WindowView.of(window), FilterView.of(q.filters)
    if not fleet.instances:
        return InstanceView(window_view, filters, instance_id, missing=True, no_agents=fleet.total_instances == 0)
    inst = next(iter(fleet.instances.values()))
    analysis = analyse_waste(session, fleet, window, t, by_holder=True)
    ids = fleet.device_ids()
    latest = latest_samples(session, now=p.now, thresholds=t, device_ids=ids)
    states = current_state(fleet, latest)
    units = {u.key: u for u in analysis.units}
    step = series_step(window, inst.interval_s)
    raw = device_series(session, ids, window, step_s=step)
    gpus: list[GpuView] = []
    series: list[DeviceSeries] = []
    devices: dict[int, tuple[str, str]] = {}
    first_seen: dict[int, datetime] = {}
    for gpu in sorted(fleet.gpus.values(), key=lambda g: g.gpu_index):
        slices = fleet.live_slices(gpu.pk)
        gpu_key, gpu_label = f"gpu-{gpu.gpu_index}", f"GPU {gpu.gpu_index}"
        devices[gpu.pk] = (gpu_key, gpu_label)
        own = {gpu.pk: devices[gpu.pk]}
        first_seen[gpu.pk] = gpu.first_seen
        slice_views = []
        for sl in slices:
            key, label = _slice_key(gpu, sl), _slice_label(gpu, sl)
            devices[sl.pk] = own[sl.pk] = (key, label)
            first_seen[sl.pk] = sl.first_seen
            now = _now(key, label, states.get(sl.pk), latest.get(sl.pk), units.get(f"{SLICE}:{sl.pk}"), sl.util_reason)
            slice_views.append(
                SliceView(
                    now, sl.profile_label, sl.gpu_instance_id, sl.compute_instance_id, sl.compute_slices is not None
                )
            )
        gpu_now = _now(
            gpu_key, gpu_label, states.get(gpu.pk), latest.get(gpu.pk), units.get(f"{GPU}:{gpu.pk}"), gpu.util_reason
        )
        gpus.append(
            GpuView(
                gpu.gpu_index,
                gpu.name,
                gpu.uuid,
                gpu.memory_total_mib,
                gpu.mig_mode,
                free_slices(gpu, slices),
                gpu_now,
                slice_views,
                grant_notes(gpu.permission_denied),
                held_over_window(analysis.parts or [], own),
            )
        )
    for pk, (key, label) in devices.items():
        series.append(DeviceSeries(key, label, pk in fleet.gpus, raw.get(pk) or DevicePoints([], [], [], [])))
    spans = hourly_states(
        session, first_seen, start=window.start, end=min(window.end, p.now), idle_util_pct=t.idle_util_pct
    )
    strips = [
        DeviceStrip(key, label, [StripSpan(s.start, s.end, s.state) for s in spans.get(pk, [])])
        for pk, (key, label) in devices.items()
    ]
    group = analysis.group("instance")
    memory = [g.memory_total_mib for g in fleet.gpus.values() if g.memory_total_mib]
    return InstanceView(
        window_view,
        filters,
        instance_id,
        missing=False,
        no_agents=False,
        instance=InstanceDetail(
            InstanceRef.of(inst, prices_now(session, [inst], p.now)[inst.pk]),
            inst.hostname,
            inst.gpu_model,
            inst.agent_version,
            inst.interval_s,
            inst.agent_errors,
        ),
        figures=FiguresView.of(group[0].figures) if group else None,
        priced=inst.price.known,
        delivery=delivery(session, inst.pk, inst.instance_id, since=window.start, until=window.end),
        gpus=gpus,
        step_s=step,
        memory_max_mib=max(memory) if memory else None,
        series=series,
        strips=strips,
    )
