"""What each instance costs now, and where that price comes from: the order of docs/billing.md ("How each price is
chosen") applied to the present hour.

In order: the price piece (app/billing/prices.py) covering the current UTC hour, billed or spot history (a spot
pool's last price read holds until the next read, so its history usually reaches now); else the newest billed
piece that ended within `BILL_LAG` before now, since the imported bill lags about a day behind, unless that
piece was in paid capacity (a Capacity Block ends; what follows is priced otherwise); else the
instance's own price (agent, price file, catalog: app/pricing) and its kind. The pieces of every instance asked
for come from one read (`read_pieces`), never one per instance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy.orm import Session

from ..billing.pieces_memo import kept_pieces
from ..billing.prices import BILLED, PricedInstance, PricePiece
from .fleet import InstanceInfo
from .priced import per_gpu_hour
from .window import HOUR, floor_hour

BILL_LAG = timedelta(hours=72)
"""How far back the newest billed hour may lie and still stand for the price now."""


# A named tuple: a scrape or a page builds one per instance.
class PriceNow(NamedTuple):
    """An instance's price now."""

    usd_per_instance_hour: float | None
    """The whole instance, USD/h; None when unknown."""
    usd_per_gpu_hour: float | None
    """USD per GPU-hour; None means no price (never 0 for unknown)."""
    source: str | None
    """Its kind: "billed", "spot history", "agent", "price file" or "catalog"; None without a price."""
    detail: str
    """Where it came from, in words for a page: "billed", "spot history", "billed to <end of the newest billed
    hour> UTC", or the own price's source ("catalog on-demand - 10% enterprise"), which says why when there is
    no price."""

    @property
    def known(self) -> bool:
        """Whether there is a price per GPU-hour."""
        return self.usd_per_gpu_hour is not None


def own_price(inst: InstanceInfo) -> PriceNow:
    """The instance's own price (agent, price file, catalog), as a price now."""
    p = inst.price
    return PriceNow(p.usd_per_instance_hour, p.usd_per_gpu_hour, p.kind, p.source)


def read_pieces(
    session: Session, instances: Iterable[InstanceInfo], now: datetime, since: datetime | None = None
) -> dict[int, list[PricePiece]]:
    """The instances' price pieces (by pk, in time order) over what `price_at` needs of them, from
    `BILL_LAG` before the current hour (or from `since`, if earlier) to the end of the current hour. One read per
    change to the prices (app/billing/pieces_memo.py)."""
    hour = floor_hour(now)
    start = hour - BILL_LAG if since is None else min(floor_hour(since), hour - BILL_LAG)
    wanted = [PricedInstance(i.pk, i.instance_id, i.lifecycle, i.instance_type, i.availability_zone) for i in instances]
    return kept_pieces(session, wanted, start, hour + HOUR)


def price_at(inst: InstanceInfo, pieces: Sequence[PricePiece], now: datetime) -> PriceNow:
    """The instance's price now from its pieces (time-ordered, not overlapping, as `read_pieces` gives them). A
    piece whose price per GPU is unknown (the instance's GPU count is) gives way to the own price, which then has
    none either and says why."""
    hour = floor_hour(now)
    newest_billed: PricePiece | None = None
    for piece in pieces:
        if piece.start <= hour < piece.end:
            return _of_piece(inst, piece, piece.source)
        if piece.source == BILLED and now - BILL_LAG <= piece.end <= hour:
            # A Capacity Block or Reservation the bill shows ending says nothing of what the instance costs after.
            newest_billed = None if piece.paid_offline else piece
    if newest_billed is not None:
        return _of_piece(inst, newest_billed, f"{BILLED} to {newest_billed.end:%Y-%m-%d %H:%M} UTC")
    return own_price(inst)


def _of_piece(inst: InstanceInfo, piece: PricePiece, detail: str) -> PriceNow:
    rate = per_gpu_hour(inst, piece.usd_per_hour)
    if rate is None:
        return own_price(inst)
    return PriceNow(piece.usd_per_hour, rate, piece.source, detail)


def prices_now(session: Session, instances: Iterable[InstanceInfo], now: datetime) -> dict[int, PriceNow]:
    """Each instance's price now, by pk (every instance given has one, priced or not). One read of the pieces."""
    wanted = list(instances)
    pieces = read_pieces(session, wanted, now)
    return {i.pk: price_at(i, pieces.get(i.pk, ()), now) for i in wanted}


def price_of(inst: InstanceInfo, prices: Mapping[int, PriceNow] | None) -> PriceNow:
    """The instance's price now from `prices` (as `prices_now` gives them), or its own price where `prices` is
    None or lacks it."""
    found = prices.get(inst.pk) if prices is not None else None
    return found if found is not None else own_price(inst)


def mean_price(
    inst: InstanceInfo, pieces: Sequence[PricePiece], start: datetime, end: datetime
) -> tuple[float | None, dict[str, float]]:
    """The time-weighted mean price over [start, end), USD per GPU-hour: the pieces' prices where they cover the
    time, the instance's own price elsewhere. Time with no price (no own price and no piece) counts in the
    length but adds no dollars, so hours spread evenly over the span leave its unpriced share out of the money
    rather than price it. Also each price source's share of that mean (USD per GPU-hour by kind). (None, {})
    when no part of the span has a price, or the span is empty."""
    span = (end - start).total_seconds()
    if span <= 0:
        return None, {}
    own = inst.price.usd_per_gpu_hour
    usd: dict[str, float] = {}  # USD per GPU-hour x seconds, by source
    covered = 0.0
    for piece in pieces:
        a, b = max(piece.start, start), min(piece.end, end)
        if b <= a:
            continue
        seconds = (b - a).total_seconds()
        covered += seconds
        rate = per_gpu_hour(inst, piece.usd_per_hour)
        if rate is not None:
            usd[piece.source] = usd.get(piece.source, 0.0) + rate * seconds
    kind = inst.price.kind
    if own is not None and kind is not None and span - covered > 0:
        usd[kind] = usd.get(kind, 0.0) + own * (span - covered)
    if not usd:
        return None, {}
    by_source = {k: v / span for k, v in sorted(usd.items(), key=lambda kv: -kv[1])}
    return sum(by_source.values()), by_source
