"""Waste by one grouping by holder, alone or with groupings by something of the instance, from what each value held
per instance (app/store/holder_groups.py): summed and priced in the database per group, so a month of a fleet by
user is a row per user, not per process, device or instance.

A group's row of no holder, "(none)", is what its values leave of its instances' figures. The figures are those of
app/analyse/holders.py, summed in another order: the same rows, faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .figures import Figures
from .window import Window, union_of_reads

MISSING = {
    "user": "(unknown user)",
    "process": "(unknown process)",
    "container": "(no container)",
    "namespace": "(no namespace)",
    "pod": "(no pod)",
    "job": "(no job)",
}
"""The label of holders without a value for each grouping by holder (app.analyse.holders.HOLDER_GROUPS)."""


class ValueSums(NamedTuple):
    """What one value held over the window within one group of instances: hours are GPU-hours, money USD at each
    instance's price."""

    group: str
    """The group of instances (its keys joined by " / "; empty for a grouping by holder alone)."""
    key: str
    label: str | None
    gpu_h: float
    known_h: float
    """GPU-hours with a utilization figure; those under the idle threshold count as known."""
    below_h: float
    """GPU-hours with the device under the idle threshold: idle-held."""
    util_sum_h: float
    """Utilization x GPU-hours with a figure, %*h."""
    cost: float
    below_cost: float
    known_cost: float
    util_sum_cost: float
    unpriced_h: float
    unsized_h: float
    """Hours (of the clock) held on MIG slices of unknown size."""

    @property
    def figures(self) -> Figures:
        """As app.analyse.holders makes a holder's part: no idle, no time without a process."""
        return Figures(
            gpu_hours=self.gpu_h,
            active_h=max(0.0, self.known_h - self.below_h),
            idle_held_h=self.below_h,
            unknown_h=max(0.0, self.gpu_h - self.known_h),
            util_known_h=self.known_h,
            util_sum_h=self.util_sum_h,
            cost=self.cost,
            idle_held_cost=self.below_cost,
            unused_cost=max(0.0, self.known_cost - self.util_sum_cost / 100),
            unpriced_gpu_hours=self.unpriced_h,
            unsized_slice_h=self.unsized_h,
        )


def value_label(grouping: str, key: str, label: str | None) -> tuple[str, str]:
    """A stored value's (key, label) as app.analyse.holders.HOLDER_GROUPS gives it."""
    return (key, label or key) if key else ("", MISSING[grouping])


@dataclass(frozen=True)
class HeldValues:
    """What each value of `grouping` held per group of instances (`groups`: the names grouped by, in order)."""

    grouping: str
    groups: tuple[str, ...]
    sums: list[ValueSums]


@lru_cache(maxsize=64)
def _sql(bound: int, shape: tuple[tuple[str, int], ...]) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    names = ("secs_w", "known_w", "usum_w", f"lt{bound}_w", "unsized_s")
    tables = ("holder_groups_daily", "holder_groups_hourly")
    rows = union_of_reads(shape, tables, "instance_pk, key, label", names, "grouping = :grouping")
    lt = f"lt{bound}_w"
    # Per instance and value first: seconds under the threshold had a figure, so known is at least those.
    per_instance = (
        f"SELECT instance_pk, key, max(label) AS label, sum(secs_w) / 3600 AS s, "
        f"greatest(sum(known_w), sum({lt})) / 3600 AS k, sum({lt}) / 3600 AS b, sum(usum_w) / 3600 AS u, "
        f"sum(unsized_s) / 3600 AS z FROM ({rows}) r GROUP BY 1, 2"
    )
    sums = ", ".join(
        f"CAST(coalesce({e}, 0) AS float8)"
        for e in (
            "sum(v.s)",
            "sum(v.k)",
            "sum(v.b)",
            "sum(v.u)",
            "sum(v.s * i.rate)",
            "sum(v.b * i.rate)",
            "sum(v.k * i.rate)",
            "sum(v.u * i.rate)",
            "sum(v.s) FILTER (WHERE i.rate IS NULL)",
            "sum(v.z)",
        )
    )
    return (
        f"WITH i AS (SELECT * FROM unnest(CAST(:pks AS int8[]), CAST(:rates AS float8[]), CAST(:groups AS text[])) "
        f"AS i(instance_pk, rate, grp)), v AS ({per_instance}) "
        f"SELECT i.grp, v.key, max(v.label), {sums} FROM v JOIN i ON i.instance_pk = v.instance_pk "
        "GROUP BY 1, 2 HAVING sum(v.s) + sum(v.z) > 0.000001"
    )


def held_values(
    session: Session,
    window: Window,
    grouping: str,
    *,
    idle_util_pct: int,
    instances: Sequence[tuple[int, float | None, str]],
) -> list[ValueSums]:
    """What each value of `grouping` held over the window, per group of `instances`: (row id, USD per GPU-hour or
    None, group key) each; instances not listed are left out."""
    reads = window.rollup_reads()
    if not reads or not instances:
        return []
    params: dict[str, Any] = {
        "grouping": grouping,
        "pks": [i[0] for i in instances],
        "rates": [i[1] for i in instances],
        "groups": [i[2] for i in instances],
    }
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    sql = _sql(idle_util_pct, tuple((r.table, r.sign) for r in reads))
    make = ValueSums._make
    return [make(row) for row in fetch_binary(session, sql, params)]
