"""Where the timeline's buckets come from, and its device path.

`reads` plans the rollup rows of a span in buckets of an hour or a day (hourly rows, whole days' daily rows, the
hours of partial days). The device path sums rows of single GPUs (with their slices and free capacity) from
the device rollups; rows of whole instances read the per-instance rollups instead (instance_series.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from ..models import UTIL_BOUNDS
from .fleet import Fleet, layout_known
from .states import Thresholds
from .window import DAY, HOUR, floor_day

# The devices go into the query as arrays: per device its id, its class and when it should have sent data (`lo`,
# `hi`, epoch s; 0 for a slice); per class (devices alike in row, weight, price and part in free capacity, 1-based)
# its row, `w` weighing seconds into GPU-seconds (0 for a MIG GPU: its own seconds are capacity), `wr`/`wn` = w x
# price / w x (1 if unpriced), and `c` (1 for a MIG GPU of known layout, -weight for its slices; `cr`/`cn` times
# price / unpriced), whose sum over a GPU's devices is its unpartitioned seconds. Summing per class first keeps
# the per-row work to six sums.
DEVICE_ARRAYS = (("ids", "int4"), ("cl", "int4"), ("lo", "float8"), ("hi", "float8"))
CLASS_ARRAYS = (("r", "int4"), *((name, "float8") for name in ("w", "wr", "wn", "c", "cr", "cn")))
Span = tuple[int, datetime, datetime]
"""(row index, from, to): when a GPU should have sent data."""


def device_arrays(
    fleet: Fleet, *, start: datetime, end: datetime, now: datetime, row_of: Mapping[int, int] | None
) -> tuple[dict[str, list[Any]], list[Span]]:
    """Query parameters for the devices of the GPUs in `row_of` (GPU pk -> row index; None: every GPU, row 0),
    and each GPU's expected span: [max(start, first seen), min(end, now, tracked until))."""
    devices: list[tuple[int, int, float, float]] = []
    classes: dict[tuple[int, float, float | None, float], int] = {}
    spans: list[Span] = []

    def add(pk: int, key: tuple[int, float, float | None, float], lo: float = 0.0, hi: float = 0.0) -> None:
        devices.append((pk, classes.setdefault(key, len(classes) + 1), lo, hi))

    slices_by_gpu = fleet.slices_by_gpu
    for gpu in fleet.gpus.values():
        r = 0 if row_of is None else row_of.get(gpu.pk)
        if r is None:
            continue
        rate = gpu.instance.price.usd_per_gpu_hour
        lo, hi = max(start, gpu.first_seen), min(end, now, gpu.instance.tracked_until)
        lo_s = hi_s = 0.0
        if hi > lo:
            spans.append((r, lo, hi))
            lo_s, hi_s = lo.timestamp(), hi.timestamp()
        slices = slices_by_gpu.get(gpu.pk, ())
        if not gpu.mig_mode and not slices:
            add(gpu.pk, (r, 1.0, rate, 0.0), lo_s, hi_s)
            continue
        known = layout_known(gpu, slices)
        add(gpu.pk, (r, 0.0, rate, 1.0 if known else 0.0), lo_s, hi_s)
        for sl in slices:
            if sl.compute_slices is not None:
                weight = sl.compute_slices / 7
                add(sl.pk, (r, weight, rate, -weight if known else 0.0))
    params: dict[str, list[Any]] = {name: [] for name, _type in (*DEVICE_ARRAYS, *CLASS_ARRAYS)}
    for device in devices:
        for (name, _type), value in zip(DEVICE_ARRAYS, device, strict=True):
            params[name].append(value)
    for r, w, rate, c in classes:
        price, unpriced = (0.0, 1.0) if rate is None else (rate, 0.0)
        values = (r, w, w * price, w * unpriced, c, c * price, c * unpriced)
        for (name, _type), value in zip(CLASS_ARRAYS, values, strict=True):
            params[name].append(value)
    return params, spans


HOURLY = "hourly"
DAILY = "daily"
PARTIAL = "partial"
"""Hours of a partial day, summed into their day's bucket."""
Read = tuple[str, datetime, datetime]
"""(HOURLY, DAILY or PARTIAL, from, to): rollup rows over [from, to)."""

_SOURCES = {
    HOURLY: ("rollups_hourly", "hour", "hour", 3600),
    DAILY: ("rollups_daily", "day", "day", 86400),
    PARTIAL: ("rollups_hourly", "hour", "date_trunc('day', hour, 'UTC')", 3600),
}


def check_bound(thresholds: Thresholds) -> int:
    """The idle threshold, %; ValueError when the rollups keep no histogram bound for it."""
    bound = thresholds.idle_util_pct
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound ({', '.join(map(str, UTIL_BOUNDS))})")
    return bound


# Per (class, bucket): seconds active, held (idle-held), idle, unk (unknown), secs (covered), and own: a GPU's
# own seconds, capped at those it was expected to report in the rollup row's hour or day.
SUMS = {
    "active": "greatest(u.k - u.lt, 0)",
    "held": "greatest(u.lt - u.fr, 0)",
    "idle": "greatest(u.fr, 0)",
    "unk": "greatest(u.secs - u.k, 0)",
    "secs": "u.secs",
    "own": "least(u.secs, greatest(least(u.te + u.len, d.hi) - greatest(u.te, d.lo), 0))",
}


@lru_cache(maxsize=64)
def grouped_sql(bound: int, kinds: tuple[str, ...], sums: tuple[str, ...], outer: str) -> str:
    """One query: the rollup rows of each read, joined to the devices and summed per (class, bucket) in seconds
    (`sums`, names of SUMS), then `outer`, a query over `x`: those sums per class and bucket (b), with the class's
    row (r) and coefficients. Every row of the span is read and the devices not asked for dropped by the join:
    a page of GPUs has rows on as many pages of the table as the whole fleet."""
    parts = []
    for n, kind in enumerate(kinds):
        table, time_col, bucket, length = _SOURCES[kind]
        parts.append(
            f"SELECT device_id, {bucket} AS b, date_part('epoch', {time_col}) AS te, {length} AS len, secs, "
            f"util_known_s AS k, util_lt{bound}_s AS lt, free_lt{bound}_s AS fr FROM {table} "
            f"WHERE {time_col} >= :a{n} AND {time_col} < :b{n}"
        )
    devices = ", ".join(f"CAST(:{name} AS {t}[])" for name, t in DEVICE_ARRAYS)
    coefficients = ", ".join(f"(CAST(:{name} AS {t}[]))[cl] AS {name}" for name, t in CLASS_ARRAYS)
    # Grouped by id so the planner knows the ids are unique: it then hashes the devices, not the rollup rows.
    return (
        "WITH d AS (SELECT id, min(cl) AS cl, min(lo) AS lo, min(hi) AS hi "
        f"FROM unnest({devices}) AS d(id, cl, lo, hi) GROUP BY id), "
        f"u AS ({' UNION ALL '.join(parts)}), "
        f"i AS (SELECT d.cl, u.b, {', '.join(f'sum({SUMS[name]}) AS {name}' for name in sums)} "
        "FROM u JOIN d ON d.id = u.device_id GROUP BY d.cl, u.b), "
        f"x AS (SELECT i.*, {coefficients} FROM i) "
        f"{outer}"
    )


def reads(start: datetime, end: datetime, now: datetime, step: timedelta) -> list[Read]:
    """The rollup rows that make up [start, end) in buckets of `step`."""
    if step == HOUR:
        return [(HOURLY, start, end)]
    today = floor_day(now)
    if end > now and start <= today:
        end = max(end, today + DAY)
    out: list[Read] = []
    day = floor_day(start)
    while day < end:
        lo, hi = max(start, day), min(end, day + DAY)
        if lo == day and hi == day + DAY:
            if out and out[-1][0] == DAILY and out[-1][2] == day:
                out[-1] = (DAILY, out[-1][1], hi)
            else:
                out.append((DAILY, day, hi))
        else:
            out.append((PARTIAL, lo, hi))
        day += DAY
    return out


def read_params(rs: Sequence[Read]) -> dict[str, datetime]:
    params: dict[str, datetime] = {}
    for n, (_kind, a, b) in enumerate(rs):
        params[f"a{n}"], params[f"b{n}"] = a, b
    return params


# In the order of BucketFigures' fields, in hours and USD. Unpartitioned capacity (its seconds x c) is floored
# per row and bucket; offline hours start as minus the covered ones.
FREE, FREE_COST, FREE_UNPRICED = (
    "greatest(sum(secs * c), 0)",
    "greatest(sum(secs * cr), 0)",
    "greatest(sum(secs * cn), 0)",
)
TIMELINE_SQL = (
    "SELECT r, b, "
    + ", ".join(
        f"CAST(({s}) / 3600 AS float8)"
        for s in (
            "sum(active * w)",
            "sum(held * w)",
            "sum(idle * w)",
            FREE,
            "sum(unk * w)",
            "-sum(own)",
            f"sum(secs * wr) + {FREE_COST}",
            f"sum(idle * wr) + {FREE_COST}",
            "sum(held * wr)",
            f"sum(secs * wn) + {FREE_UNPRICED}",
        )
    )
    + " FROM x GROUP BY r, b"
)
