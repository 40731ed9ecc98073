"""The time window and the filters of an analysis (app/params.py reads them from a query string).

Rollups are hourly, so every window starts and ends on a UTC hour. The presets that span days start at a UTC
midnight: those read one daily rollup row per device per day, which keeps a 30-day view as cheap as a day.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
PRESETS: dict[str, timedelta] = {
    "1h": HOUR,
    "6h": 6 * HOUR,
    "24h": DAY,
    "7d": 7 * DAY,
    "30d": 30 * DAY,
}
DEFAULT_PRESET = "24h"
LIFECYCLES = ("spot", "on-demand", "on-prem")
MAX_WINDOW = timedelta(days=400)


def floor_hour(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(t: datetime) -> datetime:
    f = floor_hour(t)
    return f if f == t else f + HOUR


def floor_day(t: datetime) -> datetime:
    return floor_hour(t).replace(hour=0)


def ceil_day(t: datetime) -> datetime:
    f = floor_day(t)
    return f if f == t else f + DAY


@dataclass(frozen=True)
class Window:
    """[start, end) on UTC hour boundaries; `now` is when the analysis runs (end may lie past it)."""

    start: datetime
    end: datetime
    now: datetime
    label: str

    @property
    def hours(self) -> float:
        """Length of the window up to now, hours (the part that can hold data)."""
        return max(0.0, (min(self.end, self.now) - self.start).total_seconds() / 3600)

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    def previous(self) -> Window:
        """The window of the same length that ends where this one starts (for "change vs previous")."""
        return Window(start=self.start - self.span, end=self.start, now=self.now, label=f"previous {self.label}")

    @property
    def is_live(self) -> bool:
        """The window reaches the present, so its figures change as data arrives."""
        return self.end > self.now

    def rollup_reads(self) -> list[RollupRead]:
        """The rollup rows whose sums make up this window, as few as possible.

        Whole days come from the daily table. A partial day is read as its hours, or, when more than half of
        it is inside the window, as its daily row minus the hours outside: at most 13 rows either way. Today's
        daily row holds only what has arrived so far, so a window that reaches the present reads it whole.
        """
        start, end = self.start, self.end
        today = floor_day(self.now)
        if end > self.now and start <= today:
            end = max(end, today + DAY)
        reads: list[RollupRead] = []
        day = floor_day(start)
        while day < end:
            lo, hi = max(start, day), min(end, day + DAY)
            inside = (hi - lo) // HOUR
            if inside == 24:
                reads.append(RollupRead(DAILY, day, day + DAY, 1))
            elif inside <= 12:
                reads.append(RollupRead(HOURLY, lo, hi, 1))
            else:
                reads.append(RollupRead(DAILY, day, day + DAY, 1))
                if day < lo:
                    reads.append(RollupRead(HOURLY, day, lo, -1))
                if hi < day + DAY:
                    reads.append(RollupRead(HOURLY, hi, day + DAY, -1))
            day += DAY
        return _merge(reads)


DAILY = "daily"
HOURLY = "hourly"


@dataclass(frozen=True)
class RollupRead:
    """Rows of one rollup table over [start, end), added (sign 1) or taken away (sign -1)."""

    table: str
    start: datetime
    end: datetime
    sign: int


def union_of_reads(
    shape: tuple[tuple[str, int], ...],
    tables: tuple[str, str],
    keys: str,
    names: Sequence[str],
    where: str = "",
    first: int = 0,
) -> str:
    """The rows of the reads of `shape` ((table, sign) each, in order: parameters `t{i}a`, `t{i}b` bound them, i
    counted from `first`) as one SELECT ... UNION ALL ...: from the daily or the hourly table of `tables`, their
    `keys` columns, then the sums `names`, negated in a read taken away; `where` adds a condition to each."""
    parts = []
    for i, (table, sign) in enumerate(shape, start=first):
        time_col, name = ("day", tables[0]) if table == DAILY else ("hour", tables[1])
        cols = ", ".join(n if sign > 0 else f"-{n} AS {n}" for n in names)
        parts.append(
            f"SELECT {keys}, {cols} FROM {name} WHERE {time_col} >= :t{i}a AND {time_col} < :t{i}b"
            + (f" AND {where}" if where else "")
        )
    return " UNION ALL ".join(parts)


def _merge(reads: list[RollupRead]) -> list[RollupRead]:
    """Reads of the same table and sign that touch become one range."""
    out: list[RollupRead] = []
    for r in sorted(reads, key=lambda r: (r.table, -r.sign, r.start)):
        last = out[-1] if out else None
        if last is not None and (last.table, last.sign, last.end) == (r.table, r.sign, r.start):
            out[-1] = RollupRead(r.table, last.start, r.end, r.sign)
        else:
            out.append(r)
    return out


def preset_window(name: str, now: datetime) -> Window:
    span = PRESETS[name]
    end = floor_hour(now) + HOUR
    start = end - span
    if span >= 7 * DAY:
        # A day-long preset starts at midnight so it reads daily rows only; it spans the last N calendar days.
        start = floor_day(now) - span + DAY
    return Window(start=start, end=end, now=now, label=name)


@dataclass(frozen=True)
class Filters:
    """Which instances an analysis covers; empty means all. Tags match when the instance has every pair."""

    regions: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    lifecycles: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    instance_ids: tuple[str, ...] = field(default=())

    def match(
        self, *, region: str | None, instance_type: str | None, lifecycle: str | None, tags: Mapping[str, str]
    ) -> bool:
        if self.regions and region not in self.regions:
            return False
        if self.instance_types and instance_type not in self.instance_types:
            return False
        if self.lifecycles and lifecycle not in self.lifecycles:
            return False
        return all(tags.get(k) == v for k, v in self.tags)
