"""Time series of one instance's devices for charts: utilization, memory and power over the window.

Where the points come from depends on the window: an hour or less reads raw samples (a one-hour slice of a
day's partition is small enough to scan); up to a day reads the 5-minute rollups; longer windows read the
hourly rollups. Either way a chart has at most a few hundred points per device, and a bucket with no data is
absent, so the chart shows a gap rather than a line drawn across it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from ..db import fetch_binary
from .window import Window

RAW_UP_TO = timedelta(hours=1)
FIVE_MINUTES_UP_TO = timedelta(days=1)
_RAW_STEPS = (10, 15, 20, 30, 60)


@dataclass(frozen=True, slots=True)
class DevicePoints:
    """One device's points in time order, as columns of the same length (a day at 5 minutes is 288 points
    per device, and a p5 in MIG mode has 64 devices). None where the figure was not measured."""

    ts: list[datetime]
    util: list[float | None]
    """%"""
    mem_used_mib: list[float | None]
    power_w: list[float | None]

    def __len__(self) -> int:
        return len(self.ts)


def series_step(window: Window, interval_s: float | None) -> int:
    """Point spacing, s: the agent's interval (at least 10 s) for raw samples, 300 or 3600 for rollups."""
    span = window.end - window.start
    if span > FIVE_MINUTES_UP_TO:
        return 3600
    if span > RAW_UP_TO:
        return 300
    want = max(interval_s or 10, 10)
    return next((s for s in _RAW_STEPS if s >= want), 60)


# Ids go in as int4[]: psycopg sends small Python ints as int2, and the int4 BRIN bloom index on samples
# does not apply to an int2 comparison.
_RAW_SQL = (
    "SELECT device_id, date_bin(make_interval(secs => :step), ts, :origin) AS b, CAST(avg(util) AS float8), "
    "CAST(avg(mem_used_mib) AS float8), CAST(avg(power_w) AS float8) FROM samples "
    "WHERE device_id = ANY(CAST(:ids AS int4[])) AND ts >= :t0 AND ts < :t1 GROUP BY 1, 2 ORDER BY 1, 2"
)
_ROLLUP_SQL = (
    "SELECT device_id, {time}, CAST(util_sum / nullif(util_known_s, 0) AS float8), "
    "CAST(mem_sum / nullif(mem_known_s, 0) AS float8), CAST(power_sum / nullif(power_known_s, 0) AS float8) "
    "FROM {table} WHERE device_id = ANY(CAST(:ids AS int4[])) AND {time} >= :t0 AND {time} < :t1 ORDER BY 1, 2"
)


def device_series(
    session: Session, device_ids: Sequence[int], window: Window, *, step_s: int
) -> dict[int, DevicePoints]:
    """Points per device (every device asked for; no points where none came)."""
    if not device_ids:
        return {}
    params: dict[str, object] = {"ids": list(device_ids), "t0": window.start, "t1": window.end}
    if step_s >= 3600:
        sql = _ROLLUP_SQL.format(table="rollups_hourly", time="hour")
    elif step_s >= 300:
        sql = _ROLLUP_SQL.format(table="rollups_5m", time="bucket")
    else:
        sql = _RAW_SQL
        params.update(step=step_s, origin=window.start)
    out = {d: DevicePoints([], [], [], []) for d in device_ids}
    for device_id, ts, util, mem, power in fetch_binary(session, sql, params):
        points = out[device_id]
        points.ts.append(ts)
        points.util.append(util)
        points.mem_used_mib.append(mem)
        points.power_w.append(power)
    return out
