"""Seconds per device and state over a window, read from the rollups in one query.

Whole days come from `rollups_daily` and the hours around them from `rollups_hourly` (see
`Window.rollup_ranges`). The query also splits each GPU's time into MIG and passthrough periods: a period in
which the GPU has slices, or a GPU in MIG mode now, is MIG time, and the part of that time no slice covers
(weighted by compute slices out of 7) is unpartitioned capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..models import UTIL_BOUNDS
from .window import Window


@dataclass(frozen=True)
class DeviceUsage:
    """One device's figures over a window; all in seconds except the sums. For a GPU, `mig` tells which
    part of its time this is (a GPU can have both rows if its MIG mode changed in the window)."""

    device_id: int
    mig: bool
    covered_s: float
    util_known_s: float
    util_sum: float
    """Utilization x seconds over the seconds with a figure, %*s."""
    below_s: float
    """Seconds with utilization under the idle threshold (idle + idle-held)."""
    free_s: float
    """Seconds under the threshold with no process and memory under the held bound (idle)."""
    no_proc_s: float
    mem_known_s: float
    mem_sum: float
    power_known_s: float
    power_sum: float
    unpartitioned_s: float
    """MIG time no slice covered, in GPU-seconds."""

    @property
    def active_s(self) -> float:
        return max(0.0, self.util_known_s - self.below_s)

    @property
    def idle_held_s(self) -> float:
        return max(0.0, self.below_s - self.free_s)

    @property
    def idle_s(self) -> float:
        return self.free_s

    @property
    def unknown_s(self) -> float:
        return max(0.0, self.covered_s - self.util_known_s)


@lru_cache(maxsize=len(UTIL_BOUNDS) * 4)
def _usage_sql(bound: int, daily: bool, hour_ranges: int, filtered: bool) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    cols = (
        f"secs, util_known_s, util_sum, util_lt{bound}_s AS below_s, free_lt{bound}_s AS free_s, no_proc_s, "
        "mem_known_s, mem_sum, power_known_s, power_sum"
    )
    device_filter = " AND device_id = ANY(:ids)" if filtered else ""
    parts = []
    if daily:
        parts.append(
            f"SELECT device_id, day AS p, {cols} FROM rollups_daily WHERE day >= :d0 AND day < :d1{device_filter}"
        )
    for i in range(hour_ranges):
        parts.append(
            f"SELECT device_id, hour AS p, {cols} FROM rollups_hourly "
            f"WHERE hour >= :h{i}a AND hour < :h{i}b{device_filter}"
        )
    union = " UNION ALL ".join(parts)
    return (
        f"WITH r AS MATERIALIZED ({union}), "
        "s AS (SELECT m.gpu_pk, r.p, sum(r.secs * m.compute_slices) / 7.0 AS sliced "
        "FROM r JOIN mig_slices m ON m.id = r.device_id GROUP BY 1, 2) "
        "SELECT r.device_id, (s.gpu_pk IS NOT NULL OR coalesce(g.mig_mode, false)) AS mig, "
        "sum(r.secs), sum(r.util_known_s), sum(r.util_sum), sum(r.below_s), sum(r.free_s), sum(r.no_proc_s), "
        "sum(r.mem_known_s), sum(r.mem_sum), sum(r.power_known_s), sum(r.power_sum), "
        "sum(greatest(r.secs - coalesce(s.sliced, 0), 0)) "
        "FROM r LEFT JOIN s ON s.gpu_pk = r.device_id AND s.p = r.p "
        "LEFT JOIN gpus g ON g.id = r.device_id "
        "GROUP BY 1, 2"
    )


def window_usage(
    session: Session, window: Window, *, idle_util_pct: int, device_ids: Sequence[int] | None = None
) -> list[DeviceUsage]:
    """Per-device usage in the window; `device_ids` narrows the read (None: every device)."""
    days, hours = window.rollup_ranges()
    params: dict[str, Any] = {}
    if days is not None:
        params["d0"], params["d1"] = days
    for i, (a, b) in enumerate(hours):
        params[f"h{i}a"], params[f"h{i}b"] = a, b
    if device_ids is not None:
        if not device_ids:
            return []
        params["ids"] = list(device_ids)
    sql = _usage_sql(idle_util_pct, days is not None, len(hours), device_ids is not None)
    out = []
    for row in session.execute(text(sql), params):
        out.append(
            DeviceUsage(
                device_id=row[0],
                mig=row[1],
                covered_s=row[2] or 0.0,
                util_known_s=row[3] or 0.0,
                util_sum=row[4] or 0.0,
                below_s=row[5] or 0.0,
                free_s=row[6] or 0.0,
                no_proc_s=row[7] or 0.0,
                mem_known_s=row[8] or 0.0,
                mem_sum=row[9] or 0.0,
                power_known_s=row[10] or 0.0,
                power_sum=row[11] or 0.0,
                unpartitioned_s=float(row[12] or 0.0),
            )
        )
    return out
