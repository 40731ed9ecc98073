"""What each device's hours cost at the price of each hour, summed over a window in one query however many price
pieces there are (app/billing/prices.py): the money side of the window analysis (app/analyse/priced.py).

A rollup row finds its price class without a join: the pieces go in as one sorted array of keys (instance pk x 10^10
+ epoch seconds, as app/analyse/series_prices.py), which `width_bucket` searches for the row's key. A class is a
price per GPU-second, its source (billed or spot history) and whether it pays for offline time; class 1 is "no
piece": the instance's own price, applied by the caller.

A daily row whose day a piece boundary cuts (a "mixed" day) has no one price. Its sums are those of its hourly
rows, each at its hour's price; they are kept in this process (`MixedDays`), keyed by the daily row's version
(`xmin`: any write to the row changes it) and by the day's prices, so a page reads the hours of a mixed day once,
not on every view. Reading them again gives the same figures; the memo only saves the time.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ..billing.prices import BILLED, PricePiece
from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .fleet import Fleet
from .window import DAILY, RollupRead

KEY_SCALE = 10_000_000_000
"""A key is instance pk x this + epoch seconds: exact in int8 for pks under 9 x 10^8."""
DAY_S = 86_400
NO_PIECE, FROM_BILL, FROM_SPOT = 0, 1, 2
"""A class's source code: the instance's own price, the bill, the spot price history."""


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
    return DeviceMoney(*[x + y for x, y in zip(a, b, strict=True)])


@dataclass
class PriceClasses:
    """The pieces as query arrays: keys ascending (`pkey`, starting below every other key, at class 1) with their
    class (`pcls`); per class, its USD per GPU-second (`crate`), source code (`csrc`) and USD per GPU-second of
    paid-offline capacity (`cpay`); and the mixed instance-days (`mpk`, `mday`) with their prices' signature."""

    pkey: list[int] = field(default_factory=lambda: [-1])
    pcls: list[int] = field(default_factory=lambda: [1])
    crate: list[float] = field(default_factory=lambda: [0.0])
    csrc: list[int] = field(default_factory=lambda: [NO_PIECE])
    cpay: list[float] = field(default_factory=lambda: [0.0])
    mpk: list[int] = field(default_factory=list)
    mday: list[datetime] = field(default_factory=list)
    msig: list[int] = field(default_factory=list)
    _classes: dict[tuple[float, int, float], int] = field(default_factory=lambda: {(0.0, NO_PIECE, 0.0): 1})

    def params(self) -> dict[str, Any]:
        """The query arrays keyed by instance."""
        return {n: getattr(self, n) for n in ("pkey", "pcls", "crate", "csrc", "cpay")}

    def device_params(self, devices: Iterable[int], instance_of: Mapping[int, int]) -> dict[str, Any]:
        """The query arrays for rows of `devices`: those keyed by instance, the mixed days (`mkey`: ascending keys of
        the instance and midnight, `msig`: their signatures, each after one below every other), and each device's
        instance pk (`dpk`, at device id - `dmin` + 1). Arrays stay small: an array's every read costs in
        proportion to its size."""
        ids = list(devices)
        dmin = min(ids, default=0)
        dpk = [0] * (max(ids, default=0) - dmin + 1)
        for device in ids:
            dpk[device - dmin] = instance_of[device]
        mkey = [-1, *(pk * KEY_SCALE + int(day.timestamp()) for pk, day in zip(self.mpk, self.mday, strict=True))]
        return self.params() | {"mkey": mkey, "msig": [0, *self.msig], "dpk": dpk, "dmin": dmin}

    def key(self, pk: int, at: int, price: tuple[float, int, float] = (0.0, NO_PIECE, 0.0)) -> None:
        c = self._classes.get(price)
        if c is None:
            c = self._classes[price] = len(self._classes) + 1
            self.crate.append(price[0])
            self.csrc.append(price[1])
            self.cpay.append(price[2])
        self.pkey.append(pk * KEY_SCALE + at)
        self.pcls.append(c)


def price_classes(fleet: Fleet, pieces: Mapping[int, Sequence[PricePiece]]) -> PriceClasses:
    """The pieces (time-ordered, apart, by instance pk) as query arrays. A piece of an instance whose GPU count is
    unknown has no price per GPU and changes nothing. Work in proportion to the pieces."""
    out = PriceClasses()
    for pk in sorted(pieces):
        inst = fleet.instances.get(pk)
        gpus = inst.price.gpus if inst is not None else None
        if not gpus:
            continue
        runs: list[tuple[int, int, tuple[float, int, float]]] = []
        for piece in pieces[pk]:
            a, b = int(piece.start.timestamp()), int(piece.end.timestamp())
            if b <= a:
                continue
            rate = piece.usd_per_hour / gpus / 3600
            price = (rate, FROM_BILL if piece.source == BILLED else FROM_SPOT, rate if piece.paid_offline else 0.0)
            if runs and runs[-1][1] == a and runs[-1][2] == price:
                runs[-1] = (runs[-1][0], b, price)
            else:
                runs.append((a, b, price))
        last: int | None = None
        cuts: set[int] = set()
        for a, b, price in runs:
            if last is not None and last != a:
                out.key(pk, last)
            out.key(pk, a, price)
            last = b
            # A boundary inside a day (not at its midnight) gives that day more than one price.
            cuts.update(t - t % DAY_S for t in (a, b) if t % DAY_S)
        if last is not None:
            out.key(pk, last)
        for day in sorted(cuts):
            inside = [(max(a, day), min(b, day + DAY_S), p) for a, b, p in runs if a < day + DAY_S and b > day]
            sig = _signature(inside)
            out.mpk.append(pk)
            out.mday.append(datetime.fromtimestamp(day, UTC))
            out.msig.append(sig)
    return out


def _signature(runs: Sequence[tuple[int, int, tuple[float, int, float]]]) -> int:
    """The prices of one instance-day as a signed 64-bit number: two days with the same one are priced alike."""
    digest = hashlib.blake2b(repr(runs).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


DayKey = tuple[int, int]
"""A device-day: device id, epoch seconds of its UTC midnight."""


class MixedDays:
    """Sums of the mixed device-days read so far in this process, per database and idle bound (a scope), by
    device-day, with the daily row's version and the day's price signature they were read at. Bounded: past `limit`
    entries (about 730 bytes each; a 30-day window of 300 instances with spot prices changing every one to three
    days keeps about 13,000) it starts again empty."""

    def __init__(self, limit: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        # Keys of plain ints: a page view looks up thousands, and hashing a datetime costs ten times more.
        self._sums: dict[tuple[str, int], dict[DayKey, tuple[int, int, DeviceMoney]]] = {}
        self._count = 0

    def __len__(self) -> int:
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


def _columns(bound: int, sign: int) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    neg = "" if sign > 0 else "-"
    return (
        f"{neg}secs AS secs, {neg}util_known_s AS known, {neg}util_sum AS usum, "
        f"{neg}util_lt{bound}_s AS below, {neg}free_lt{bound}_s AS free"
    )


# Each query works out a row's class and its price once (OFFSET 0 keeps the planner from pulling the subquery up and
# copying the expressions into every sum, where they would run once per sum).
# A row's key: its device's instance (`dpk`) and its time. date_part gives float8, which is cheaper than extract's
# numeric.
_DEVICE_KEY = (
    "CAST((CAST(:dpk AS int4[]))[{d} - :dmin + 1] AS int8) * "
    + str(KEY_SCALE)
    + " + CAST(date_part('epoch', {t}) AS int8)"
)
_MIXED = "(CAST(:mkey AS int8[]))[mi] = key"
_PRICED = (
    # Each row's class is searched for once (OFFSET 0 keeps the planner from pulling the subquery up and copying the
    # searches into every sum, where they would run once per sum). A mixed day's daily row has no price here (its
    # sums come from its hours) and carries its signature.
    "y AS (SELECT r.*, (CAST(:pcls AS int4[]))[width_bucket(key, CAST(:pkey AS int8[]))] AS c, "
    "CASE WHEN daily THEN width_bucket(key, CAST(:mkey AS int8[])) ELSE 1 END AS mi FROM r OFFSET 0), "
    f"p AS (SELECT y.*, CASE WHEN {_MIXED} THEN (CAST(:msig AS int8[]))[mi] END AS sig, "
    f"CASE WHEN {_MIXED} THEN 0 ELSE (CAST(:crate AS float8[]))[c] END AS rate, "
    f"CASE WHEN {_MIXED} THEN 0 ELSE (CAST(:csrc AS int4[]))[c] END AS src, "
    f"CASE WHEN {_MIXED} THEN 0 ELSE (CAST(:cpay AS float8[]))[c] END AS pay FROM y OFFSET 0) "
)


@lru_cache(maxsize=64)
def _window_sql(bound: int, shape: tuple[tuple[str, int], ...], filtered: bool) -> str:
    only = " AND device_id = ANY(CAST(:ids AS int4[]))" if filtered else ""
    parts = []
    for i, (table, sign) in enumerate(shape):
        daily = table == DAILY
        t, name = ("day", "rollups_daily") if daily else ("hour", "rollups_hourly")
        version = "CAST(CAST(xmin AS text) AS int8)" if daily else "CAST(0 AS int8)"
        parts.append(
            f"SELECT device_id, {t} AS t, {'true' if daily else 'false'} AS daily, {version} AS version, "
            f"{_DEVICE_KEY.format(d='device_id', t=t)} AS key, {_columns(bound, sign)} FROM {name} "
            f"WHERE {t} >= :t{i}a AND {t} < :t{i}b{only}"
        )
    return (
        f"WITH r AS ({' UNION ALL '.join(parts)}), {_PRICED}"
        f"SELECT device_id, {_sums(bound, 'rate', 'src', 'pay')}, "
        "array_agg(CAST(date_part('epoch', t) AS int8)) FILTER (WHERE sig IS NOT NULL), "
        "array_agg(version) FILTER (WHERE sig IS NOT NULL), "
        "array_agg(sig) FILTER (WHERE sig IS NOT NULL) "
        "FROM p GROUP BY device_id"
    )


@lru_cache(maxsize=8)
def _days_sql(bound: int) -> str:
    return (
        "WITH q AS (SELECT * FROM unnest(CAST(:qids AS int4[]), CAST(:qdays AS timestamptz[])) AS q(device_id, day)), "
        f"r AS (SELECT h.device_id, q.day AS t, false AS daily, {_DEVICE_KEY.format(d='h.device_id', t='h.hour')} "
        f"AS key, {_columns(bound, 1)} FROM q JOIN rollups_hourly h ON h.device_id = q.device_id "
        "AND h.hour >= q.day AND h.hour < q.day + interval '24 hours'), "
        f"{_PRICED}SELECT device_id, CAST(date_part('epoch', t) AS int8), {_sums(bound, 'rate', 'src', 'pay')} "
        "FROM p GROUP BY device_id, t"
    )


@lru_cache(maxsize=8)
def _hours_sql(bound: int) -> str:
    return (
        f"WITH r AS (SELECT device_id, hour AS t, false AS daily, {_DEVICE_KEY.format(d='device_id', t='hour')} "
        f"AS key, {_columns(bound, 1)} FROM rollups_hourly "
        "WHERE device_id = ANY(CAST(:ids AS int4[])) AND hour >= :a AND hour < :b), "
        f"{_PRICED}SELECT device_id, t, {_sums(bound, 'rate', 'src', 'pay')} FROM p GROUP BY device_id, t"
    )


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
    params = classes.device_params(devices, devices) | {"ids": list(devices), "a": start, "b": end}
    out: dict[int, list[tuple[datetime, DeviceMoney]]] = {}
    for device_id, hour, *sums in fetch_binary(session, _hours_sql(idle_util_pct), params):
        out.setdefault(device_id, []).append((hour, DeviceMoney(*sums)))
    return out


def device_money(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    reads: Sequence[RollupRead],
    *,
    idle_util_pct: int,
    memo: MixedDays = MIXED_DAYS,
) -> dict[int, DeviceMoney]:
    """Per device of `devices` (device id -> instance pk), its hours in the pieces of `classes` over the rollup
    `reads` of a window; a device with no row in them is left out."""
    if not devices or not reads:
        return {}
    params = classes.device_params(devices, devices)
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    params["ids"] = list(devices)
    sql = _window_sql(idle_util_pct, tuple((r.table, r.sign) for r in reads), len(devices) <= 500)
    out: dict[int, DeviceMoney] = {}
    scope = (str(session.get_bind().engine.url), idle_util_pct)
    wanted: list[tuple[DayKey, int, int]] = []
    for device_id, *sums, days, versions, sigs in fetch_binary(session, sql, params):
        kept = memo.get_all(scope, device_id, days, versions, sigs, missing=wanted) if days else None
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
    return out


def _read_days(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    days: Sequence[DayKey],
    bound: int,
) -> dict[DayKey, DeviceMoney]:
    """The sums of the given device-days, read from their hourly rows, each hour at its price."""
    params = classes.device_params({d for d, _t in days}, devices) | {
        "qids": [d for d, _t in days],
        "qdays": [datetime.fromtimestamp(t, UTC) for _d, t in days],
    }
    return {(row[0], row[1]): DeviceMoney(*row[2:]) for row in fetch_binary(session, _days_sql(bound), params)}
