"""Time series of one instance's devices for charts: utilization, memory and power over the window.

Windows up to a day read raw samples averaged into buckets of a few hundred per chart; longer ones read the
hourly rollups. A bucket with no sample is absent, so a chart shows a gap rather than a line across it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from .window import Window

RAW_UP_TO = timedelta(days=1)
TARGET_POINTS = 480
_STEPS = (10, 15, 30, 60, 120, 180, 300, 600, 900, 1800, 3600)


@dataclass(frozen=True)
class Point:
    ts: datetime
    util: float | None
    """%"""
    mem_used_mib: float | None
    power_w: float | None


def series_step(window: Window, interval_s: float | None) -> int:
    """Bucket length, s: about TARGET_POINTS per chart, never finer than the agent's interval."""
    span = (window.end - window.start).total_seconds()
    if span > RAW_UP_TO.total_seconds():
        return 3600
    want = max(span / TARGET_POINTS, interval_s or 10)
    return next((s for s in _STEPS if s >= want), 3600)


_RAW_SQL = (
    "SELECT device_id, date_bin(make_interval(secs => :step), ts, :origin) AS b, avg(util), avg(mem_used_mib), "
    "avg(power_w) FROM samples WHERE device_id = ANY(:ids) AND ts >= :t0 AND ts < :t1 GROUP BY 1, 2 ORDER BY 1, 2"
)
_HOURLY_SQL = (
    "SELECT device_id, hour, util_sum / nullif(util_known_s, 0), mem_sum / nullif(mem_known_s, 0), "
    "power_sum / nullif(power_known_s, 0) FROM rollups_hourly "
    "WHERE device_id = ANY(:ids) AND hour >= :t0 AND hour < :t1 ORDER BY 1, 2"
)


def device_series(
    session: Session, device_ids: Sequence[int], window: Window, *, step_s: int
) -> dict[int, list[Point]]:
    """Points per device, in time order."""
    if not device_ids:
        return {}
    params = {"ids": list(device_ids), "t0": window.start, "t1": window.end}
    if step_s >= 3600:
        sql = _HOURLY_SQL
    else:
        sql = _RAW_SQL
        params.update(step=step_s, origin=window.start)
    out: dict[int, list[Point]] = {d: [] for d in device_ids}
    for device_id, ts, util, mem, power in session.execute(text(sql), params):
        out[device_id].append(
            Point(
                ts,
                None if util is None else float(util),
                None if mem is None else float(mem),
                None if power is None else float(power),
            )
        )
    return out
