"""The spot prices in force over a time range, per pool, from the history app/billing/spot.py reads: as stretches
at one price, and as each UTC hour's price (the mean of the prices in force in it, each for its seconds: EC2 bills
spot by the second at the price in force)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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


@dataclass(frozen=True)
class HourlyPrice:
    """The spot price of one UTC hour: the mean of the prices in force in it, each weighed by its seconds, USD/h.
    `known_s` is how many of the hour's 3600 s the history covers; the mean is over those."""

    hour: datetime
    usd_per_hour: float
    known_s: float


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


def _hour_floor(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(minute=0, second=0, microsecond=0)


def hourly_spot_prices(
    session: Session | Connection, pools: Iterable[tuple[str, str]], start: datetime, end: datetime
) -> dict[SpotPool, list[HourlyPrice]]:
    """The spot price of each UTC hour that overlaps [start, end), for each pool: the time-weighted mean of the
    prices in force during the whole hour (spot is billed by the second at the price in force), USD/h. Hours the
    history says nothing about are left out; an hour it covers in part has the mean of that part, and says how
    much in `known_s`. One query."""
    first = _hour_floor(start)
    last = _hour_floor(end)
    if last < end:
        last += timedelta(hours=1)
    out: dict[SpotPool, list[HourlyPrice]] = {}
    for pool, segments in spot_price_segments(session, pools, first, last).items():
        weighed: dict[datetime, float] = defaultdict(float)
        known: dict[datetime, float] = defaultdict(float)
        for seg in segments:
            hour = _hour_floor(seg.starts)
            while hour < seg.ends:
                next_hour = hour + timedelta(hours=1)
                seconds = (min(seg.ends, next_hour) - max(seg.starts, hour)).total_seconds()
                weighed[hour] += seg.usd_per_hour * seconds
                known[hour] += seconds
                hour = next_hour
        out[pool] = [HourlyPrice(hour, weighed[hour] / known[hour], known[hour]) for hour in sorted(known)]
    return out
