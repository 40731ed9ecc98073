"""The waste page: cost and waste per group over the window, grouped one way at a time, with totals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...analyse.fleet import Fleet
from ...analyse.grouping import GroupRow, by_holder
from ...analyse.waste import WasteAnalysis, analyse_waste
from .common import Choice, FiguresView, FilterView, PagerView, Sorting, WindowView, paginate, sort_rows
from .inputs import PageInputs

GROUP_LABELS = {
    "instance": "Instance",
    "instance_type": "Instance type",
    "region": "Region",
    "availability_zone": "Availability zone",
    "lifecycle": "Lifecycle",
    "gpu_model": "GPU model",
    "gpu": "GPU",
    "slice": "GPU / slice",
    "user": "User",
    "process": "Process",
    "container": "Container",
    "namespace": "Namespace",
    "pod": "Pod",
    "job": "Slurm job",
}
"""The groupings the form offers, besides one per tag key."""


@dataclass(frozen=True)
class WasteRow:
    """One group over the window."""

    key: str
    """What a filter takes (an instance id, a type, a tag value, ...); empty for "(no ...)"."""
    label: str
    figures: FiguresView
    waste_per_month_usd: float
    """Its waste scaled to a 730-hour month at the window's rate, USD."""
    prices: list[str]
    """Where the prices of its units came from, sorted."""
    size_unknown: bool
    """It covers only MIG capacity of unknown size: its GPU-hours and money are unknown, not 0."""


@dataclass(frozen=True)
class WasteView:
    window: WindowView
    filters: FilterView
    no_agents: bool
    """Nothing has reported to this server yet."""
    group_by: str
    """What a row is: a name of `choices`."""
    group_label: str
    """What a row is, in words."""
    choices: list[Choice]
    """The groupings the form offers: the fixed ones, then one per tag key of the fleet."""
    totals: FiguresView
    """Every group together (every page of the table)."""
    waste_per_month_usd: float
    """The total waste scaled to a 730-hour month, USD."""
    rows: list[WasteRow]
    pager: PagerView
    sorting: Sorting
    price_sources: dict[str, float]
    """Each kind of price source's share of the cost, 0-1, largest first (docs/billing.md)."""
    billed_until: datetime | None
    """The imported bill covers time up to here; None before any import."""


_COLUMNS: dict[str, Callable[[GroupRow], Any]] = {
    "label": lambda r: r.label.lower(),
    "gpu_hours": lambda r: r.figures.gpu_hours,
    "util": lambda r: r.figures.avg_util,
    "unknown": lambda r: r.figures.unknown_share,
    "cost": lambda r: r.figures.cost,
    "idle_cost": lambda r: r.figures.idle_cost,
    "held_cost": lambda r: r.figures.idle_held_cost,
    "unused_cost": lambda r: r.figures.unused_cost,
    "waste": lambda r: r.figures.waste,
    "offline": lambda r: r.figures.offline_h,
}


def group_choices(fleet: Fleet, current: str) -> list[Choice]:
    """The fixed groupings, then `tag:<key>` per tag key of the fleet; the current grouping is kept even when
    no instance has its tag, so the form never changes it silently."""
    choices = dict(GROUP_LABELS)
    for key in sorted({t.split(":", 1)[0] for t in fleet.options.tags}):
        choices[f"tag:{key}"] = f"Tag {key}"
    if current not in choices and current.startswith("tag:"):
        choices[current] = f"Tag {current[4:]}"
    return [Choice(value, label) for value, label in choices.items()]


def _row(r: GroupRow, analysis: WasteAnalysis) -> WasteRow:
    f = r.figures
    return WasteRow(r.key, r.label, FiguresView.of(f), analysis.monthly(f.waste), sorted(r.prices), f.only_unknown)


def build_waste(p: PageInputs) -> WasteView:
    q = p.query
    fleet = p.fleet()
    analysis = analyse_waste(
        p.session, fleet, q.window, p.thresholds, by_holder=by_holder([q.group_by]), holder_groups=[q.group_by]
    )
    ordered, sort = sort_rows(analysis.group(q.group_by), _COLUMNS, q.sort, q.dir, "waste")
    shown, pager = paginate(ordered, q.page)
    choices = group_choices(fleet, q.group_by)
    labels = {c.value: c.label for c in choices}
    return WasteView(
        window=WindowView.of(q.window),
        filters=FilterView.of(q.filters),
        no_agents=fleet.total_instances == 0,
        group_by=q.group_by,
        group_label=labels.get(q.group_by, q.group_by),
        choices=choices,
        totals=FiguresView.of(analysis.totals),
        waste_per_month_usd=analysis.projected_monthly_waste,
        rows=[_row(r, analysis) for r in shown],
        pager=pager,
        sorting=Sorting(sort, q.dir),
        price_sources=analysis.source_shares,
        billed_until=analysis.billed_until,
    )
