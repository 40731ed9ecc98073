"""What each value of a grouping by holder held on the instance-days a price change cuts (app/analyse/holder_groups.py):
their hours, each at its price class, summed per instance-day, value and price, read once and kept in this process.

A cut day has no one price, so its hours are read instead of its daily row; without a memo every view of a month
read about a thousand such days hour by hour, most of a 30-day grouping by user. A kept day stands while its daily
rows are as they were read (their count and the sum of their row versions, `xmin`: the ingest path writes a day's
hourly and daily rows in one statement, so the day's hours cannot change without its daily rows) and its prices
have the same signature (app/analyse/price_classes.py). Reading it again gives the same sums; the memo only saves
the time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .price_classes import DayKey, Grid, PriceClasses, u16_sql

Price = tuple[float, int, float]
"""A price class as PriceClasses keeps it: USD per GPU-second, source code, USD per GPU-second paid offline."""


class HeldHours(NamedTuple):
    """What one value held in the hours of one instance-day at one price, as the holder group rows weigh it (s)."""

    key: str
    label: str | None
    price: Price
    secs_w: float
    known_w: float
    usum_w: float
    below_w: float
    """Weighed seconds under the idle threshold."""
    unsized_s: float


Version = tuple[int, int]
"""An instance-day's daily rows of one grouping: how many, and the sum of their row versions."""


class HeldDays:
    """Cut instance-days read so far, per database, idle bound and grouping (a scope). Bounded: past `limit`
    instance-days it starts again empty."""

    def __init__(self, limit: int = 50_000) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._days: dict[tuple[str, int, str], dict[DayKey, tuple[Version, int, list[HeldHours]]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, scope: tuple[str, int, str], day: DayKey, version: Version, sig: int) -> list[HeldHours] | None:
        """The day's sums, if kept at this version and price signature."""
        found = self._days.get(scope, {}).get(day)
        return found[2] if found is not None and found[0] == version and found[1] == sig else None

    def put(self, scope: tuple[str, int, str], entries: Sequence[tuple[DayKey, Version, int, list[HeldHours]]]) -> None:
        with self._lock:
            if self._count + len(entries) > self._limit:
                self._days.clear()
                self._count = 0
            kept = self._days.setdefault(scope, {})
            before = len(kept)
            for day, version, sig, sums in entries:
                kept[day] = (version, sig, sums)
            self._count += len(kept) - before


HELD_DAYS = HeldDays()

# Day by day through the (grouping, instance_pk, day) index: a thousand lookups cost less than sorting the month.
_VERSIONS_SQL = (
    "SELECT q.pk, CAST(date_part('epoch', q.day) AS int8), v.n, v.total "
    "FROM unnest(CAST(:vpk AS int8[]), CAST(:vday AS timestamptz[])) AS q(pk, day) "
    "CROSS JOIN LATERAL (SELECT count(*) AS n, sum(CAST(CAST(d.xmin AS text) AS int8)) AS total "
    "FROM holder_groups_daily d WHERE d.grouping = :grouping AND d.instance_pk = q.pk AND d.day = q.day) v "
    "WHERE v.n > 0"
)


@lru_cache(maxsize=8)
def _hours_sql(bound: int) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    hour_of_day = "CAST((date_part('epoch', h.hour) - date_part('epoch', mx.day)) / 3600 AS int4)"
    sums = ", ".join(
        f"CAST(sum(h.{n}) AS float8)" for n in ("secs_w", "known_w", "usum_w", f"lt{bound}_w", "unsized_s")
    )
    return (
        "WITH mx AS (SELECT * FROM unnest(CAST(:mpk AS int8[]), CAST(:mday AS timestamptz[]), CAST(:mo AS int4[])) "
        "AS mx(pk, day, o)) "
        f"SELECT mx.pk, CAST(date_part('epoch', mx.day) AS int8), h.key, max(h.label), "
        f"{u16_sql('g', f'mx.o + {hour_of_day}')} AS cls, {sums} FROM mx "
        "JOIN holder_groups_hourly h ON h.grouping = :grouping AND h.instance_pk = mx.pk "
        "AND h.hour >= mx.day AND h.hour < mx.day + interval '24 hours' "
        "GROUP BY 1, 2, 3, 5"
    )


def _at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def held_days(
    session: Session,
    grouping: str,
    days: Sequence[DayKey],
    classes: PriceClasses,
    *,
    idle_util_pct: int,
    memo: HeldDays | None = None,
) -> dict[DayKey, list[HeldHours]]:
    """Per cut instance-day of `days` (instance pk, epoch seconds of its UTC midnight; each a day of
    `classes.mixed`), what each value of `grouping` held in its hours, per price; days with no rows are left out.
    Kept days come from `memo` (this process's, unless given); the others are read hour by hour, one query."""
    if not days:
        return {}
    memo = HELD_DAYS if memo is None else memo
    scope = (str(session.get_bind().engine.url), idle_util_pct, grouping)
    params = {"grouping": grouping, "vpk": [pk for pk, _d in days], "vday": [_at(d) for _pk, d in days]}
    versions: dict[DayKey, Version] = {
        (pk, day): (int(n), int(total)) for pk, day, n, total in session.execute(text(_VERSIONS_SQL), params)
    }
    out: dict[DayKey, list[HeldHours]] = {}
    missing: list[DayKey] = []
    for day in days:
        version = versions.get(day)
        if version is None:
            continue  # no daily row, so no hours: nothing held that day
        found = memo.get(scope, day, version, classes.mixed[day])
        if found is None:
            missing.append(day)
        else:
            out[day] = found
    if missing:
        read = _read(session, grouping, missing, classes, idle_util_pct)
        memo.put(scope, [(day, versions[day], classes.mixed[day], read.get(day, [])) for day in missing])
        out.update((day, read[day]) for day in missing if day in read)
    return out


def _read(
    session: Session, grouping: str, days: Sequence[DayKey], classes: PriceClasses, bound: int
) -> dict[DayKey, list[HeldHours]]:
    """The days' hours, each at its class in the days' grid sections, summed per day, value and price."""
    grid = Grid()
    first = classes.day_sections(grid, days)
    params = {
        "grouping": grouping,
        "mpk": [pk for pk, _d in days],
        "mday": [_at(d) for _pk, d in days],
        "mo": [first[day] for day in days],
        "g": grid.to_bytes(),
    }
    out: dict[DayKey, list[HeldHours]] = {}
    for pk, day, key, label, cls, *sums in fetch_binary(session, _hours_sql(bound), params):
        out.setdefault((pk, day), []).append(HeldHours(key, label, classes.price_of(cls), *sums))
    return out
