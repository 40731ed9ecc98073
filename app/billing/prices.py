"""What each instance cost hour by hour, where the bill or the spot price history knows it (docs/billing.md, "How
each price is chosen"): the billed price first, then, for a spot instance, the spot price of its pool. Hours that
neither covers keep the instance's own price (agent, price file, catalog: app/pricing).

Prices come as pieces: stretches of whole UTC hours at one price per instance-hour, so the analysis reads the
rollups once per stretch rather than once per hour.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from .spot import SpotPool
from .spot_history import PriceSegment, spot_price_segments

BILLED = "billed"
SPOT_HISTORY = "spot history"
HOUR = timedelta(hours=1)

MERGE_SQL = """
INSERT INTO billed_prices (instance_id, starts, ends, usd_per_hour, reservation_kind)
SELECT instance_id, min(hour), max(hour) + interval '1 hour', min(rate), nullif(min(reservation_kind), '')
FROM (
    SELECT instance_id, hour, rate, reservation_kind,
           hour - interval '1 hour' * row_number() OVER (
               PARTITION BY instance_id, rate, reservation_kind ORDER BY hour) AS run
    FROM (SELECT instance_id, hour, round(CAST(usd / usage_h AS numeric), 6) AS rate,
                 coalesce(reservation_kind, '') AS reservation_kind
          FROM billed_hours WHERE usage_h > 0) h
) r
GROUP BY instance_id, rate, reservation_kind, run
"""
"""Runs of consecutive hours of one instance at one price (to the millionth of a dollar) and reservation."""


def remake_billed_prices(session: Session) -> None:
    """billed_prices from billed_hours, in the caller's transaction (after an import changed billed_hours)."""
    session.execute(text("DELETE FROM billed_prices"))
    session.execute(text(MERGE_SQL))


@dataclass(frozen=True, slots=True)
class PricePiece:
    """[start, end) on UTC hours at `usd_per_hour` for the whole instance, USD/h, from `source` (BILLED or
    SPOT_HISTORY). `paid_offline`: the instance runs in capacity paid whether it runs (a Capacity Block or a
    Capacity Reservation), so its offline hours in the piece cost money too."""

    start: datetime
    end: datetime
    usd_per_hour: float
    source: str
    paid_offline: bool = False
    start_s: int = field(init=False, repr=False, compare=False)
    """`start` in epoch seconds: the analysis lays thousands of pieces out by time on every view."""
    end_s: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_s", int(self.start.timestamp()))
        object.__setattr__(self, "end_s", int(self.end.timestamp()))


@dataclass(frozen=True, slots=True)
class PricedInstance:
    """What `price_pieces` needs of an instance."""

    pk: int
    instance_id: str
    lifecycle: str | None
    instance_type: str | None
    availability_zone: str | None


def price_pieces(
    session: Session, instances: Iterable[PricedInstance], start: datetime, end: datetime
) -> dict[int, list[PricePiece]]:
    """Per instance (by pk), its pieces within [start, end) in time order: billed ones, then spot history for the
    hours of a spot instance the bill does not cover. Instances with none are left out."""
    wanted = list(instances)
    if not wanted or end <= start:
        return {}
    by_id = {i.instance_id: i for i in wanted}
    out: dict[int, list[PricePiece]] = {}
    rows = session.execute(
        text(
            "SELECT instance_id, starts, ends, usd_per_hour, reservation_kind FROM billed_prices "
            "WHERE instance_id = ANY(CAST(:ids AS text[])) AND ends > :a AND starts < :b ORDER BY instance_id, starts"
        ),
        {"ids": list(by_id), "a": start, "b": end},
    ).all()
    for instance_id, starts, ends, usd, kind in rows:
        pieces = out.setdefault(by_id[instance_id].pk, [])
        piece = PricePiece(max(starts, start), min(ends, end), float(usd), BILLED, kind is not None)
        last = pieces[-1] if pieces else None
        if last is not None and last.paid_offline and piece.paid_offline and last.end < piece.start:
            # Between two hours in paid capacity the instance was not billed (its agent stopped, or it did):
            # the capacity was paid all the same, at the price of the hour before.
            pieces.append(PricePiece(last.end, piece.start, last.usd_per_hour, BILLED, True))
        pieces.append(piece)
    spot = {
        i.pk: (i.instance_type, i.availability_zone)
        for i in wanted
        if i.lifecycle == "spot" and i.instance_type and i.availability_zone
    }
    segments = spot_price_segments(session, set(spot.values()), start, end) if spot else {}
    pool_runs: dict[tuple[str, str], list[PricePiece]] = {}
    for pk, pool in spot.items():
        billed = out.get(pk, [])
        runs = pool_runs.get(pool)
        if runs is None:
            runs = pool_runs[pool] = _spot_pieces(segments.get(SpotPool(*pool), []), start, end)
        added = [cut for p in runs for cut in _minus(p, billed)]
        if added:
            out[pk] = sorted([*billed, *added], key=lambda p: p.start)
    return out


def _spot_pieces(segments: list[PriceSegment], start: datetime, end: datetime) -> list[PricePiece]:
    """A pool's prices over [start, end) (hour-aligned) as pieces on whole hours: the hours inside one price at that
    price, an hour in which the price changed at the mean of the prices in force, each for its seconds. The pool is
    read hourly, so its last price read holds until `end`. Work in proportion to the segments, not the hours."""
    if not segments:
        return []
    spans = [(seg.starts, seg.ends, seg.usd_per_hour) for seg in segments]
    spans[-1] = (spans[-1][0], end, spans[-1][2])
    pieces: list[PricePiece] = []
    partial: dict[datetime, list[float]] = {}  # hour -> [USD/h x seconds, seconds]
    for a, b, usd in spans:
        a, b = max(a, start), min(b, end)
        if b <= a:
            continue
        first, last = _ceil_hour(a), _floor_hour(b)
        if first < last:
            pieces.append(PricePiece(first, last, usd, SPOT_HISTORY))
        for lo, hi in ((a, min(first, b)), (max(last, a), b)) if first <= last else ((a, b),):
            if hi > lo:
                acc = partial.setdefault(_floor_hour(lo), [0.0, 0.0])
                seconds = (hi - lo).total_seconds()
                acc[0] += usd * seconds
                acc[1] += seconds
    pieces += [PricePiece(hour, hour + HOUR, acc[0] / acc[1], SPOT_HISTORY) for hour, acc in partial.items()]
    merged: list[PricePiece] = []
    for piece in sorted(pieces, key=lambda p: p.start):
        prev = merged[-1] if merged else None
        if prev is not None and prev.end == piece.start and abs(prev.usd_per_hour - piece.usd_per_hour) < 1e-9:
            merged[-1] = PricePiece(prev.start, piece.end, prev.usd_per_hour, SPOT_HISTORY)
        else:
            merged.append(piece)
    return merged


def _floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _ceil_hour(t: datetime) -> datetime:
    floor = _floor_hour(t)
    return floor if floor == t else floor + HOUR


def _minus(piece: PricePiece, billed: list[PricePiece]) -> list[PricePiece]:
    """What of `piece` no billed piece covers (billed pieces are in time order and do not overlap)."""
    left: list[PricePiece] = []
    at = piece.start
    for b in billed:
        if b.end <= at or b.start >= piece.end:
            continue
        if b.start > at:
            left.append(PricePiece(at, b.start, piece.usd_per_hour, piece.source))
        at = max(at, b.end)
    if at < piece.end:
        left.append(PricePiece(at, piece.end, piece.usd_per_hour, piece.source))
    return left
