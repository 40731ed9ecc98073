"""Seconds per device and state over a window, summed from the rollups in one query.

`Window.rollup_reads` says which rows: whole days from `rollups_daily`, the hours around them from
`rollups_hourly`, some of them subtracted (a day's row minus the hours outside the window). Every column read
is a sum, so rows add and subtract exactly. No join: what a device is (GPU, slice, whose) comes from the
inventory, in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .window import RollupRead, Window, union_of_reads

_COLUMNS = (
    "secs",
    "util_known_s",
    "util_sum",
    "util_lt{b}_s",
    "free_lt{b}_s",
    "no_proc_s",
)


class DeviceUsage(NamedTuple):
    """One device's figures over a window; all in seconds except the sums. A tuple: thousands are read per
    page view, straight from the query's rows."""

    device_id: int
    covered_s: float
    util_known_s: float
    util_sum: float
    """Utilization x seconds over the seconds with a figure, %*s."""
    below_s: float
    """Seconds with utilization under the idle threshold (idle + idle-held)."""
    free_s: float
    """Seconds under the threshold with no process and memory under the held bound (idle)."""
    no_proc_s: float


@lru_cache(maxsize=64)
def _usage_sql(bound: int, shape: tuple[tuple[str, int], ...], filtered: bool) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    names = [c.format(b=bound) for c in _COLUMNS]
    device_filter = "device_id = ANY(CAST(:ids AS int4[]))" if filtered else ""
    rows = union_of_reads(shape, ("rollups_daily", "rollups_hourly"), "device_id", names, device_filter)
    sums = ", ".join(f"CAST(COALESCE(sum({n}), 0) AS float8)" for n in names)
    return f"SELECT device_id, {sums} FROM ({rows}) r GROUP BY device_id"


def window_usage(
    session: Session, window: Window, *, idle_util_pct: int, device_ids: Sequence[int] | None = None
) -> dict[int, DeviceUsage]:
    """Per-device usage in the window; `device_ids` narrows the read (None: every device)."""
    return usage_of_reads(session, window.rollup_reads(), idle_util_pct=idle_util_pct, device_ids=device_ids)


def usage_of_reads(
    session: Session, reads: Sequence[RollupRead], *, idle_util_pct: int, device_ids: Sequence[int] | None = None
) -> dict[int, DeviceUsage]:
    if not reads:
        return {}
    params: dict[str, Any] = {}
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    if device_ids is not None:
        if not device_ids:
            return {}
        params["ids"] = list(device_ids)
    shape = tuple((r.table, r.sign) for r in reads)
    sql = _usage_sql(idle_util_pct, shape, device_ids is not None)
    out: dict[int, DeviceUsage] = {}
    make = DeviceUsage._make
    for row in fetch_binary(session, sql, params):
        out[row[0]] = make(row)
    return out


def mig_mode_at(changes: Sequence[tuple[Any, bool]], hour: Any) -> bool:
    """Whether a GPU was in MIG mode in the hour starting at `hour`, by its (time, mig_mode) changes in the window,
    in time order: before its first change it was in the other mode."""
    mig = not changes[0][1]
    for at, mode in changes:
        if at <= hour:
            mig = mode
    return mig


def hourly_split(
    session: Session,
    window: Window,
    device_ids: Sequence[int],
    *,
    idle_util_pct: int,
    mode_at: dict[int, list[tuple[Any, bool]]],
) -> dict[int, tuple[DeviceUsage, DeviceUsage]]:
    """(MIG-mode part, passthrough part) of each device's usage, hour by hour, for GPUs whose MIG mode changed
    in the window; `mode_at[device]` lists (time, mig_mode) changes in time order."""
    if not device_ids:
        return {}
    names = [c.format(b=idle_util_pct) for c in _COLUMNS]
    sql = (
        f"SELECT device_id, hour, {', '.join(names)} FROM rollups_hourly "
        "WHERE device_id = ANY(CAST(:ids AS int4[])) AND hour >= :a AND hour < :b"
    )
    sums: dict[tuple[int, bool], list[float]] = {}
    rows = session.execute(text(sql), {"ids": list(device_ids), "a": window.start, "b": window.end}).all()
    for device_id, hour, *values in rows:
        acc = sums.setdefault((device_id, mig_mode_at(mode_at[device_id], hour)), [0.0] * len(names))
        for i, v in enumerate(values):
            acc[i] += float(v or 0.0)
    zero = [0.0] * len(names)
    return {
        d: (
            DeviceUsage(d, *sums.get((d, True), zero)),
            DeviceUsage(d, *sums.get((d, False), zero)),
        )
        for d in device_ids
    }
