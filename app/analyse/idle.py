"""Idle passthrough GPUs: GPUs not in MIG mode, online, with no activity for at least `idle_min_hours`.

An idle stretch runs from the end of the last hour with any activity (or any unknown utilization) to now.
It is found from the rollups: the last busy day from the daily rows, then the last busy hour of that day from
the hourly rows, so the lookup reads a few rows per GPU however long the stretch. "Since" is therefore exact
to the hour: an hour with a single busy interval counts as busy. Offline time inside a stretch does not end
it, but is not counted (or priced) as idle.
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
from .states import IDLE, IDLE_HELD, Thresholds

LOOKBACK = timedelta(days=90)
"""How far back a stretch is followed; a longer one shows as idle since this horizon."""


@dataclass(frozen=True)
class IdleGpu:
    gpu: GpuInfo
    since: datetime
    """Start of the idle stretch (exact to the hour)."""
    idle_s: float
    """Seconds of data in the stretch (idle + idle-held), s."""
    held_s: float
    """Of which idle-held, s."""
    state: str
    """idle or idle-held, from the newest sample."""
    latest: Latest | None
    capped: bool
    """The stretch reaches the lookback horizon: it is at least this long."""

    @property
    def idle_hours(self) -> float:
        return self.idle_s / 3600

    @property
    def usd_per_hour(self) -> float | None:
        return self.gpu.instance.price.usd_per_gpu_hour

    @property
    def burned_usd(self) -> float | None:
        """Cost of the stretch so far, USD; None without a price."""
        rate = self.usd_per_hour
        return None if rate is None else rate * self.idle_hours

    @property
    def usd_per_day(self) -> float | None:
        """What it costs per day while it stays like this, USD/day."""
        rate = self.usd_per_hour
        return None if rate is None else rate * 24


@lru_cache(maxsize=len(UTIL_BOUNDS))
def _stretch_sql(bound: int) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    below = f"util_lt{bound}_s"
    free = f"free_lt{bound}_s"
    busy = f"secs - {below} > 0.5"
    return (
        "WITH d AS (SELECT device_id, max(day) FILTER (WHERE " + busy + ") AS busy_day "
        "FROM rollups_daily WHERE device_id = ANY(:ids) AND day >= :horizon GROUP BY device_id), "
        "h AS (SELECT r.device_id, max(r.hour) FILTER (WHERE r." + busy + ") AS busy_hour "
        "FROM rollups_hourly r JOIN d ON d.device_id = r.device_id "
        "WHERE r.device_id = ANY(:ids) AND r.hour >= d.busy_day AND r.hour < d.busy_day + interval '1 day' "
        "GROUP BY r.device_id), "
        "s AS (SELECT d.device_id, coalesce(h.busy_hour + interval '1 hour', d.busy_day + interval '1 day', "
        ":horizon) AS since FROM d LEFT JOIN h ON h.device_id = d.device_id), "
        "hh AS (SELECT r.device_id, sum(r." + below + ") AS below, sum(r." + free + ") AS free "
        "FROM rollups_hourly r JOIN s ON s.device_id = r.device_id "
        "WHERE r.device_id = ANY(:ids) AND r.hour >= s.since "
        "AND r.hour < date_trunc('day', s.since) + interval '1 day' GROUP BY r.device_id), "
        "dd AS (SELECT r.device_id, sum(r." + below + ") AS below, sum(r." + free + ") AS free "
        "FROM rollups_daily r JOIN s ON s.device_id = r.device_id "
        "WHERE r.device_id = ANY(:ids) AND r.day >= date_trunc('day', s.since) + interval '1 day' "
        "GROUP BY r.device_id) "
        "SELECT s.device_id, s.since, coalesce(hh.below, 0) + coalesce(dd.below, 0), "
        "coalesce(hh.free, 0) + coalesce(dd.free, 0) "
        "FROM s LEFT JOIN hh ON hh.device_id = s.device_id LEFT JOIN dd ON dd.device_id = s.device_id"
    )


def idle_stretches(
    session: Session, gpu_ids: Sequence[int], *, now: datetime, idle_util_pct: int
) -> dict[int, tuple[datetime, float, float, bool]]:
    """Per GPU: (since, idle seconds, idle-held seconds, capped at the lookback)."""
    if not gpu_ids:
        return {}
    horizon = (now - LOOKBACK).replace(hour=0, minute=0, second=0, microsecond=0)
    out: dict[int, tuple[datetime, float, float, bool]] = {}
    rows = session.execute(text(_stretch_sql(idle_util_pct)), {"ids": list(gpu_ids), "horizon": horizon}).all()
    for device_id, since, below, free in rows:
        out[device_id] = (since, float(below), float(below) - float(free), since <= horizon)
    return out


def idle_gpus(
    session: Session, fleet: Fleet, latest: dict[int, Latest], *, now: datetime, thresholds: Thresholds
) -> list[IdleGpu]:
    """Passthrough GPUs idle now for at least `idle_min_hours`, longest stretch first."""
    candidates = [
        gpu
        for gpu in fleet.gpus.values()
        if not gpu.mig_mode
        and gpu.instance.status == ONLINE
        and gpu.pk in latest
        and latest[gpu.pk].state in (IDLE, IDLE_HELD)
    ]
    stretches = idle_stretches(session, [g.pk for g in candidates], now=now, idle_util_pct=thresholds.idle_util_pct)
    out = []
    min_span = timedelta(hours=thresholds.idle_min_hours)
    for gpu in candidates:
        found = stretches.get(gpu.pk)
        if found is None:
            continue
        since, idle_s, held_s, capped = found
        since = max(since, gpu.first_seen)
        if now - since < min_span:
            continue
        out.append(IdleGpu(gpu, since, idle_s, held_s, latest[gpu.pk].state, latest[gpu.pk], capped))
    out.sort(key=lambda g: (g.since, -(g.burned_usd or 0.0)))
    return out
