"""Waste by one grouping by holder, alone or with groupings by something of the instance, from what each value held
per instance (app/store/holder_groups.py): summed and priced in the database per group, so a month of a fleet by
user is a row per user, not per process, device or instance.

A group's row of no holder, "(none)", is what its values leave of its instances' figures. The figures are those of
app/analyse/holders.py, summed in another order: the same rows, faster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ..billing.prices import BILLED, SPOT_HISTORY
from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .figures import Figures
from .held_days import HeldHours, Price, held_days
from .kept_reads import KEPT, params_key, rows_version, split_reads
from .price_classes import FROM_BILL, FROM_SPOT, MIXED, DayKey, Grid, PriceClasses, class_sql, slot_sql, slots
from .window import DAILY, RollupRead, Window, floor_day, union_of_reads

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


_SLOT = slot_sql("islot", "instance_pk", "ilo", "ihi")
"""A row's instance's slot in the grid (0: none)."""
_HELD_ARRAYS = (
    ("hpk", "int8"),
    ("hkey", "int4"),
    ("hlabel", "int4"),
    ("hcls", "int4"),
    *((name, "float8") for name in ("hs", "hk", "hu", "hb", "hz")),
)
"""The held days' lists (`_held_params`) and their types."""


@lru_cache(maxsize=64)
def _sql(bound: int, shape: tuple[tuple[str, int], ...], priced: bool) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    names = ("secs_w", "known_w", "usum_w", f"lt{bound}_w", "unsized_s")
    lt = f"lt{bound}_w"
    if priced:
        # Each row at its hour's price class (app/analyse/device_money.py); a day that a price change cuts is read
        # from its hourly rows instead of its daily row, through the (grouping, instance_pk, time) index.
        parts = []
        for i, (table, sign) in enumerate(shape):
            t, name = ("day", "holder_groups_daily") if table == DAILY else ("hour", "holder_groups_hourly")
            signed = ", ".join(n if sign > 0 else f"-{n} AS {n}" for n in names)
            # The slot and the epoch once per row, then the class (OFFSET 0: not copied into each use).
            rows = (
                f"SELECT *, {_SLOT} AS s, date_part('epoch', {t}) AS e FROM {name} "
                f"WHERE grouping = :grouping AND {t} >= :t{i}a AND {t} < :t{i}b OFFSET 0"
            )
            cls = class_sql("g", "s", "e", f"r{i}")
            parts.append(f"SELECT instance_pk, key, label, {t} AS t, {cls} AS cls, {signed} FROM ({rows}) x")
        # The hours of the mixed days, summed per day, value and class (app/analyse/held_days.py), come as arrays.
        arrays = [f"CAST(string_to_array(:{a}, ',') AS {t}[])" for a, t in _HELD_ARRAYS]
        parts.append(
            "SELECT instance_pk, (CAST(:hkeys AS text[]))[k] AS key, (CAST(:hlabels AS text[]))[l] AS label, "
            f"CAST(NULL AS timestamptz) AS t, cls, {', '.join(names)} FROM unnest({', '.join(arrays)}) "
            f"AS h(instance_pk, k, l, cls, {', '.join(names)})"
        )
        # A daily row of a mixed day (class 0) is left out: that day's hours stand for it.
        rows = f"SELECT * FROM (SELECT * FROM ({' UNION ALL '.join(parts)}) u OFFSET 0) r WHERE cls <> {MIXED}"
        withs = ""
        keys = "instance_pk, key, cls"
    else:
        rows = union_of_reads(
            shape,
            ("holder_groups_daily", "holder_groups_hourly"),
            "instance_pk, key, label",
            names,
            "grouping = :grouping",
        )
        withs = ""
        keys = "instance_pk, key, 1 AS cls"
    # Per instance, value and price class first: seconds under the threshold had a figure, so known is at least
    # those.
    per_class = (
        f"SELECT {keys}, max(label) AS label, sum(secs_w) / 3600 AS s, "
        f"greatest(sum(known_w), sum({lt})) / 3600 AS k, sum({lt}) / 3600 AS b, sum(usum_w) / 3600 AS u, "
        f"sum(unsized_s) / 3600 AS z FROM ({rows}) r GROUP BY 1, 2, 3"
    )
    # A class's price per GPU-hour: the instance's own in class 1 (no piece), else the piece's; its source likewise.
    rate = "v.rate" if priced else "i.rate"
    if priced:
        per_class = (
            f"SELECT x.*, CASE WHEN cls = 1 THEN i.rate ELSE (CAST(:crate AS float8[]))[cls] * 3600 END AS rate, "
            f"(CAST(:csrc AS int4[]))[cls] AS src FROM ({per_class}) x JOIN i USING (instance_pk)"
        )
    money = [f"sum(v.{c} * {rate})" for c in ("s", "b", "k", "u")]
    unpriced = f"sum(v.s) FILTER (WHERE {rate} IS NULL)"
    own = "v.src = 0 AND " if priced else ""
    sources = [f"sum(v.s * {rate}) FILTER (WHERE {own}i.kind = '{k}')" for k in OWN_KINDS]
    piece_sources = [f"sum(v.s * v.rate) FILTER (WHERE v.src = {code})" for code in (FROM_BILL, FROM_SPOT)]
    sources += piece_sources if priced else ["0", "0"]
    sums = ", ".join(
        f"CAST(coalesce({e}, 0) AS float8)"
        for e in ("sum(v.s)", "sum(v.k)", "sum(v.b)", "sum(v.u)", *money, unpriced, "sum(v.z)", *sources)
    )
    return (
        "WITH i AS (SELECT * FROM unnest(CAST(:pks AS int8[]), CAST(:rates AS float8[]), CAST(:groups AS text[]), "
        f"CAST(:kinds AS text[])) AS i(instance_pk, rate, grp, kind)), {withs}v AS ({per_class}) "
        f"SELECT i.grp, v.key, max(v.label), {sums} FROM v JOIN i ON i.instance_pk = v.instance_pk "
        "GROUP BY 1, 2 HAVING sum(v.s) + sum(v.z) > 0.000001"
    )


def held_values(
    session: Session,
    window: Window,
    grouping: str,
    *,
    idle_util_pct: int,
    instances: Sequence[tuple[int, float | None, str, str | None]],
    classes: PriceClasses | None = None,
) -> list[ValueSums]:
    """What each value of `grouping` held over the window, per group of `instances`: (row id, USD per GPU-hour or
    None, group key, kind of that price) each; instances not listed are left out. Money is at each instance's price,
    or hour by hour at the price pieces' (`classes`, app/analyse/device_money.py). What the days before today sum to
    is kept while their rows and prices stay the same (app/analyse/kept_reads.py)."""
    reads = window.rollup_reads()
    if not reads or not instances:
        return []
    base: dict[str, Any] = {
        "grouping": grouping,
        "pks": [i[0] for i in instances],
        "rates": [i[1] for i in instances],
        "groups": [i[2] for i in instances],
        "kinds": [i[3] for i in instances],
    }
    before, after = split_reads(reads, floor_day(window.now))
    found: list[ValueSums] = []
    if before:
        span = int(min(r.start for r in before).timestamp()), int(max(r.end for r in before).timestamp())
        key = (
            "held values",
            str(session.get_bind().engine.url),
            idle_util_pct,
            tuple(before),
            params_key(base),
            classes.span_signature(*span) if classes is not None and classes.priced else None,
            rows_version(session, "holder", before, grouping=grouping),
        )
        kept: list[ValueSums] | None = KEPT.get(key)
        if kept is None:
            kept = _held(session, before, base, classes, idle_util_pct)
            KEPT.put(key, kept, len(kept))
        found += kept
    if after:
        found += _held(session, after, base, classes, idle_util_pct)
    return _merged(found) if before and after else found


def _held(
    session: Session,
    reads: Sequence[RollupRead],
    base: Mapping[str, Any],
    classes: PriceClasses | None,
    bound: int,
) -> list[ValueSums]:
    """`held_values` over `reads`, in one query."""
    params = dict(base)
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    priced = classes is not None and classes.priced
    if priced:
        assert classes is not None
        pks = sorted(classes.runs)
        grid = Grid()
        params |= classes.read_sections(grid, pks, reads)
        params["islot"], params["ilo"], params["ihi"] = slots({pk: i for i, pk in enumerate(pks, start=1)})
        # The mixed days read whole from the daily table stand for their hours, each at its price.
        days = [(pk, day) for pk, day in classes.mixed if _read_daily(reads, day)]
        held = held_days(session, str(base["grouping"]), days, classes, idle_util_pct=bound)
        params |= _held_params(classes, held)
        params["g"] = grid.to_bytes()
        params |= classes.params()  # after the held days: their prices are classes of `classes`
    sql = _sql(bound, tuple((r.table, r.sign) for r in reads), priced)
    make = ValueSums._make
    return [make(row) for row in fetch_binary(session, sql, params)]


def _merged(found: Sequence[ValueSums]) -> list[ValueSums]:
    """The sums of the same group and value added up (the days before today and today, read apart)."""
    out: dict[tuple[str, str], ValueSums] = {}
    for v in found:
        was = out.get((v.group, v.key))
        if was is None:
            out[v.group, v.key] = v
            continue
        labels = [x for x in (was.label, v.label) if x is not None]
        sums = [a + b for a, b in zip(was[3:], v[3:], strict=True)]
        out[v.group, v.key] = ValueSums(v.group, v.key, max(labels) if labels else None, *sums)
    return list(out.values())


def _held_params(classes: PriceClasses, held: Mapping[DayKey, Sequence[HeldHours]]) -> dict[str, Any]:
    """The held days' sums, summed again per instance, value and price, as the lists the query unnests, each price as
    its class in `classes`. Numbers go as one text each, values as positions in a list of the distinct ones: a list
    parameter of thousands of numbers or texts costs the client more to send than the query to read."""
    sums: dict[tuple[int, str, Price], list[float]] = {}
    labels: dict[tuple[int, str, Price], str | None] = {}
    for (pk, _day), hours in held.items():
        for h in hours:
            at = (pk, h.key, h.price)
            found = sums.get(at)
            if found is None:
                sums[at] = [h.secs_w, h.known_w, h.usum_w, h.below_w, h.unsized_s]
                labels[at] = h.label
                continue
            for i, v in enumerate((h.secs_w, h.known_w, h.usum_w, h.below_w, h.unsized_s)):
                found[i] += v
            if h.label is not None and (labels[at] is None or h.label > str(labels[at])):
                labels[at] = h.label  # as max(label) in the query
    keys = {key: n for n, key in enumerate(dict.fromkeys(key for _pk, key, _p in sums), start=1)}
    names = {name: n for n, name in enumerate(dict.fromkeys(labels.values()), start=1)}
    columns: list[list[float]] = [[] for _ in range(5)]
    for values in sums.values():
        for column, v in zip(columns, values, strict=True):
            column.append(v)
    return {
        "hkeys": list(keys),
        "hlabels": list(names),
        "hpk": _joined(pk for pk, _key, _p in sums),
        "hkey": _joined(keys[key] for _pk, key, _p in sums),
        "hlabel": _joined(names[labels[at]] for at in sums),
        "hcls": _joined(classes.class_of(price) for _pk, _key, price in sums),
        **{name: _joined(column) for name, column in zip(("hs", "hk", "hu", "hb", "hz"), columns, strict=True)},
    }


def _joined(values: Iterable[float]) -> str:
    """Numbers as `string_to_array` reads them back: repr gives each float's shortest exact text."""
    return ",".join(map(repr, values))


def _read_daily(reads: Sequence[RollupRead], day: int) -> bool:
    return any(r.table == DAILY and r.start.timestamp() <= day < r.end.timestamp() for r in reads)
