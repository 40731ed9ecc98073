"""The spot prices in force over a time range, per pool, from the history app/billing/spot.py reads, as stretches
at one price (app/billing/prices.py makes hours of them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from .spot import SpotPool


@dataclass(frozen=True)
class PriceSegment:
    """A stretch of time with one price: from `starts` (included) to `ends` (excluded), at `usd_per_hour` USD/h
    for the whole instance."""

    starts: datetime
    ends: datetime
    usd_per_hour: float


_SEGMENTS_SQL = text(
    """
    SELECT w.instance_type, w.availability_zone, s.ts, s.usd_per_hour,
           lead(s.ts) OVER (PARTITION BY w.instance_type, w.availability_zone ORDER BY s.ts) AS next_ts,
           r.read_until
    FROM unnest(CAST(:types AS text[]), CAST(:zones AS text[])) AS w(instance_type, availability_zone)
    CROSS JOIN LATERAL (
        (SELECT p.ts, p.usd_per_hour FROM spot_prices p
         WHERE p.instance_type = w.instance_type AND p.availability_zone = w.availability_zone AND p.ts <= :start
         ORDER BY p.ts DESC LIMIT 1)
        UNION ALL
        (SELECT p.ts, p.usd_per_hour FROM spot_prices p
         WHERE p.instance_type = w.instance_type AND p.availability_zone = w.availability_zone
           AND p.ts > :start AND p.ts < :end)
    ) s
    LEFT JOIN spot_price_reads r
      ON r.instance_type = w.instance_type AND r.availability_zone = w.availability_zone
    ORDER BY w.instance_type, w.availability_zone, s.ts
    """
)


def spot_price_segments(
    session: Session | Connection, pools: Iterable[tuple[str, str]], start: datetime, end: datetime
) -> dict[SpotPool, list[PriceSegment]]:
    """The spot prices in force over [start, end) for each pool (instance type, zone), USD/h, in time order,
    consecutive equal prices merged. The segments begin at the newest price at or before `start`, or at the
    first price known after it, and end at `end`, or earlier where the pool's history has been read only so far
    (`read_until`); a pool without prices gets an empty list. One query."""
    wanted = sorted({SpotPool(*pool) for pool in pools})
    out: dict[SpotPool, list[PriceSegment]] = {pool: [] for pool in wanted}
    if not wanted or end <= start:
        return out
    rows = session.execute(
        _SEGMENTS_SQL,
        {
            "types": [p.instance_type for p in wanted],
            "zones": [p.availability_zone for p in wanted],
            "start": start,
            "end": end,
        },
    ).all()
    for row in rows:
        pool = SpotPool(row.instance_type, row.availability_zone)
        known_until = end if row.read_until is None else min(end, row.read_until)
        starts = max(row.ts, start)
        ends = min(row.next_ts or known_until, known_until)
        if ends <= starts:
            continue
        segments = out[pool]
        if segments and segments[-1].usd_per_hour == row.usd_per_hour and segments[-1].ends == starts:
            segments[-1] = PriceSegment(segments[-1].starts, ends, row.usd_per_hour)
        else:
            segments.append(PriceSegment(starts, ends, row.usd_per_hour))
    return out
