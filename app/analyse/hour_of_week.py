"""Waste by hour of the week: wasted USD (idle and idle-held, unpartitioned MIG capacity included) per weekday and
UTC hour of day over a window, by the rules of the timeline (app/analyse/timeline.py), from the per-instance
rollups in one query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from .device_series import check_bound
from .fleet import Fleet
from .instance_series import hour_of_week_sql, instance_params
from .states import Thresholds
from .window import HOUR, floor_hour

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class HourOfWeek:
    usd: list[list[float]]
    """[weekday, 0 = Monday .. 6][UTC hour 0 .. 23]: wasted USD."""
    hours: list[list[int]]
    """How many such clock hours the window held up to now (the current hour included)."""

    @property
    def total(self) -> float:
        """Wasted USD over the window."""
        return sum(map(sum, self.usd))

    def mean(self, weekday: int, hour: int) -> float | None:
        """Wasted USD per such hour, USD/h; None where the window held no such hour."""
        n = self.hours[weekday][hour]
        return self.usd[weekday][hour] / n if n else None


def clock_hours(start: datetime, end: datetime) -> list[list[int]]:
    """How many UTC hours beginning in [floor_hour(start), end) fall on each (weekday, hour of day)."""
    out = [[0] * 24 for _ in range(7)]
    t = floor_hour(start)
    while t < end:
        out[t.weekday()][t.hour] += 1
        t += HOUR
    return out


def waste_by_hour_of_week(
    session: Session, fleet: Fleet, *, start: datetime, end: datetime, now: datetime, thresholds: Thresholds
) -> HourOfWeek:
    """Wasted USD per (weekday, UTC hour) over [start, end), from the hourly per-instance rollups: each device
    weighed as it was when its seconds arrived. ValueError for an idle threshold with no rollup bound."""
    bound = check_bound(thresholds)
    usd = [[0.0] * 24 for _ in range(7)]
    hours = clock_hours(start, min(end, now))
    params, _spans = instance_params(fleet, {pk: 0 for pk in fleet.instances}, start=start, end=end, now=now)
    if not params["pk"] or end <= start:
        return HourOfWeek(usd, hours)
    for weekday, hour, wasted in session.execute(text(hour_of_week_sql(bound)), params | {"a0": start, "b0": end}):
        usd[weekday][hour] = wasted
    return HourOfWeek(usd, hours)
