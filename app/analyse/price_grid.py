"""Price classes laid out for direct lookup: what the priced queries (app/analyse/device_money.py,
app/analyse/holder_groups.py) give each rollup row instead of searching the price pieces for it.

A grid is one int4 array of sections, each the classes of some instances (in slot order) at each step (an hour or a
day) over one time range: a row of slot s at time t finds its class at o + (s - 1) x n + (t - start) / step, one
subscript. A search (`width_bucket` over the sorted piece boundaries) costs PostgreSQL about a microsecond per row
on a month of 300 instances' prices; a subscript of a fixed-width array with no NULLs costs next to nothing.

Class 1 is "no piece" (the instance's own price); class 0 marks a day that a piece boundary cuts (a mixed day),
which has no one price: its callers read its hours instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

MIXED = 0
"""The class of a day with more than one price."""
NO_PIECE_CLASS = 1
"""The class of a time outside every piece: the instance's own price."""

Run = tuple[int, int, int]
"""(start, end, class): epoch seconds [start, end) at one price class, 2 or more."""


@dataclass
class Grid:
    """The grid array (`values`, 1-based in SQL) as it is built, section by section."""

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
        day. Returns the section's first index, 1-based. Work in proportion to the section and the runs."""
        first = len(self.values) + 1
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


def class_sql(grid: str, slot: str, epoch: str, section: str) -> str:
    """The class of a row at `epoch` (float8 seconds) of slot `slot` (0 or NULL: none, class 1) in the section whose
    parameters are `:{section}o` (first index), `:{section}n` (steps), `:{section}e` (start, epoch seconds) and
    `:{section}s` (step, s), of the grid parameter `:{grid}`. A time outside the section has class 1."""
    # Typed: an integer parameter goes over as the smallest type that holds it, and int2 arithmetic overflows.
    o, n = f"CAST(:{section}o AS int4)", f"CAST(:{section}n AS int4)"
    e, st = f"CAST(:{section}e AS float8)", f"CAST(:{section}s AS float8)"
    index = f"{o} + ({slot} - 1) * {n} + CAST(floor(({epoch} - {e}) / {st}) AS int4)"
    inside = f"{epoch} >= {e} AND {epoch} < {e} + {n} * {st}"
    return f"CASE WHEN {slot} > 0 AND {inside} THEN (CAST(:{grid} AS int4[]))[{index}] ELSE {NO_PIECE_CLASS} END"


def section_params(section: str, first: int, n: int, start: int, step: int) -> dict[str, int]:
    """The query parameters `class_sql` reads for one section."""
    return {f"{section}o": first, f"{section}n": n, f"{section}e": start, f"{section}s": step}


def slots(pks: Sequence[int]) -> tuple[list[int], int]:
    """Each of `pks`' slot (its place in `pks`, from 1) in an array indexed by pk - the smallest + 1 (0 for pks not
    listed), and that smallest pk. Small while the keys lie close together, as row ids do."""
    low = min(pks, default=0)
    out = [0] * (max(pks, default=0) - low + 1)
    for i, pk in enumerate(pks, start=1):
        out[pk - low] = i
    return out, low
