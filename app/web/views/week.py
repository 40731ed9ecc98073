"""Wasted dollars by hour of the week (UTC): when the waste happens, nights and weekends included."""

from __future__ import annotations

from dataclasses import dataclass

from ...analyse.hour_of_week import waste_by_hour_of_week
from ...analyse.window import floor_hour
from .common import FilterView, WindowView
from .inputs import PageInputs

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class Peak:
    day: str
    hour: int
    """Hour of day, UTC, 0-23."""
    usd_per_hour: float


@dataclass(frozen=True)
class WeekView:
    window: WindowView
    filters: FilterView
    no_agents: bool
    days: list[str]
    """Row labels, Monday first."""
    usd: list[list[float]]
    """Wasted USD (idle, idle-held and unpartitioned) per [weekday][hour of day, UTC] over the window."""
    hours: list[list[int]]
    """How many such clock hours the window held, from the fleet's first data on."""
    usd_per_hour: list[list[float | None]]
    """usd / hours: what an hour like this wastes on average, USD/h; None where the window held no such hour."""
    total_usd: float
    weekend_usd: float
    """Saturday and Sunday, UTC."""
    peak: Peak | None
    """The hour of the week that wastes most on average."""


def build_week(p: PageInputs) -> WeekView:
    q = p.query
    fleet = p.fleet()
    # Hours before the fleet's first data are no hours of the week at all: counting them would make the days
    # the window holds more of look cheaper per hour.
    first = min((g.first_seen for g in fleet.gpus.values()), default=None)
    start = max(q.window.start, floor_hour(first)) if first is not None else q.window.start
    grid = waste_by_hour_of_week(p.session, fleet, start=start, end=q.window.end, now=p.now, thresholds=p.thresholds)
    per_hour = [
        [usd / n if n else None for usd, n in zip(day_usd, day_hours, strict=True)]
        for day_usd, day_hours in zip(grid.usd, grid.hours, strict=True)
    ]
    best: Peak | None = None
    for d, row in enumerate(per_hour):
        for h, value in enumerate(row):
            if value is not None and value > 0 and (best is None or value > best.usd_per_hour):
                best = Peak(DAYS[d], h, value)
    return WeekView(
        window=WindowView.of(q.window),
        filters=FilterView.of(q.filters),
        no_agents=fleet.total_instances == 0,
        days=list(DAYS),
        usd=grid.usd,
        hours=grid.hours,
        usd_per_hour=per_hour,
        total_usd=sum(sum(row) for row in grid.usd),
        weekend_usd=sum(grid.usd[5]) + sum(grid.usd[6]),
        peak=best,
    )
