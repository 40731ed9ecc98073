"""The instances page: every instance with its agent, price, GPUs, and its figures over the window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...analyse.figures import Figures
from ...analyse.fleet import InstanceInfo
from ...analyse.price_now import PriceNow, prices_now
from ...analyse.waste import analyse_waste
from .common import FiguresView, FilterView, InstanceRef, PagerView, Sorting, WindowView, paginate, sort_rows
from .inputs import PageInputs


@dataclass(frozen=True)
class InstanceRow:
    instance: InstanceRef
    gpus: int
    """GPUs it has."""
    mig_gpus: int
    """Of which in MIG mode now."""
    missing_privileges: bool
    """The agent could not read some figures of a GPU at its privilege (the instance page says which)."""
    figures: FiguresView | None
    """Its figures over the window; None when it has no unit in the window."""


@dataclass(frozen=True)
class InstancesView:
    window: WindowView
    filters: FilterView
    no_agents: bool
    """Nothing has reported to this server yet."""
    count: int
    """Instances matching the filters (every page of the table)."""
    rows: list[InstanceRow]
    pager: PagerView
    sorting: Sorting


@dataclass(frozen=True)
class _Row:
    """A row before it is shown: sorted and paged on these, converted for the page only."""

    instance: InstanceInfo
    gpus: int
    mig_gpus: int
    refused: bool
    figures: Figures | None
    price: PriceNow


_COLUMNS: dict[str, Callable[[_Row], Any]] = {
    "name": lambda r: (r.instance.name.lower(), r.instance.instance_id),
    "type": lambda r: r.instance.instance_type,
    "region": lambda r: r.instance.region,
    "gpus": lambda r: r.gpus,
    "last_seen": lambda r: r.instance.last_seen,
    "price": lambda r: r.price.usd_per_instance_hour,
    "cost": lambda r: r.figures.cost if r.figures else None,
    "waste": lambda r: r.figures.waste if r.figures else None,
    "util": lambda r: r.figures.avg_util if r.figures else None,
}


def _view(r: _Row) -> InstanceRow:
    figures = FiguresView.of(r.figures) if r.figures is not None else None
    return InstanceRow(InstanceRef.of(r.instance, r.price), r.gpus, r.mig_gpus, r.refused, figures)


def build_instances(p: PageInputs) -> InstancesView:
    q = p.query
    fleet = p.fleet()
    analysis = analyse_waste(p.session, fleet, q.window, p.thresholds)
    by_instance = {r.key: r.figures for r in analysis.group("instance")}
    gpus: Counter[int] = Counter()
    mig: Counter[int] = Counter()
    refused: set[int] = set()
    for g in fleet.gpus.values():
        gpus[g.instance.pk] += 1
        if g.mig_mode:
            mig[g.instance.pk] += 1
        if g.permission_denied:
            refused.add(g.instance.pk)
    prices = prices_now(p.session, fleet.instances.values(), p.now)
    rows = [
        _Row(i, gpus[i.pk], mig[i.pk], i.pk in refused, by_instance.get(i.instance_id), prices[i.pk])
        for i in fleet.instances.values()
    ]
    ordered, sort = sort_rows(rows, _COLUMNS, q.sort, q.dir, "waste")
    shown, pager = paginate(ordered, q.page)
    return InstancesView(
        window=WindowView.of(q.window),
        filters=FilterView.of(q.filters),
        no_agents=fleet.total_instances == 0,
        count=len(rows),
        rows=[_view(r) for r in shown],
        pager=pager,
        sorting=Sorting(sort, q.dir),
    )
