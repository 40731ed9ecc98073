"""The overview: the fleet now, the window's figures against the previous window of the same length, GPU-hours by
state and wasted dollars over time, waste by type and tag, the top wasters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ...analyse.fleet import GONE, OFFLINE, ONLINE, Fleet
from ...analyse.idle import idle_gpus
from ...analyse.now import current_state, gpu_equivalents_now, latest_samples
from ...analyse.series_prices import load_pieces
from ...analyse.timeline import BucketFigures, Timeline, bucket_step, timeline, window_totals
from ...analyse.waste import analyse_waste
from .common import FiguresView, FilterView, GroupView, WindowView
from .inputs import PageInputs

TOP = 10


@dataclass(frozen=True)
class Change:
    """A figure of the window against the same figure of the previous window, both per hour of data so that a
    window still in progress compares fairly with a whole one."""

    current: float
    """In the window."""
    previous: float
    """In the previous window."""
    change_pct: float | None
    """Change of the hourly rate, %; None when the previous window had none of it (or no data)."""


@dataclass(frozen=True)
class StateRow:
    state: str
    gpu_hours: float
    share: float
    """Of all hours in the window, offline included, 0-1."""
    now: float
    """GPU equivalents in this state now."""


@dataclass(frozen=True)
class UnitRow:
    """A GPU or MIG slice among the top wasters."""

    label: str
    instance_id: str
    instance_type: str | None
    idle_h: float
    idle_held_h: float
    waste: float
    """USD."""
    usd_per_hour: float | None
    """Its mean price over the window, USD/h (hour by hour where the bill or the spot history priced it)."""


@dataclass(frozen=True)
class TrendView:
    """The window bucket by bucket: hourly for windows up to 7 days, daily beyond."""

    step_s: int
    """Bucket length, s: 3600 or 86400."""
    starts: list[datetime]
    hours: dict[str, list[float]]
    """GPU-hours per state (active, idle-held, idle, unpartitioned, unknown, offline), one value per bucket."""
    waste_usd: list[float]
    """Wasted USD (idle, idle-held and unpartitioned) per bucket."""


@dataclass(frozen=True)
class OverviewView:
    window: WindowView
    previous: WindowView
    """The window of the same length just before, that `changes` compare with."""
    filters: FilterView
    no_agents: bool
    instances: int
    online: int
    offline: int
    gone: int
    gpus: int
    mig_gpus: int
    live_slices: int
    idle_now: int
    """Passthrough GPUs idle now for longer than the idle bound."""
    idle_now_usd_per_day: float
    totals: FiguresView
    projected_monthly_waste: float
    """USD per 730-hour month at the window's rate."""
    projected_monthly_cost: float
    changes: dict[str, Change]
    """gpu_hours, cost, waste, idle_cost, idle_held_cost: against the previous window."""
    states: list[StateRow]
    has_data: bool
    trend: TrendView
    by_type: list[GroupView]
    tag_key: str | None
    """The tag the overview groups by: `team` when any instance has it, else the most common key."""
    by_tag: list[GroupView]
    top_wasters: list[UnitRow]


def overview_tag_key(fleet: Fleet) -> str | None:
    keys = [t.split(":", 1)[0] for t in fleet.options.tags]
    if "team" in keys:
        return "team"
    return keys[0] if keys else None


_CHANGED = ("gpu_hours", "cost", "waste", "idle_cost", "idle_held_cost")


def _changes(current: BucketFigures, previous: BucketFigures, hours: float, previous_hours: float) -> dict[str, Change]:
    out = {}
    for name in _CHANGED:
        now_value, before = float(getattr(current, name)), float(getattr(previous, name))
        change = None
        if before > 0 and hours > 0 and previous_hours > 0:
            change = ((now_value / hours) / (before / previous_hours) - 1) * 100
        out[name] = Change(now_value, before, change)
    return out


def _trend(tl: Timeline) -> TrendView:
    buckets = tl.buckets()
    states = list(BucketFigures().state_hours)
    return TrendView(
        step_s=int(tl.step.total_seconds()),
        starts=tl.starts,
        hours={s: [b.state_hours[s] for b in buckets] for s in states},
        waste_usd=[b.waste for b in buckets],
    )


def build_overview(p: PageInputs) -> OverviewView:
    q, t, session = p.query, p.thresholds, p.session
    window, previous = q.window, q.window.previous()
    fleet = p.fleet()
    analysis = analyse_waste(session, fleet, window, t)
    latest = latest_samples(session, now=p.now, thresholds=t)
    states_now = current_state(fleet, latest)
    equivalents = gpu_equivalents_now(fleet, states_now)
    idle = idle_gpus(session, fleet, latest, now=p.now, thresholds=t)
    totals = analysis.totals
    # The window bucket by bucket; the previous one only as totals (a few rows per instance). Both at each hour's
    # price: the price pieces of the two windows, read once.
    pieces = load_pieces(session, fleet, previous.start, window.end)
    step = bucket_step(window.span)
    tl = timeline(session, fleet, start=window.start, end=window.end, now=p.now, step=step, thresholds=t, pieces=pieces)
    before = window_totals(session, fleet, previous, thresholds=t, pieces=pieces)
    changes = _changes(tl.total(), before, window.hours, previous.hours)
    units = sorted((u for u in analysis.units if u.figures().waste > 0), key=lambda u: -u.figures().waste)
    status = [i.status for i in fleet.instances.values()]
    tag_key = overview_tag_key(fleet)
    all_hours = totals.all_hours
    return OverviewView(
        window=WindowView.of(window),
        previous=WindowView.of(previous),
        filters=FilterView.of(q.filters),
        no_agents=fleet.total_instances == 0,
        instances=len(fleet.instances),
        online=status.count(ONLINE),
        offline=status.count(OFFLINE),
        gone=status.count(GONE),
        gpus=len(fleet.gpus),
        mig_gpus=sum(1 for g in fleet.gpus.values() if g.mig_mode),
        live_slices=sum(1 for s in fleet.slices.values() if s.retired_at is None),
        idle_now=len(idle),
        idle_now_usd_per_day=sum(g.usd_per_day or 0.0 for g in idle),
        totals=FiguresView.of(totals),
        projected_monthly_waste=analysis.projected_monthly_waste,
        projected_monthly_cost=analysis.monthly(totals.cost),
        changes=changes,
        states=[
            StateRow(s, h, h / all_hours if all_hours > 0 else 0.0, equivalents.get(s, 0.0))
            for s, h in totals.state_hours.items()
        ],
        has_data=analysis.has_data,
        trend=_trend(tl),
        by_type=[GroupView(r.key, r.label, FiguresView.of(r.figures)) for r in analysis.group("instance_type")[:TOP]],
        tag_key=tag_key,
        by_tag=[GroupView(r.key, r.label, FiguresView.of(r.figures)) for r in analysis.group(f"tag:{tag_key}")[:TOP]]
        if tag_key
        else [],
        top_wasters=[
            UnitRow(
                u.label,
                u.instance.instance_id,
                u.instance.instance_type,
                u.figures().idle_h,
                u.figures().idle_held_h,
                u.figures().waste,
                u.mean_usd_per_hour,
            )
            for u in units[:TOP]
        ],
    )
