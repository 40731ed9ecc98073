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

from ..billing.prices import BILLED, SPOT_HISTORY
from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .figures import Figures
from .priced import PriceDeltas
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
OWN_KINDS = ("agent", "price file", "catalog")
"""The kinds of an instance's own price (app.pricing.resolve.Price.kind)."""
SOURCE_KINDS = (*OWN_KINDS, BILLED, SPOT_HISTORY)


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
    agent_usd: float
    price_file_usd: float
    catalog_usd: float
    billed_usd: float
    spot_usd: float

    @property
    def usd_by_source(self) -> dict[str, float]:
        """Its cost per kind of price source (`Price.kind`, "billed", "spot history"), USD; kinds with none left
        out."""
        usd = (self.agent_usd, self.price_file_usd, self.catalog_usd, self.billed_usd, self.spot_usd)
        found = zip(SOURCE_KINDS, usd, strict=True)
        return {kind: usd for kind, usd in found if usd > 1e-12}

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
def _sql(bound: int, shape: tuple[tuple[str, int], ...], priced: bool) -> str:
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
    money = ["sum(v.s * i.rate)", "sum(v.b * i.rate)", "sum(v.k * i.rate)", "sum(v.u * i.rate)"]
    unpriced = "sum(v.s) FILTER (WHERE i.rate IS NULL)"
    withs = f"v AS ({per_instance})"
    joins = ""
    if priced:
        # What the price pieces change (priced.PriceDeltas): each piece's rows of each value at the difference
        # from its instance's own price, per piece first (known is at least the seconds under the threshold, as
        # above), then per instance and value, one row each to join.
        arrays = ", ".join(f"CAST(:p{n} AS {t}[])" for n, t in _DELTA_TYPES)
        # LATERAL: each read probes its instance's rows through the (grouping, instance_pk, time) index; a join the
        # planner may pick would hash the whole window's hourly rows.
        reads = " UNION ALL ".join(
            f"SELECT p.n, r.instance_pk, r.key, p.sign * r.secs_w AS s, p.sign * r.known_w AS k, "
            f"p.sign * r.{lt} AS b, p.sign * r.usum_w AS u, p.delta, p.np, p.own, p.src FROM p CROSS JOIN LATERAL "
            f"(SELECT * FROM {table} h WHERE h.grouping = :grouping AND h.instance_pk = p.pk AND h.{col} >= p.a "
            f"AND h.{col} < p.b OFFSET 0) r WHERE {cond}"
            for table, col, cond in (
                ("holder_groups_daily", "day", "p.daily"),
                ("holder_groups_hourly", "hour", "NOT p.daily"),
            )
        )
        per_piece = (
            "SELECT instance_pk, key, sum(s) / 3600 AS s, greatest(sum(k), sum(b)) / 3600 AS k, sum(b) / 3600 AS b, "
            f"sum(u) / 3600 AS u, min(delta) AS delta, min(np) AS np, min(own) AS own, min(src) AS src "
            f"FROM ({reads}) r GROUP BY n, instance_pk, key"
        )
        withs += (
            f", p AS (SELECT * FROM unnest({arrays}) AS p({', '.join(n for n, _t in _DELTA_TYPES)})), "
            "d AS (SELECT instance_pk, key, sum(s * delta) AS cs, sum(b * delta) AS cb, sum(k * delta) AS ck, "
            f"sum(u * delta) AS cu, sum(s * np) AS ns, sum(s * own) AS displaced, "
            f"sum(s * (own + delta)) FILTER (WHERE src = '{BILLED}') AS billed, "
            f"sum(s * (own + delta)) FILTER (WHERE src = '{SPOT_HISTORY}') AS spot "
            f"FROM ({per_piece}) x GROUP BY 1, 2)"
        )
        joins = " LEFT JOIN d ON d.instance_pk = v.instance_pk AND d.key = v.key"
        money = [f"{e} + coalesce(sum(d.{c}), 0)" for e, c in zip(money, ("cs", "cb", "ck", "cu"), strict=True)]
        unpriced = f"coalesce({unpriced}, 0) - coalesce(sum(d.ns), 0)"
    # The cost by price source (OWN_KINDS, then the pieces'): at each own price, less the hours pieces priced.
    displaced = " - coalesce(sum(d.displaced) FILTER (WHERE i.kind = '{k}'), 0)" if priced else ""
    sources = [
        f"coalesce(sum(v.s * i.rate) FILTER (WHERE i.kind = '{k}'), 0){displaced.format(k=k)}" for k in OWN_KINDS
    ]
    sources += ["sum(d.billed)", "sum(d.spot)"] if priced else ["0", "0"]
    sums = ", ".join(
        f"CAST(coalesce({e}, 0) AS float8)"
        for e in ("sum(v.s)", "sum(v.k)", "sum(v.b)", "sum(v.u)", *money, unpriced, "sum(v.z)", *sources)
    )
    return (
        "WITH i AS (SELECT * FROM unnest(CAST(:pks AS int8[]), CAST(:rates AS float8[]), CAST(:groups AS text[]), "
        f"CAST(:kinds AS text[])) AS i(instance_pk, rate, grp, kind)), {withs} "
        f"SELECT i.grp, v.key, max(v.label), {sums} FROM v JOIN i ON i.instance_pk = v.instance_pk{joins} "
        "GROUP BY 1, 2 HAVING sum(v.s) + sum(v.z) > 0.000001"
    )


_DELTA_TYPES = (
    ("n", "int4"),
    ("pk", "int8"),
    ("daily", "bool"),
    ("a", "timestamptz"),
    ("b", "timestamptz"),
    ("sign", "float8"),
    ("delta", "float8"),
    ("np", "float8"),
    ("own", "float8"),
    ("src", "text"),
)
"""priced.PriceDeltas' arrays and their types."""


def held_values(
    session: Session,
    window: Window,
    grouping: str,
    *,
    idle_util_pct: int,
    instances: Sequence[tuple[int, float | None, str, str | None]],
    deltas: PriceDeltas | None = None,
) -> list[ValueSums]:
    """What each value of `grouping` held over the window, per group of `instances`: (row id, USD per GPU-hour or
    None, group key, kind of that price) each; instances not listed are left out. Money is at each instance's price,
    changed hour by hour by `deltas` (the price pieces, app/analyse/priced.py)."""
    reads = window.rollup_reads()
    if not reads or not instances:
        return []
    params: dict[str, Any] = {
        "grouping": grouping,
        "pks": [i[0] for i in instances],
        "rates": [i[1] for i in instances],
        "groups": [i[2] for i in instances],
        "kinds": [i[3] for i in instances],
    }
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    priced = deltas is not None and bool(deltas.n)
    if priced:
        assert deltas is not None
        params |= deltas.params()
    sql = _sql(idle_util_pct, tuple((r.table, r.sign) for r in reads), priced)
    make = ValueSums._make
    return [make(row) for row in fetch_binary(session, sql, params)]
