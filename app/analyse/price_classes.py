"""The price pieces of app/billing/prices.py as price classes, laid out for direct lookup: what the priced queries
(app/analyse/device_money.py, app/analyse/holder_groups.py) give each rollup row instead of searching the pieces.

A class is a price per GPU-second, its source (billed or spot history) and what it pays for offline capacity. Class 1
is "no piece" (the instance's own price, applied by the caller); class 0 marks a day that a piece boundary cuts (a
mixed day), which has no one price: its callers read its hours instead.

A grid is a run of unsigned 16-bit numbers in one bytea parameter, in sections, each the classes of some instances
(in slot order) at each step (an hour or a day) over one time range: a row of slot s at time t finds its class at
o + (s - 1) x n + (t - start) / step with `get_byte`, whose cost does not depend on the size of the bytea. A
subscript of an array parameter (or a `width_bucket` search of one) costs PostgreSQL in proportion to the array's
size on every row: about a microsecond per row for 9,000 entries, 2.5 for 300,000 bytes' worth of them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..billing.prices import BILLED, PricePiece
from .fleet import Fleet
from .window import DAILY, RollupRead

MIXED = 0
"""The class of a day with more than one price."""
NO_PIECE_CLASS = 1
"""The class of a time outside every piece: the instance's own price."""

Run = tuple[int, int, int]
"""(start, end, class): epoch seconds [start, end) at one price class, 2 or more."""
DAY_S = 86_400
HOUR_S = 3_600
DayKey = tuple[int, int]
"""A device-day or an instance-day: device id or instance pk, epoch seconds of its UTC midnight."""
NO_PIECE, FROM_BILL, FROM_SPOT = 0, 1, 2
"""A class's source code: the instance's own price, the bill, the spot price history."""


@dataclass
class Grid:
    """The grid (`values`: class numbers 0-65535, read from index 0 by `u16_sql`) as built, section by section."""

    values: list[int] = field(default_factory=list)

    def section(
        self,
        runs: Mapping[int, Sequence[Run]],
        pks: Sequence[int],
        start: int,
        step: int,
        n: int,
        mixed: Collection[tuple[int, int]] = (),
    ) -> int:
        """Append the classes of `pks` (slot 1, 2, ... in this order) at `start` + k x `step` for k < `n`: each the
        class of the run covering the step's first second, `MIXED` for a (pk, midnight) of `mixed` when the step is a
        day. Returns the section's first index, from 0. Work in proportion to the section and the runs."""
        first = len(self.values)
        for pk in pks:
            row = [NO_PIECE_CLASS] * n
            for a, b, c in runs.get(pk, ()):
                # The steps whose first second lies in [a, b).
                lo, hi = max(0, -((start - a) // step)), min(n, -((start - b) // step))
                if hi > lo:
                    row[lo:hi] = [c] * (hi - lo)
            if mixed:
                for k in range(n):
                    if (pk, start + k * step) in mixed:
                        row[k] = MIXED
            self.values.extend(row)
        return first

    def to_bytes(self) -> bytes:
        return u16_bytes(self.values)


def u16_bytes(values: Sequence[int]) -> bytes:
    """`values` (each 0-65535) as big-endian unsigned 16-bit numbers, as `u16_sql` reads them."""
    out = array("H", values)
    if sys.byteorder == "little":
        out.byteswap()
    return out.tobytes()


def u16_sql(param: str, index: str) -> str:
    """The `index`-th (int4, from 0) unsigned 16-bit number of the bytea parameter `:{param}`."""
    return f"(get_byte(:{param}, 2 * ({index})) * 256 + get_byte(:{param}, 2 * ({index}) + 1))"


def class_sql(grid: str, slot: str, epoch: str, section: str) -> str:
    """The class of a row at `epoch` (float8 seconds) of slot `slot` (an int4 column: 0 for none, class 1) in the
    section of the grid parameter `:{grid}` whose parameters are `:{section}o` (first index), `:{section}n` (steps),
    `:{section}e` (start, epoch seconds) and `:{section}s` (step, s). A time outside the section has class 1."""
    # Typed: an integer parameter goes over as the smallest type that holds it, and int2 arithmetic overflows.
    o, n = f"CAST(:{section}o AS int4)", f"CAST(:{section}n AS int4)"
    e, st = f"CAST(:{section}e AS float8)", f"CAST(:{section}s AS float8)"
    index = f"{o} + ({slot} - 1) * {n} + CAST(floor(({epoch} - {e}) / {st}) AS int4)"
    inside = f"{epoch} >= {e} AND {epoch} < {e} + {n} * {st}"
    return f"CASE WHEN {slot} > 0 AND {inside} THEN {u16_sql(grid, index)} ELSE {NO_PIECE_CLASS} END"


def slot_sql(param: str, key: str, low: str, high: str) -> str:
    """The slot of `key` (int4 or int8) in the bytea parameter `:{param}` (as `slots` makes it, from `:{low}` to
    `:{high}`); 0 outside."""
    at = f"CAST({key} - CAST(:{low} AS int8) AS int4)"
    return (
        f"CASE WHEN {key} BETWEEN CAST(:{low} AS int8) AND CAST(:{high} AS int8) THEN {u16_sql(param, at)} ELSE 0 END"
    )


def section_params(section: str, first: int, n: int, start: int, step: int) -> dict[str, int]:
    """The query parameters `class_sql` reads for one section."""
    return {f"{section}o": first, f"{section}n": n, f"{section}e": start, f"{section}s": step}


def slots(keys: Mapping[int, int]) -> tuple[bytes, int, int]:
    """Slots by key (device id or instance pk -> slot, 1-65535) as `slot_sql` reads them: 16 bits per key from the
    smallest to the largest (0 between), so small while the keys lie close together, as row ids do; and those two
    keys."""
    low, high = min(keys, default=0), max(keys, default=-1)
    out = [0] * (high - low + 1)
    for key, slot in keys.items():
        out[key - low] = slot
    return u16_bytes(out), low, high


@dataclass
class PriceClasses:
    """The pieces as price classes: per class (1-based, class 1 being "no piece"), its USD per GPU-second (`crate`),
    source code (`csrc`) and USD per GPU-second of paid-offline capacity (`cpay`); per instance pk, its runs of one
    class (time-ordered, apart); and the mixed instance-days (pk, epoch seconds of the UTC midnight) with their
    prices' signature."""

    crate: list[float] = field(default_factory=lambda: [0.0])
    csrc: list[int] = field(default_factory=lambda: [NO_PIECE])
    cpay: list[float] = field(default_factory=lambda: [0.0])
    runs: dict[int, list[Run]] = field(default_factory=dict)
    mixed: dict[DayKey, int] = field(default_factory=dict)
    _classes: dict[tuple[float, int, float], int] = field(default_factory=lambda: {(0.0, NO_PIECE, 0.0): 1})

    @property
    def priced(self) -> bool:
        """Whether any hour has a price of a piece."""
        return bool(self.runs)

    def params(self) -> dict[str, Any]:
        """The class arrays."""
        return {"crate": self.crate, "csrc": self.csrc, "cpay": self.cpay}

    def span_signature(self, start: int, end: int) -> Hashable:
        """The prices of every instance over [start, end) (epoch seconds): two spans with equal ones are priced alike.
        Work in proportion to the runs."""
        return (
            start,
            end,
            tuple(
                (pk, tuple((max(a, start), min(b, end), self.price_of(c)) for a, b, c in runs if a < end and b > start))
                for pk, runs in sorted(self.runs.items())
            ),
        )

    def price_of(self, c: int) -> tuple[float, int, float]:
        """Class `c`'s price (USD per GPU-second, source code, USD per GPU-second paid offline), as `class_of` takes
        it."""
        return (self.crate[c - 1], self.csrc[c - 1], self.cpay[c - 1])

    def class_of(self, price: tuple[float, int, float]) -> int:
        c = self._classes.get(price)
        if c is None:
            c = self._classes[price] = len(self._classes) + 1
            self.crate.append(price[0])
            self.csrc.append(price[1])
            self.cpay.append(price[2])
        return c

    def read_sections(self, grid: Grid, pks: Sequence[int], reads: Sequence[RollupRead]) -> dict[str, int]:
        """A section of `grid` per read (parameters r0, r1, ...: `class_sql`) over `pks`
        in slot order: by day for a daily read, whose mixed days are `MIXED`, by hour for an hourly one."""
        params: dict[str, int] = {}
        for i, r in enumerate(reads):
            step = DAY_S if r.table == DAILY else HOUR_S
            a = int(r.start.timestamp())
            n = (int(r.end.timestamp()) - a) // step
            mixed = self.mixed if r.table == DAILY else ()
            params |= section_params(f"r{i}", grid.section(self.runs, pks, a, step, n, mixed), n, a, step)
        return params

    def day_sections(self, grid: Grid, days: Iterable[DayKey]) -> dict[DayKey, int]:
        """A section of `grid` per instance-day, its 24 hours; each one's first index."""
        return {(pk, day): grid.section(self.runs, (pk,), day, HOUR_S, 24) for pk, day in days}


def price_classes(fleet: Fleet, pieces: Mapping[int, Sequence[PricePiece]]) -> PriceClasses:
    """The pieces (time-ordered, apart, by instance pk) as price classes. A piece of an instance whose GPU count is
    unknown has no price per GPU and changes nothing. Work in proportion to the pieces."""
    out = PriceClasses()
    for pk in sorted(pieces):
        inst = fleet.instances.get(pk)
        gpus = inst.price.gpus if inst is not None else None
        if not gpus:
            continue
        runs: list[tuple[int, int, tuple[float, int, float]]] = []
        for piece in pieces[pk]:
            a, b = piece.start_s, piece.end_s
            if b <= a:
                continue
            rate = piece.usd_per_hour / gpus / 3600
            price = (rate, FROM_BILL if piece.source == BILLED else FROM_SPOT, rate if piece.paid_offline else 0.0)
            if runs and runs[-1][1] == a and runs[-1][2] == price:
                runs[-1] = (runs[-1][0], b, price)
            else:
                runs.append((a, b, price))
        if not runs:
            continue
        out.runs[pk] = [(a, b, out.class_of(price)) for a, b, price in runs]
        # A boundary inside a day (not at its midnight) gives that day more than one price.
        cuts = {t - t % DAY_S for a, b, _p in runs for t in (a, b) if t % DAY_S}
        for day in sorted(cuts):
            inside = [(max(a, day), min(b, day + DAY_S), p) for a, b, p in runs if a < day + DAY_S and b > day]
            out.mixed[(pk, day)] = _signature(inside)
    return out


def _signature(runs: Sequence[tuple[int, int, tuple[float, int, float]]]) -> int:
    """The prices of one instance-day as a number: two days with the same one are priced alike. Python's hash of
    numbers and tuples of them is the same in every process run; kept sums are compared in one process only."""
    return hash(tuple(runs))
