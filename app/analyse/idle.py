"""Idle passthrough GPUs: GPUs not in MIG mode, online, with no activity for at least `idle_min_hours`.

An idle stretch runs from the end of the last interval with activity (or with unknown utilization) to now.
The ingest path keeps, per device and per threshold, that moment and the seconds of data since
(`device_status`), so the list reads one row per GPU however long the stretch. Offline time inside a
stretch does not end it, but is not counted (or priced) as idle.
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
    """Passthrough GPUs idle now for at least `idle_min_hours`, longest stretch first."""
    candidates = [
        gpu
        for gpu in fleet.gpus.values()
        if not gpu.mig_mode
        and gpu.instance.status == ONLINE
        and gpu.pk in latest
        and latest[gpu.pk].state in (IDLE, IDLE_HELD)
    ]
    stretches = idle_stretches(session, [g.pk for g in candidates], idle_util_pct=thresholds.idle_util_pct)
    out = []
    min_span = timedelta(hours=thresholds.idle_min_hours)
    for gpu in candidates:
        found = stretches.get(gpu.pk)
        if found is None:
            continue
        busy_until, idle_s, held_s = found
        since = busy_until if busy_until is not None else gpu.first_seen
        if now - since < min_span:
            continue
        out.append(IdleGpu(gpu, since, idle_s, held_s, latest[gpu.pk].state, latest[gpu.pk]))
    out.sort(key=lambda g: (g.since, -(g.burned_usd or 0.0)))
    return out
