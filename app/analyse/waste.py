"""Cost and waste over a window: per unit of capacity (app/analyse/figures.py), grouped any way
(app/analyse/grouping.py), with totals. The pages, their htmx fragments, the report and the charts over time
(app/analyse/timeline.py, by the same rules) all read these same figures. The units are made by
app/analyse/units.py, priced hour by hour where the bill or spot history knows the price (app/analyse/priced.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Event
from .device_money import DeviceMoney
from .figures import HOURS_PER_MONTH, Figures, Unit
from .fleet import Fleet
from .grouping import GroupRow, by_value, group_rows, instance_group, per_instance, summarise
from .holder_groups import HeldValues, held_values
from .holders import Part, held_usage, holder_columns, split_units
from .kept_reads import kept_usage_and_money
from .price_classes import price_classes
from .priced import billed_until, pieces_in_use, priced_devices, priced_units
from .series_prices import load_pieces
from .states import Thresholds
from .usage import hourly_split, window_usage
from .window import Window


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
    billed_until: datetime | None = None
    """The imported bill covers time up to here (end of its newest hour); None before any import."""

    @property
    def source_shares(self) -> dict[str, float]:
        """Each kind of price source's share of the whole cost, 0-1, largest first."""
        whole = GroupRow("", "")
        for row in self.by_instance.values():
            whole.add_sources(row.usd_by_source)
        return whole.source_shares

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
    # Over the whole days around the window: the hours its rollup reads touch (a daily row, the hours taken from it).
    pieces = pieces_in_use(fleet, load_pieces(session, fleet, window.start, window.end))
    classes = price_classes(fleet, pieces)
    bound = thresholds.idle_util_pct
    money: dict[int, DeviceMoney] = {}
    if classes.priced:
        # Usage and money from one read of the rows.
        usage, money = kept_usage_and_money(
            session,
            priced_devices(fleet, pieces),
            classes,
            window.rollup_reads(),
            idle_util_pct=bound,
            device_ids=ids,
            now=window.now,
        )
    else:
        usage = window_usage(session, window, idle_util_pct=bound, device_ids=ids)
    changes: dict[int, list[tuple[datetime, bool]]] = {}
    for device_id, at, details in session.execute(
        select(Event.device_id, Event.ts, Event.details)
        .where(Event.kind == "mig_mode_changed", Event.ts > window.start, Event.ts < window.end)
        .order_by(Event.ts)
    ):
        if device_id in fleet.gpus:
            changes.setdefault(device_id, []).append((at, bool(details.get("mig_mode"))))
    split = hourly_split(session, window, list(changes), idle_util_pct=bound, mode_at=changes)
    units = priced_units(
        session, fleet, usage, window, split, pieces, classes, idle_util_pct=bound, mode_at=changes, money=money
    )
    instances = per_instance(units)
    parts = None
    values = None
    single = None if holder_groups is None else by_value(holder_groups)
    if by_holder and holder_groups is not None and single is not None:
        groups = [
            (pk, inst.price.usd_per_gpu_hour, instance_group(holder_groups, inst), inst.price.kind)
            for pk, inst in fleet.instances.items()
        ]
        sums = held_values(
            session, window, single, idle_util_pct=thresholds.idle_util_pct, instances=groups, classes=classes
        )
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
        billed_until=billed_until(session),
    )
