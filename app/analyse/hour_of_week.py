"""Waste by hour of the week: wasted USD (idle and idle-held, unpartitioned MIG capacity included) per weekday and
UTC hour of day over a window, by the rules of the timeline (app/analyse/timeline.py), from the per-instance
rollups in one query.

Each hour is priced at the price in force then (app/analyse/series_prices.py): the instance's price piece (the
imported bill, spot price history) where one covers it, else its own price; offline time in a paid-offline piece
(Capacity Block or Reservation) is waste at its price, as in the window analysis."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from ..billing.prices import PricePiece
from ..db import fetch_binary
from .device_series import check_bound
from .fleet import Fleet
from .instance_series import hour_of_week_sql, instance_params
from .series_prices import load_pieces, paid_spans, series_prices, spread
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
    session: Session,
    fleet: Fleet,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    thresholds: Thresholds,
    pieces: Mapping[int, list[PricePiece]] | None = None,
) -> HourOfWeek:
    """Wasted USD per (weekday, UTC hour) over [start, end) (`start` on an hour), from the hourly per-instance
    rollups: each device weighed as it was when its seconds arrived, each hour at the price in force then.
    `pieces`: the price pieces by instance pk (`series_prices.load_pieces` over a span holding this one); None reads
    them. ValueError for an idle threshold with no rollup bound."""
    bound = check_bound(thresholds)
    usd = [[0.0] * 24 for _ in range(7)]
    hours = clock_hours(start, min(end, now))
    rows = {pk: 0 for pk in fleet.instances}
    params, _spans = instance_params(fleet, rows, start=start, end=end, now=now)
    if not params["pk"] or end <= start:
        return HourOfWeek(usd, hours)
    if pieces is None:
        pieces = load_pieces(session, fleet, start, end)
    prices = series_prices(fleet, pieces, rows.keys(), start=start, end=end)
    binds = params | prices.params() | {"a0": start, "b0": end}
    by_hour = {
        b: (wasted, covered)
        for b, wasted, covered in fetch_binary(session, hour_of_week_sql(bound, prices.priced), binds)
    }
    if prices.paid:
        # Offline time in paid capacity: the GPUs' expected time there at its price, less what they covered there.
        t0 = floor_hour(start)
        n = max(0, -(-(min(end, now) - t0) // HOUR))
        gpu_rows = {g.pk: 0 for g in fleet.gpus.values()}
        _more, paid = paid_spans(fleet, prices, gpu_rows, start=start, end=end, now=now)
        for k, expected in enumerate(spread(paid, t0, HOUR, n).get(0, [])):
            t = t0 + k * HOUR
            wasted, covered = by_hour.get(t, (0.0, 0.0))
            by_hour[t] = (wasted + max(0.0, expected - covered), 0.0)
    for t, (wasted, _covered) in by_hour.items():
        t = t.astimezone(UTC)
        usd[t.weekday()][t.hour] += wasted
    return HourOfWeek(usd, hours)
