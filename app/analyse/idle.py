"""Idle passthrough GPUs: GPUs not in MIG mode, online, with no activity for at least `idle_min_hours`.

An idle stretch runs from the end of the last interval with activity (or with unknown utilization) to now.
The ingest path keeps, per device and per threshold, that moment and the seconds of data since
(`device_status`), so the list reads one row per GPU however long the stretch. Offline time inside a
stretch does not end it, but is not counted (or priced) as idle.

Money is priced hour by hour where the bill or the spot price history knows the price (app/analyse/price_now.py):
what a stretch burned is its idle hours x the time-weighted mean price over the stretch, and what it costs per
hour and per day is at the price now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..models import UTIL_BOUNDS
from .fleet import ONLINE, Fleet, GpuInfo
from .now import Latest
from .price_now import PriceNow, mean_price, price_at, read_pieces
from .states import IDLE, IDLE_HELD, Thresholds


@dataclass(frozen=True)
class IdleGpu:
    gpu: GpuInfo
    since: datetime
    """Start of the idle stretch: the end of the last busy interval, or when the GPU was first seen."""
    idle_s: float
    """Seconds of data in the stretch (idle + idle-held), s."""
    held_s: float
    """Of which idle-held, s."""
    state: str
    """idle or idle-held, from the newest sample."""
    latest: Latest | None
    price: PriceNow
    """Its instance's price now."""
    burned_usd: float | None
    """Cost of the stretch so far, USD: hours idle x the time-weighted mean price over [since, now] in USD per
    GPU-hour (price pieces where the bill or spot history knows the price, the instance's own price elsewhere);
    None without a price."""
    burned_sources: tuple[str, ...] = ()
    """The kinds of price in `burned_usd`, largest share first ("billed", "spot history", "catalog", ...)."""

    @property
    def idle_hours(self) -> float:
        return self.idle_s / 3600

    @property
    def usd_per_hour(self) -> float | None:
        """What it costs per hour now, USD per GPU-hour (USD/h: it is one GPU)."""
        return self.price.usd_per_gpu_hour

    @property
    def price_source(self) -> str | None:
        """The kind of its price now; None without one."""
        return self.price.source

    @property
    def usd_per_day(self) -> float | None:
        """What it costs per day at the price now while it stays like this, USD/day."""
        rate = self.usd_per_hour
        return None if rate is None else rate * 24


@lru_cache(maxsize=len(UTIL_BOUNDS))
def _stretch_sql(bound: int) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    return (
        f"SELECT device_id, busy_until_{bound}, quiet_s_{bound}, quiet_free_s_{bound} "
        "FROM device_status WHERE device_id = ANY(CAST(:ids AS int4[]))"
    )


def idle_stretches(
    session: Session, gpu_ids: Sequence[int], *, idle_util_pct: int
) -> dict[int, tuple[datetime | None, float, float]]:
    """Per GPU: (end of its last busy interval or None if never busy, idle seconds since, idle-held seconds)."""
    if not gpu_ids:
        return {}
    rows = session.execute(text(_stretch_sql(idle_util_pct)), {"ids": list(gpu_ids)}).all()
    return {d: (busy, float(quiet), float(quiet) - float(free)) for d, busy, quiet, free in rows}


def idle_gpus(
    session: Session, fleet: Fleet, latest: dict[int, Latest], *, now: datetime, thresholds: Thresholds
) -> list[IdleGpu]:
    """Passthrough GPUs idle now for at least `idle_min_hours`, longest stretch first, each priced over its
    stretch and now from one read of the price pieces of their instances."""
    candidates = [
        gpu
        for gpu in fleet.gpus.values()
        if not gpu.mig_mode
        and gpu.instance.status == ONLINE
        and gpu.pk in latest
        and latest[gpu.pk].state in (IDLE, IDLE_HELD)
    ]
    stretches = idle_stretches(session, [g.pk for g in candidates], idle_util_pct=thresholds.idle_util_pct)
    listed: list[tuple[GpuInfo, datetime, float, float]] = []
    min_span = timedelta(hours=thresholds.idle_min_hours)
    for gpu in candidates:
        found = stretches.get(gpu.pk)
        if found is None:
            continue
        busy_until, idle_s, held_s = found
        since = busy_until if busy_until is not None else gpu.first_seen
        if now - since < min_span:
            continue
        listed.append((gpu, since, idle_s, held_s))
    if not listed:
        return []
    instances = {item[0].instance.pk: item[0].instance for item in listed}
    pieces = read_pieces(session, instances.values(), now, since=min(item[1] for item in listed))
    now_prices = {pk: price_at(inst, pieces.get(pk, ()), now) for pk, inst in instances.items()}
    out = []
    for gpu, since, idle_s, held_s in listed:
        rate, sources = mean_price(gpu.instance, pieces.get(gpu.instance.pk, ()), since, now)
        burned = None if rate is None else rate * idle_s / 3600
        price = now_prices[gpu.instance.pk]
        sample = latest[gpu.pk]
        out.append(IdleGpu(gpu, since, idle_s, held_s, sample.state, sample, price, burned, tuple(sources)))
    out.sort(key=lambda g: (g.since, -(g.burned_usd or 0.0)))
    return out
