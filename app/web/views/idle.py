"""The idle GPUs page: passthrough GPUs idle now for longer than the idle bound, with what they burned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...analyse.idle import IdleGpu, idle_gpus
from ...analyse.now import latest_samples
from .common import (
    FilterView,
    InstanceRef,
    PagerView,
    Sorting,
    ThresholdView,
    WindowView,
    paginate,
    sort_rows,
)
from .holders import HolderView, holders_by_device
from .inputs import PageInputs


@dataclass(frozen=True)
class IdleRow:
    instance: InstanceRef
    gpu_index: int
    gpu_name: str
    gpu_uuid: str
    state: str
    """idle or idle-held, from the newest sample."""
    since: datetime
    """Start of the idle stretch."""
    idle_hours: float
    """Hours of data in the stretch, h."""
    held_hours: float
    """Of which idle-held, h."""
    mem_used_mib: float | None
    """Memory in use now, MiB."""
    procs: int | None
    """Compute processes now."""
    usd_per_hour: float | None
    """Its price now, USD/h (USD per GPU-hour: it is one GPU); None without one."""
    price_source: str | None
    """The kind of its price now: billed, spot history, agent, price file or catalog; None without a price."""
    burned_usd: float | None
    """Cost of the stretch so far, USD, at the prices in force hour by hour; None without a price."""
    burned_sources: list[str]
    """The kinds of price in `burned_usd`, largest share first."""
    usd_per_day: float | None
    """Cost per day at the price now while it stays idle, USD/day."""
    holders: list[HolderView]
    """Who holds it now: the processes of its newest sample (an idle-held GPU has some)."""


@dataclass(frozen=True)
class IdleView:
    window: WindowView
    filters: FilterView
    thresholds: ThresholdView
    no_agents: bool
    """Nothing has reported to this server yet."""
    count: int
    """Idle GPUs matching the filters (every page of the table)."""
    burned_usd: float
    """Their cost since each went idle, USD (priced GPUs), at the prices in force hour by hour."""
    usd_per_day: float
    """What they cost per day at the price now while they stay idle, USD/day."""
    unpriced: int
    """Idle GPUs with no price now, left out of the dollar figures."""
    rows: list[IdleRow]
    pager: PagerView
    sorting: Sorting


_COLUMNS: dict[str, Callable[[IdleGpu], Any]] = {
    "instance": lambda g: g.gpu.instance.name,
    "type": lambda g: g.gpu.instance.instance_type,
    "since": lambda g: g.since,
    "hours": lambda g: g.idle_hours,
    "burned": lambda g: g.burned_usd,
    "per_day": lambda g: g.usd_per_day,
    "mem": lambda g: g.latest.mem_used_mib if g.latest else None,
}


def _row(g: IdleGpu, holders: dict[int, list[HolderView]]) -> IdleRow:
    latest = g.latest
    return IdleRow(
        InstanceRef.of(g.gpu.instance, g.price),
        g.gpu.gpu_index,
        g.gpu.name,
        g.gpu.uuid,
        g.state,
        g.since,
        g.idle_hours,
        g.held_s / 3600,
        latest.mem_used_mib if latest else None,
        latest.procs if latest else None,
        g.usd_per_hour,
        g.price_source,
        g.burned_usd,
        list(g.burned_sources),
        g.usd_per_day,
        holders.get(g.gpu.pk, []),
    )


def build_idle(p: PageInputs) -> IdleView:
    q = p.query
    fleet = p.fleet()
    latest = latest_samples(p.session, now=p.now, thresholds=p.thresholds)
    idle = idle_gpus(p.session, fleet, latest, now=p.now, thresholds=p.thresholds)
    ordered, sort = sort_rows(idle, _COLUMNS, q.sort, q.dir, "burned")
    shown, pager = paginate(ordered, q.page)
    holders = holders_by_device(p.session, [g.gpu.pk for g in shown])
    return IdleView(
        window=WindowView.of(q.window),
        filters=FilterView.of(q.filters),
        thresholds=ThresholdView.of(p.thresholds),
        no_agents=fleet.total_instances == 0,
        count=len(idle),
        burned_usd=sum(g.burned_usd or 0.0 for g in idle),
        usd_per_day=sum(g.usd_per_day or 0.0 for g in idle),
        unpriced=sum(1 for g in idle if g.usd_per_hour is None),
        rows=[_row(g, holders) for g in shown],
        pager=pager,
        sorting=Sorting(sort, q.dir),
    )
