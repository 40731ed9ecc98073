"""The timeline's fast path: rows of whole instances (the fleet, an instance, a tag value) read the per-instance
rollups (app/store/instance_rollups.py), a few hundred rows per hour for a whole fleet, instead of one per GPU
and MIG slice. The weights there are the window analysis's, taken as the seconds arrived.

Each row is priced at the price in force in its hour or day (app/analyse/series_prices.py): the instance's price
piece where one covers it, else its own price. With pieces (`priced`), the sums are made per price class too, and
each class's change of the own prices applied to them; a daily row of a mixed instance-day (cut by a piece
boundary) is left out and the day's hourly rows read in its place. Without, the queries are as they were.

Floors at 0 (each state, unpartitioned capacity) apply per row and bucket rather than per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from .fleet import Fleet
from .series_prices import DAY_SQL, MIXED_CTE, class_sql, of_class

Span = tuple[int, datetime, datetime]
"""(row index, from, to): when a GPU should have sent data."""

_SOURCES = {
    "hourly": ("instance_rollups_hourly", "hour", "hour"),
    "daily": ("instance_rollups_daily", "day", "day"),
    "partial": ("instance_rollups_hourly", "hour", "date_trunc('day', hour, 'UTC')"),
}
# Plain sums per (row, bucket), at each instance's own price (USD per GPU-hour; np: 1 if unpriced): the floors at 0
# come after summing, which is three times cheaper than flooring every rollup row and differs only where the data
# contradicts itself. s13, the GPUs' seconds x price in paid-offline capacity, is 0 at the own prices.
_SUMS = (
    "u.secs_w",
    "u.known_w",
    "u.lt",
    "u.fr",
    "u.cap_s",
    "u.sliced_w",
    "u.gpu_s",
    "u.secs_w * i.rate",
    "u.fr * i.rate",
    "u.lt * i.rate",
    "u.cap_s * i.rate",
    "u.sliced_w * i.rate",
    "(u.secs_w + u.cap_s - u.sliced_w) * i.np",
    "0",
)
# With pieces, the same sums per price class `c` as well, then what each class changes of the own prices added.
_DELTA, _DNP, _PAY = (of_class(name, "c") for name in ("cdelta", "cdnp", "cpay"))
_REPRICED = (
    *(f"s{n}" for n in range(7)),
    f"s7 + s0 * {_DELTA}",
    f"s8 + s3 * {_DELTA}",
    f"s9 + s2 * {_DELTA}",
    f"s10 + s4 * {_DELTA}",
    f"s11 + s5 * {_DELTA}",
    f"s12 + (s0 + s4 - s5) * {_DNP}",
    f"s6 * {_PAY}",
)
# BucketFigures' fields, in order, from the sums above (s0 .. s13): seconds and USD x 3600 become hours and USD;
# offline starts as minus the GPUs' own covered hours (the expected hours are added in Python). Last, apart from
# BucketFigures: the USD of the GPUs' covered time in paid-offline capacity.
_FREE_USD = "greatest(s10 - s11, 0)"
_FIELDS = (
    "greatest(s1 - s2, 0)",
    "greatest(s2 - s3, 0)",
    "greatest(s3, 0)",
    "greatest(s4 - s5, 0)",
    "greatest(s0 - s1, 0)",
    "-s6",
    f"s7 + {_FREE_USD}",
    f"s8 + {_FREE_USD}",
    "greatest(s9 - s8, 0)",
    "greatest(s12, 0)",
    "coalesce(s13, 0)",
)


def _figures(keys: str, inner: str, priced: bool) -> str:
    """SELECT `keys`, then BucketFigures' fields and the paid covered USD, over `inner` (which names the sums s0 ..
    s13)."""
    fields = ", ".join(f"CAST(({e}) / 3600.0 AS float8)" for e in _FIELDS)
    withs = f"WITH {MIXED_CTE} " if priced else ""
    return f"{withs}SELECT {keys}{fields} FROM ({inner}) x"


def _summed(keys: Sequence[tuple[str, str]], rows: str, priced: bool) -> str:
    """Per `keys` ((expression over u and i, name) each), the sums s0 .. s13 of `rows` (the rollup rows, as u), each
    row at its price."""
    sums = ", ".join(f"sum({e}) AS s{n}" for n, e in enumerate(_SUMS))
    cols = ", ".join(f"{e} AS {name}" for e, name in keys)
    names = ", ".join(name for _e, name in keys)
    by = ", ".join(str(n) for n in range(1, len(keys) + 1))
    if not priced:
        return f"SELECT {cols}, {sums} FROM {rows} u {_JOIN} GROUP BY {by}"
    repriced = ", ".join(f"sum({e}) AS s{n}" for n, e in enumerate(_REPRICED))
    return (
        f"SELECT {names}, {repriced} FROM (SELECT {cols}, u.c, {sums} FROM {rows} u {_JOIN} "
        f"GROUP BY {by}, {len(keys) + 1}) y GROUP BY {by}"
    )


def instance_rows(fleet: Fleet, row_of: Mapping[int, int] | None) -> dict[int, int] | None:
    """Instance pk -> row index when rows are made of whole instances (every GPU of an instance in the same row,
    or none of them); None when some instance is split between rows (rows of GPUs: the device path)."""
    out: dict[int, int | None] = {}
    for gpu in fleet.gpus.values():
        r = 0 if row_of is None else row_of.get(gpu.pk)
        pk = gpu.instance.pk
        if pk in out and out[pk] != r:
            return None
        out[pk] = r
    return {pk: r for pk, r in out.items() if r is not None}


def instance_params(
    fleet: Fleet, rows: Mapping[int, int], *, start: datetime, end: datetime, now: datetime
) -> tuple[dict[str, list[Any]], list[Span]]:
    """The instances as query arrays (pk, row, own USD per GPU-hour, 1 if unpriced) and each of their GPUs' span:
    [max(start, first seen), min(end, now, tracked until))."""
    params: dict[str, list[Any]] = {"pk": [], "r": [], "rate": [], "np": []}
    for inst in fleet.instances.values():
        r = rows.get(inst.pk)
        if r is None:
            continue
        rate = inst.price.usd_per_gpu_hour
        params["pk"].append(inst.pk)
        params["r"].append(r)
        params["rate"].append(0.0 if rate is None else rate)
        params["np"].append(1.0 if rate is None else 0.0)
    spans: list[Span] = []
    for gpu in fleet.gpus.values():
        r = rows.get(gpu.instance.pk)
        if r is None:
            continue
        lo, hi = max(start, gpu.first_seen), min(end, now, gpu.instance.tracked_until)
        if hi > lo:
            spans.append((r, lo, hi))
    return params, spans


def _columns(bound: int, sign: str = "", *, priced: bool = False, time_col: str = "hour") -> str:
    """The sums of a rollup row `s` (negated with `sign` "-"); `priced`: then `c`, its price class."""
    epoch = f"date_part('epoch', s.{time_col})"
    k = f", {class_sql('s.instance_pk', epoch)} AS c" if priced else ""
    return (
        f"{sign}s.secs_w AS secs_w, {sign}s.known_w AS known_w, {sign}s.lt{bound}_w AS lt, "
        f"{sign}s.free{bound}_w AS fr, {sign}s.cap_s AS cap_s, {sign}s.sliced_w AS sliced_w, {sign}s.gpu_s AS gpu_s{k}"
    )


_NOT_MIXED = " AND NOT EXISTS (SELECT FROM m WHERE m.pk = s.instance_pk AND m.day = s.day)"
"""A daily row, unless its instance-day is mixed."""


def _mixed_hours(bound: int) -> str:
    """The hourly rows of the mixed instance-days, each in its day's bucket, through the (instance_pk, hour)
    index."""
    return f"SELECT s.instance_pk, m.day AS b, {_columns(bound, priced=True)} FROM {_MIXED_ROWS}"


_MIXED_ROWS = (
    "m CROSS JOIN LATERAL (SELECT * FROM instance_rollups_hourly s WHERE s.instance_pk = m.pk AND s.hour >= m.day "
    f"AND s.hour < m.day + {DAY_SQL} OFFSET 0) s"
)
"""Each mixed instance-day's hourly rows, as `s`. Behind OFFSET 0 the planner cannot make this a join: it reads
each day through the (instance_pk, hour) index, whereas as a join it may well hash every hourly row of the span."""


def _union(bound: int, kinds: Sequence[str], filtered: bool = False, priced: bool = False) -> str:
    only = " AND s.instance_pk = ANY(CAST(:pk AS int8[]))" if filtered else ""
    parts = []
    for n, kind in enumerate(kinds):
        table, time_col, bucket = _SOURCES[kind]
        skip = _NOT_MIXED if priced and kind == "daily" else ""
        parts.append(
            f"SELECT s.instance_pk, {bucket} AS b, {_columns(bound, priced=priced, time_col=time_col)} FROM {table} s "
            f"WHERE s.{time_col} >= :a{n} AND s.{time_col} < :b{n}{only}{skip}"
        )
    if priced and "daily" in kinds:
        parts.append(_mixed_hours(bound))
    return f"({' UNION ALL '.join(parts)})"


_INSTANCES = (
    "SELECT * FROM unnest(CAST(:pk AS int8[]), CAST(:r AS int4[]), CAST(:rate AS float8[]), "
    "CAST(:np AS float8[])) AS i(pk, r, rate, np)"
)
_JOIN = f"JOIN ({_INSTANCES}) i ON i.pk = u.instance_pk"
"""The rows `u` with their instance's row index and own price."""


@lru_cache(maxsize=64)
def timeline_sql(bound: int, kinds: tuple[str, ...], filtered: bool, priced: bool = False) -> str:
    """Per (row, bucket): the row index, the bucket start, BucketFigures' fields and the USD of the covered time in
    paid-offline capacity. `filtered`: read only the instances asked for, through the index on (instance_pk, hour):
    worth it when they are few (a page of heatmap rows). `priced`: with the pieces and mixed days of
    series_prices.SeriesPrices."""
    inner = _summed((("i.r", "r"), ("u.b", "b")), _union(bound, kinds, filtered, priced), priced)
    return _figures("r, b, ", inner, priced)


@lru_cache(maxsize=8)
def hour_of_week_sql(bound: int, priced: bool = False) -> str:
    """Per UTC hour of the span: its start, the wasted USD (idle, idle-held and unpartitioned, at each hour's price)
    and the USD of the covered time in paid-offline capacity, from the hourly per-instance rollups."""
    rows = _union(bound, ("hourly",), priced=priced)
    wasted = "(u.lt + u.cap_s - u.sliced_w)"
    if not priced:
        return (
            f"SELECT u.b, CAST(sum({wasted} * i.rate) / 3600 AS float8), CAST(0 AS float8) FROM {rows} u {_JOIN} "
            "GROUP BY 1"
        )
    return (
        f"SELECT b, CAST(sum(w + x * {_DELTA}) / 3600 AS float8), CAST(sum(g * {_PAY}) / 3600 AS float8) "
        f"FROM (SELECT u.b, u.c, sum({wasted} * i.rate) AS w, sum({wasted}) AS x, sum(u.gpu_s) AS g "
        f"FROM {rows} u {_JOIN} GROUP BY 1, 2) y GROUP BY 1"
    )


@lru_cache(maxsize=64)
def totals_sql(bound: int, shape: tuple[tuple[str, int], ...], priced: bool = False) -> str:
    """Per row: the row index, BucketFigures' fields over a whole window and the USD of the covered time in
    paid-offline capacity, from the rollup reads of `Window.rollup_reads` (table, sign): whole days from the daily
    rows, the hours around them added or taken away. `priced`: with the pieces and mixed days of
    series_prices.SeriesPrices; a mixed day's hourly rows replace its daily row, and the hours taken away from it
    still are."""
    parts = []
    for n, (table, sign) in enumerate(shape):
        name, time_col = ("instance_rollups_daily", "day") if table == "daily" else ("instance_rollups_hourly", "hour")
        skip = _NOT_MIXED if priced and table == "daily" else ""
        columns = _columns(bound, "" if sign > 0 else "-", priced=priced, time_col=time_col)
        parts.append(
            f"SELECT s.instance_pk, {columns} FROM {name} s "
            f"WHERE s.{time_col} >= :t{n}a AND s.{time_col} < :t{n}b{skip}"
        )
    if priced and any(table == "daily" for table, _sign in shape):
        parts.append(f"SELECT s.instance_pk, {_columns(bound, priced=True)} FROM {_MIXED_ROWS}")
    inner = _summed((("i.r", "r"),), f"({' UNION ALL '.join(parts)})", priced)
    return _figures("r, ", inner, priced)
