"""Where the timeline's buckets come from, and its device path.

`reads` plans the rollup rows of a span in buckets of an hour or a day (hourly rows, whole days' daily rows, the
hours of partial days). The device path sums rows of single GPUs (with their slices and free capacity) from
the device rollups; rows of whole instances read the per-instance rollups instead (instance_series.py).

Each rollup row is priced at the price in force in its hour or day (app/analyse/series_prices.py): its instance's
price piece where one covers it, else the instance's own price. With pieces (`priced`), the rows are summed per
device class, bucket and price class, whose change of the own price is applied to those sums; a daily row of a
mixed instance-day (cut by a piece boundary) is left out and the day's hourly rows read in its place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from ..models import UTIL_BOUNDS
from .fleet import Fleet, layout_known
from .series_prices import DAY_SQL, MIXED_CTE, class_sql, of_class
from .states import Thresholds
from .window import DAY, HOUR, floor_day

# The devices go into the query as arrays: per device its id, its class, when it should have sent data (`lo`,
# `hi`, epoch s; 0 for a slice) and its instance's pk (`ipk`, for its price pieces); per class (devices alike in
# row, weight, own price and part in free capacity, 1-based) its row, `w` weighing seconds into GPU-seconds (0 for
# a MIG GPU: its own seconds are capacity), `wr`/`wn` = w x price / w x (1 if unpriced), and `c` (1 for a MIG GPU
# of known layout, -weight for its slices; `cr`/`cn` times price / unpriced), whose sum over a GPU's devices is its
# unpartitioned seconds. Summing per class first keeps the per-row work to six sums.
DEVICE_ARRAYS = (("ids", "int4"), ("cl", "int4"), ("lo", "float8"), ("hi", "float8"), ("ipk", "int8"))
CLASS_ARRAYS = (("r", "int4"), *((name, "float8") for name in ("w", "wr", "wn", "c", "cr", "cn")))
Span = tuple[int, datetime, datetime]
"""(row index, from, to): when a GPU should have sent data."""


def device_arrays(
    fleet: Fleet, *, start: datetime, end: datetime, now: datetime, row_of: Mapping[int, int] | None
) -> tuple[dict[str, list[Any]], list[Span]]:
    """Query parameters for the devices of the GPUs in `row_of` (GPU pk -> row index; None: every GPU, row 0),
    and each GPU's expected span: [max(start, first seen), min(end, now, tracked until))."""
    devices: list[tuple[int, int, float, float, int]] = []
    classes: dict[tuple[int, float, float | None, float], int] = {}
    spans: list[Span] = []

    def add(pk: int, ipk: int, key: tuple[int, float, float | None, float], lo: float = 0.0, hi: float = 0.0) -> None:
        devices.append((pk, classes.setdefault(key, len(classes) + 1), lo, hi, ipk))

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
            add(gpu.pk, gpu.instance.pk, (r, 1.0, rate, 0.0), lo_s, hi_s)
            continue
        known = layout_known(gpu, slices)
        add(gpu.pk, gpu.instance.pk, (r, 0.0, rate, 1.0 if known else 0.0), lo_s, hi_s)
        for sl in slices:
            if sl.compute_slices is not None:
                weight = sl.compute_slices / 7
                add(sl.pk, gpu.instance.pk, (r, weight, rate, -weight if known else 0.0))
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


_COLUMNS = "s.secs, s.util_known_s AS k, s.util_lt{bound}_s AS lt, s.free_lt{bound}_s AS fr"
"""A device rollup row's seconds (`s`), at the idle threshold `{bound}`."""


@lru_cache(maxsize=64)
def grouped_sql(bound: int, kinds: tuple[str, ...], sums: tuple[str, ...], outer: str, priced: bool = False) -> str:
    """One query: the rollup rows of each read, joined to the devices and summed per (class, bucket) in seconds
    (`sums`, names of SUMS), then `outer`, a query over `x`: those sums per class and bucket (b), with the class's
    row (r) and coefficients, and `pp`, USD per GPU-hour of paid-offline capacity (0 outside it). Every row of the
    span is read and the devices not asked for dropped by the join: a page of GPUs has rows on as many pages of the
    table as the whole fleet. `priced`: with the pieces and mixed days of series_prices.SeriesPrices, the sums are
    per device class, bucket and price class (`pc`), the coefficients at that price."""
    parts = []
    for n, kind in enumerate(kinds):
        table, time_col, bucket, length = _SOURCES[kind]
        skip = ""
        if priced and kind == DAILY:
            skip = " AND NOT EXISTS (SELECT FROM md WHERE md.id = s.device_id AND md.day = s.day)"
        parts.append(
            f"SELECT s.device_id, {bucket} AS b, date_part('epoch', s.{time_col}) AS te, {length} AS len, "
            f"{_COLUMNS.format(bound=bound)} FROM {table} s WHERE s.{time_col} >= :a{n} AND s.{time_col} < :b{n}{skip}"
        )
    if priced and DAILY in kinds:
        # The hourly rows of the mixed instance-days, in their day's bucket, day by day through the (device_id,
        # hour) key: behind OFFSET 0 the planner cannot hash every hourly row of the span instead.
        parts.append(
            "SELECT s.device_id, md.day AS b, date_part('epoch', s.hour) AS te, 3600 AS len, "
            f"{_COLUMNS.format(bound=bound)} FROM md CROSS JOIN LATERAL (SELECT * FROM rollups_hourly s "
            f"WHERE s.device_id = md.id AND s.hour >= md.day AND s.hour < md.day + {DAY_SQL} OFFSET 0) s"
        )
    devices = ", ".join(f"CAST(:{name} AS {t}[])" for name, t in DEVICE_ARRAYS)
    coefficients = ", ".join(f"(CAST(:{name} AS {t}[]))[cl] AS {name}" for name, t in CLASS_ARRAYS)
    summed = ", ".join(f"sum({SUMS[name]}) AS {name}" for name in sums)
    # Grouped by id so the planner knows the ids are unique: it then hashes the devices, not the rollup rows.
    withs = (
        "WITH d AS (SELECT id, min(cl) AS cl, min(lo) AS lo, min(hi) AS hi, min(ipk) AS ipk "
        f"FROM unnest({devices}) AS d(id, cl, lo, hi, ipk) GROUP BY id), "
    )
    if not priced:
        return (
            f"{withs}u AS ({' UNION ALL '.join(parts)}), "
            f"i AS (SELECT d.cl, u.b, {summed} FROM u JOIN d ON d.id = u.device_id GROUP BY d.cl, u.b), "
            f"x AS (SELECT i.*, {coefficients}, 0.0 AS pp FROM i) "
            f"{outer}"
        )
    # What the rows' price class `pc` changes of the class's own price: w, c times the change in USD per GPU-hour
    # (and in 1-if-unpriced); pp, USD per GPU-hour of paid-offline capacity.
    delta, dnp, pay = (of_class(name, "pc") for name in ("cdelta", "cdnp", "cpay"))
    repriced = (
        f"wr + w * {delta} AS wr, wn + w * {dnp} AS wn, cr + c * {delta} AS cr, cn + c * {dnp} AS cn, {pay} AS pp"
    )
    return (
        f"{withs}{MIXED_CTE}, md AS (SELECT d.id, m.day FROM m JOIN d ON d.ipk = m.pk), "
        f"u AS ({' UNION ALL '.join(parts)}), "
        f"i AS (SELECT d.cl, u.b, {class_sql('d.ipk', 'u.te')} AS pc, {summed} FROM u "
        "JOIN d ON d.id = u.device_id GROUP BY 1, 2, 3), "
        f"x AS (SELECT cl, b, {', '.join(sums)}, r, w, c, {repriced} FROM (SELECT i.*, {coefficients} FROM i) i) "
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


# In the order of BucketFigures' fields, in hours and USD, then the paid covered USD. Unpartitioned capacity (its
# seconds x c) is floored per row and bucket; offline hours start as minus the covered ones.
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
            "sum(own * pp)",
        )
    )
    + " FROM x GROUP BY r, b"
)
"""Per (row, bucket): the row index, the bucket start, BucketFigures' fields and the USD of the GPUs' covered time
in paid-offline capacity."""
