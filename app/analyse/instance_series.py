"""The timeline's fast path: rows of whole instances (the fleet, an instance, a tag value) read the per-instance
rollups (app/store/instance_rollups.py), a few hundred rows per hour for a whole fleet, instead of one per GPU
and MIG slice. The weights there are the window analysis's, taken as the seconds arrived.

Floors at 0 (each state, unpartitioned capacity) apply per row and bucket rather than per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from .fleet import Fleet

Span = tuple[int, datetime, datetime]
"""(row index, from, to): when a GPU should have sent data."""

_SOURCES = {
    "hourly": ("instance_rollups_hourly", "hour", "hour"),
    "daily": ("instance_rollups_daily", "day", "day"),
    "partial": ("instance_rollups_hourly", "hour", "date_trunc('day', hour, 'UTC')"),
}
# Plain sums per (row, bucket): the floors at 0 come after summing, which is three times cheaper than flooring
# every rollup row and differs only where the data contradicts itself.
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
)
# BucketFigures' fields, in order, from the sums above (s0 .. s12): seconds and USD x 3600 become hours and USD;
# offline starts as minus the GPUs' own covered hours (the expected hours are added in Python).
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
)


def _figures(keys: str, inner: str) -> str:
    """SELECT `keys`, then BucketFigures' fields, over `inner` (which names the sums s0 .. s12)."""
    fields = ", ".join(f"CAST(({e}) / 3600.0 AS float8)" for e in _FIELDS)
    return f"SELECT {keys}{fields} FROM ({inner}) x"


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
    """The instances as query arrays (pk, row, USD per GPU-hour, 1 if unpriced) and each of their GPUs' span:
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


def _union(bound: int, kinds: Sequence[str], filtered: bool = False) -> str:
    only = " AND instance_pk = ANY(CAST(:pk AS int8[]))" if filtered else ""
    parts = []
    for n, kind in enumerate(kinds):
        table, time_col, bucket = _SOURCES[kind]
        parts.append(
            f"SELECT instance_pk, {bucket} AS b, secs_w, known_w, lt{bound}_w AS lt, free{bound}_w AS fr, cap_s, "
            f"sliced_w, gpu_s FROM {table} WHERE {time_col} >= :a{n} AND {time_col} < :b{n}{only}"
        )
    return " UNION ALL ".join(parts)


_INSTANCES = (
    "SELECT * FROM unnest(CAST(:pk AS int8[]), CAST(:r AS int4[]), CAST(:rate AS float8[]), "
    "CAST(:np AS float8[])) AS i(pk, r, rate, np)"
)


@lru_cache(maxsize=64)
def timeline_sql(bound: int, kinds: tuple[str, ...], filtered: bool) -> str:
    """Per (row, bucket): the row index, the bucket start and BucketFigures' fields. `filtered`: read only the
    instances asked for, through the index on (instance_pk, hour): worth it when they are few (a page of
    heatmap rows)."""
    sums = ", ".join(f"sum({e}) AS s{n}" for n, e in enumerate(_SUMS))
    inner = (
        f"SELECT i.r, u.b, {sums} FROM ({_union(bound, kinds, filtered)}) u "
        f"JOIN ({_INSTANCES}) i ON i.pk = u.instance_pk GROUP BY 1, 2"
    )
    return _figures("r, b, ", inner)


@lru_cache(maxsize=8)
def hour_of_week_sql(bound: int) -> str:
    """Per (weekday 0 = Monday, UTC hour of day): wasted USD, from the hourly per-instance rollups."""
    return (
        "SELECT CAST(extract(isodow FROM u.b AT TIME ZONE 'UTC') AS int4) - 1, "
        "CAST(extract(hour FROM u.b AT TIME ZONE 'UTC') AS int4), "
        "CAST(sum((u.lt + u.cap_s - u.sliced_w) * i.rate) / 3600 AS float8) "
        f"FROM ({_union(bound, ('hourly',))}) u "
        f"JOIN ({_INSTANCES}) i ON i.pk = u.instance_pk GROUP BY 1, 2"
    )


@lru_cache(maxsize=64)
def totals_sql(bound: int, shape: tuple[tuple[str, int], ...]) -> str:
    """Per row: the row index and BucketFigures' fields over a whole window, from the rollup reads of
    `Window.rollup_reads` (table, sign): whole days from the daily rows, the hours around them added or taken
    away."""
    parts = []
    for n, (table, sign) in enumerate(shape):
        name, time_col = ("instance_rollups_daily", "day") if table == "daily" else ("instance_rollups_hourly", "hour")
        minus = "" if sign > 0 else "-"
        parts.append(
            f"SELECT instance_pk, {minus}secs_w AS secs_w, {minus}known_w AS known_w, {minus}lt{bound}_w AS lt, "
            f"{minus}free{bound}_w AS fr, {minus}cap_s AS cap_s, {minus}sliced_w AS sliced_w, {minus}gpu_s AS gpu_s "
            f"FROM {name} WHERE {time_col} >= :t{n}a AND {time_col} < :t{n}b"
        )
    sums = ", ".join(f"sum({e}) AS s{n}" for n, e in enumerate(_SUMS))
    inner = f"SELECT i.r, {sums} FROM ({' UNION ALL '.join(parts)}) u JOIN ({_INSTANCES}) i ON i.pk = u.instance_pk"
    return _figures("r, ", f"{inner} GROUP BY 1")
