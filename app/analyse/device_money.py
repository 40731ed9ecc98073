"""What each device's hours cost at the price of each hour, summed over a window in one query however many price
pieces there are (app/billing/prices.py): the money side of the window analysis (app/analyse/priced.py).

A rollup row finds its price class without a join or a search: the classes of each instance at each day (or hour)
of a read go in as one grid laid out by instance and time (app/analyse/price_classes.py), which the row reads at
its instance's slot and its time. A class is a price per GPU-second, its source (billed or spot history) and
whether it pays for offline time; class 1 is "no piece": the instance's own price, applied by the caller.

A daily row whose day a piece boundary cuts (a "mixed" day) has no one price. Its sums are those of its hourly
rows, each at its hour's price; they are kept in this process (`MixedDays`), keyed by the daily row's version
(`xmin`: any write to the row changes it) and by the day's prices, so a page reads the hours of a mixed day once,
not on every view. Reading them again gives the same figures; the memo only saves the time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from operator import add
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .price_classes import FROM_BILL, FROM_SPOT, MIXED, DayKey, Grid, PriceClasses, class_sql, slot_sql, slots, u16_sql
from .usage import DeviceUsage
from .window import DAILY, HOURLY, RollupRead


class DeviceMoney(NamedTuple):
    """One device's hours in price pieces over a window, per GPU (weight 1): seconds, and USD at each hour's piece
    price (USD per GPU-hour x hours). Hours outside every piece are not here: they cost the instance's own price."""

    piece_free_s: float
    """Idle seconds (under the threshold, no process, memory under the held bound) in pieces, s."""
    piece_below_s: float
    """Seconds under the idle threshold (idle + idle-held) in pieces, s."""
    piece_unused_s: float
    """Seconds with a utilization figure x (1 - utilization) in pieces, s."""
    free_usd: float
    below_usd: float
    unused_usd: float
    billed_s: float
    """Covered seconds priced by the bill, s."""
    billed_usd: float
    spot_s: float
    """Covered seconds priced by the spot price history, s."""
    spot_usd: float
    paid_usd: float
    """USD of the covered seconds in capacity paid while offline (part of billed_usd)."""

    @property
    def piece_s(self) -> float:
        """Covered seconds in pieces, s."""
        return self.billed_s + self.spot_s


ZERO = DeviceMoney(*([0.0] * len(DeviceMoney._fields)))


def plus(a: Sequence[float], b: Sequence[float]) -> DeviceMoney:
    """Two sums added field by field (the same length: DeviceMoney's)."""
    return DeviceMoney._make(map(add, a, b))


class MixedDays:
    """Sums of the mixed device-days read so far in this process, per database and idle bound (a scope), by
    device-day, with the daily row's version and the day's price signature they were read at. Bounded: past `limit`
    device-days (about 730 bytes each; a 30-day window of 300 instances with spot prices changing every one to three
    days keeps about 13,000) it starts again empty."""

    def __init__(self, limit: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        # Keys of plain ints: a page view looks up thousands, and hashing a datetime costs ten times more.
        self._sums: dict[tuple[str, int], dict[DayKey, tuple[int, int, DeviceMoney]]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Device-days kept."""
        return self._count

    def get_all(
        self,
        scope: tuple[str, int],
        device: int,
        days: Sequence[int],
        versions: Sequence[int],
        sigs: Sequence[int],
        *,
        missing: list[tuple[DayKey, int, int]],
    ) -> list[DeviceMoney]:
        """The sums kept for the device's `days` at those versions and signatures; the others are added to
        `missing` as (device-day, version, signature)."""
        out = []
        with self._lock:
            kept = self._sums.get(scope, {})
            for day, version, sig in zip(days, versions, sigs, strict=True):
                found = kept.get((device, day))
                if found is not None and found[0] == version and found[1] == sig:
                    out.append(found[2])
                else:
                    missing.append(((device, day), version, sig))
        return out

    def put(self, scope: tuple[str, int], entries: Sequence[tuple[DayKey, int, int, DeviceMoney]]) -> None:
        with self._lock:
            if self._count + len(entries) > self._limit:
                self._sums.clear()
                self._count = 0
            kept = self._sums.setdefault(scope, {})
            before = len(kept)
            for key, version, sig, sums in entries:
                kept[key] = (version, sig, sums)
            self._count += len(kept) - before


MIXED_DAYS = MixedDays()


def _sums(bound: int, rate: str, src: str, pay: str) -> str:
    """The DeviceMoney sums of rows with columns secs, known, usum, below, free, at `rate` USD per GPU-second from
    source code `src` (0: not in a piece) paying `pay` USD per GPU-second for offline capacity."""
    unused = "(known - usum / 100.0)"
    parts = [
        f"sum(free) FILTER (WHERE {src} > 0)",
        f"sum(below) FILTER (WHERE {src} > 0)",
        f"sum({unused}) FILTER (WHERE {src} > 0)",
        f"sum({rate} * free)",
        f"sum({rate} * below)",
        f"sum({rate} * {unused})",
        f"sum(secs) FILTER (WHERE {src} = {FROM_BILL})",
        f"sum({rate} * secs) FILTER (WHERE {src} = {FROM_BILL})",
        f"sum(secs) FILTER (WHERE {src} = {FROM_SPOT})",
        f"sum({rate} * secs) FILTER (WHERE {src} = {FROM_SPOT})",
        f"sum({pay} * secs)",
    ]
    return ", ".join(f"CAST(COALESCE({p}, 0) AS float8)" for p in parts)


def _raw(bound: int) -> tuple[str, ...]:
    """The rollup columns the sums read."""
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    return ("secs", "util_known_s", "util_sum", f"util_lt{bound}_s", f"free_lt{bound}_s", "no_proc_s")


def _columns(bound: int, sign: int) -> str:
    neg = "" if sign > 0 else "-"
    names = ("secs", "known", "usum", "below", "free", "noproc")
    return ", ".join(f"{neg}{raw} AS {name}" for raw, name in zip(_raw(bound), names, strict=True))


_SLOT = slot_sql("ds", "x.device_id", "dlo", "dhi")
"""A row's device's instance slot (0: none)."""
# Each layer works out what the next reads once (OFFSET 0 keeps the planner from pulling a subquery up and copying
# its expressions into every use, where they would run once per use): a row's slot, its class, its price (none for
# a mixed day's daily row: its sums come from its hours).
_PRICED = (
    "k AS (SELECT * FROM unnest(CAST(:crate AS float8[]), CAST(:csrc AS int4[]), CAST(:cpay AS float8[])) "
    "WITH ORDINALITY AS k(rate, src, pay, c) UNION ALL SELECT 0, 0, 0, 0), "
    "p AS (SELECT u.*, k.rate, k.src, k.pay FROM u JOIN k ON k.c = u.c) "
)
"""Each row's price from its class, by a join with the classes: a subscript of an array parameter costs PostgreSQL in
proportion to the array (hundreds of classes) on every row. Class 0 (a mixed day's daily row) has no price: its
sums come from its hours."""


def _part(i: int, table: str, sign: int, bound: int, where: str) -> str:
    """The rows of read `i` with their class (`c`, from grid section r{i}) and row version (`xv`)."""
    t, name = ("day", "rollups_daily") if table == DAILY else ("hour", "rollups_hourly")
    # The columns named, not x.*: a whole rollup row is five times wider and costs more to carry.
    rows = (
        f"SELECT x.device_id, x.{t}, date_part('epoch', x.{t}) AS e, x.xmin AS xv, "
        f"{', '.join(f'x.{c}' for c in _raw(bound))}, {_SLOT} AS s "
        f"FROM {name} x WHERE x.{t} >= :t{i}a AND x.{t} < :t{i}b{where} OFFSET 0"
    )
    c = class_sql("g", "s", "e", f"r{i}")
    return f"SELECT device_id, {t} AS t, e, xv, {c} AS c, {_columns(bound, sign)} FROM ({rows}) x"


@lru_cache(maxsize=64)
def _window_sql(bound: int, shape: tuple[tuple[str, int], ...], filtered: bool) -> str:
    only = " AND x.device_id = ANY(CAST(:ids AS int4[]))" if filtered else ""
    parts = [_part(i, table, sign, bound, only) for i, (table, sign) in enumerate(shape)]
    return (
        f"WITH u AS (SELECT * FROM ({' UNION ALL '.join(parts)}) v OFFSET 0), {_PRICED}"
        f"SELECT device_id, {_USAGE_SUMS}, {_sums(bound, 'rate', 'src', 'pay')}, "
        f"array_agg(CAST(e AS int8)) FILTER (WHERE c = {MIXED}), "
        f"array_agg(CAST(CAST(xv AS text) AS int8)) FILTER (WHERE c = {MIXED}) "
        "FROM p GROUP BY device_id"
    )


_USAGE_SUMS = ", ".join(
    f"CAST(COALESCE(sum({c}), 0) AS float8)" for c in ("secs", "known", "usum", "below", "free", "noproc")
)
"""A device's usage (app/analyse/usage.py `DeviceUsage`), from the same rows."""


@lru_cache(maxsize=8)
def _days_sql(bound: int) -> str:
    # Each device-day's hours find their classes in the section of its instance-day (`o`: its first index).
    hour_of_day = "CAST((date_part('epoch', h.hour) - date_part('epoch', q.day)) / 3600 AS int4)"
    return (
        "WITH q AS (SELECT * FROM unnest(CAST(:qids AS int4[]), CAST(:qdays AS timestamptz[]), "
        "CAST(:qo AS int4[])) AS q(device_id, day, o)), "
        f"u AS (SELECT h.device_id, q.day AS t, {u16_sql('g', f'q.o + {hour_of_day}')} AS c, "
        f"{_columns(bound, 1)} FROM q JOIN rollups_hourly h ON h.device_id = q.device_id "
        "AND h.hour >= q.day AND h.hour < q.day + interval '24 hours' OFFSET 0), "
        f"{_PRICED}SELECT device_id, CAST(date_part('epoch', t) AS int8), {_sums(bound, 'rate', 'src', 'pay')} "
        "FROM p GROUP BY device_id, t"
    )


@lru_cache(maxsize=8)
def _hours_sql(bound: int) -> str:
    part = _part(0, HOURLY, 1, bound, " AND x.device_id = ANY(CAST(:ids AS int4[]))")
    sums = _sums(bound, "rate", "src", "pay")
    return f"WITH u AS ({part} OFFSET 0), {_PRICED}SELECT device_id, t, {sums} FROM p GROUP BY device_id, t"


def _device_params(classes: PriceClasses, devices: Mapping[int, int]) -> tuple[list[int], dict[str, Any]]:
    """The instances of `devices` (device id -> instance pk) in slot order, and the class arrays with each device's
    instance slot (`ds`, from device `dlo` to `dhi`)."""
    pks = sorted(set(devices.values()))
    slot = {pk: i for i, pk in enumerate(pks, start=1)}
    ds, dlo, dhi = slots({device: slot[pk] for device, pk in devices.items()})
    return pks, classes.params() | {"ds": ds, "dlo": dlo, "dhi": dhi}


def hourly_money(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    start: datetime,
    end: datetime,
    *,
    idle_util_pct: int,
) -> dict[int, list[tuple[datetime, DeviceMoney]]]:
    """Per device of `devices` (device id -> instance pk), its hours in the pieces of `classes` over [start, end),
    hour by hour: for the few GPUs whose MIG mode changed in a window, whose hours count by mode."""
    if not devices:
        return {}
    pks, params = _device_params(classes, devices)
    grid = Grid()
    params |= classes.read_sections(grid, pks, [RollupRead(HOURLY, start, end, 1)])
    params |= {"g": grid.to_bytes(), "ids": list(devices), "t0a": start, "t0b": end}
    out: dict[int, list[tuple[datetime, DeviceMoney]]] = {}
    for device_id, hour, *sums in fetch_binary(session, _hours_sql(idle_util_pct), params):
        out.setdefault(device_id, []).append((hour, DeviceMoney(*sums)))
    return out


def usage_and_money(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    reads: Sequence[RollupRead],
    *,
    idle_util_pct: int,
    device_ids: Sequence[int] | None,
    memo: MixedDays | None = None,
) -> tuple[dict[int, DeviceUsage], dict[int, DeviceMoney]]:
    """Per device of `device_ids` (None: every device), its usage over the rollup `reads` of a window (as
    app/analyse/usage.py `usage_of_reads` gives it) and its hours in the pieces of `classes`, in one read of the rows;
    money is that of the devices of `devices` (device id -> instance pk), nothing for the others. A device with no
    row in the reads is left out."""
    if not reads or (device_ids is not None and not device_ids):
        return {}, {}
    memo = MIXED_DAYS if memo is None else memo
    pks, params = _device_params(classes, devices)
    grid = Grid()
    params |= classes.read_sections(grid, pks, reads)
    params["g"] = grid.to_bytes()
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    if device_ids is not None:
        params["ids"] = list(device_ids)
    sql = _window_sql(idle_util_pct, tuple((r.table, r.sign) for r in reads), device_ids is not None)
    usage: dict[int, DeviceUsage] = {}
    out: dict[int, DeviceMoney] = {}
    scope = (str(session.get_bind().engine.url), idle_util_pct)
    wanted: list[tuple[DayKey, int, int]] = []
    mixed = classes.mixed
    n_usage = len(DeviceUsage._fields)
    for row in fetch_binary(session, sql, params):
        device_id, days, versions = row[0], row[-2], row[-1]
        usage[device_id] = DeviceUsage._make(row[:n_usage])
        sums: Sequence[float] = row[n_usage:-2]
        if days:
            pk = devices[device_id]
            sigs = [mixed[(pk, day)] for day in days]
            kept = memo.get_all(scope, device_id, days, versions, sigs, missing=wanted)
            if kept:
                # Column by column (zip transposes the kept days' sums): one C-level sum per column.
                sums = [a + sum(column) for a, column in zip(sums, zip(*kept, strict=True), strict=True)]
        out[device_id] = DeviceMoney(*sums)
    if wanted:
        read = _read_days(session, devices, classes, [key for key, _v, _s in wanted], idle_util_pct)
        entries = [(key, version, sig, read.get(key, ZERO)) for key, version, sig in wanted]
        memo.put(scope, entries)
        for key, _version, _sig, day_sums in entries:
            out[key[0]] = plus(out[key[0]], day_sums)
    return usage, out


def _read_days(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    days: Sequence[DayKey],
    bound: int,
) -> dict[DayKey, DeviceMoney]:
    """The sums of the given device-days, read from their hourly rows, each hour at its price."""
    grid = Grid()
    first = classes.day_sections(grid, {(devices[d], t) for d, t in days})
    params = classes.params() | {
        "g": grid.to_bytes(),
        "qids": [d for d, _t in days],
        "qdays": [datetime.fromtimestamp(t, UTC) for _d, t in days],
        "qo": [first[(devices[d], t)] for d, t in days],
    }
    return {(row[0], row[1]): DeviceMoney(*row[2:]) for row in fetch_binary(session, _days_sql(bound), params)}
