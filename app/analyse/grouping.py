"""Grouping units: by something of their instance (type, region, zone, lifecycle, a tag, the instance itself), by
something of the unit (GPU model, GPU, slice), by the process that held it (user, process, container, namespace,
pod, Slurm job: app/analyse/holders.py), and by combinations of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..billing.prices import BILLED, SPOT_HISTORY
from .figures import Figures, Unit
from .fleet import InstanceInfo
from .holder_groups import HeldValues, value_label
from .holders import HOLDER_GROUPS, NO_HOLDER, Part, holder_key, rest

InstanceKey = Callable[[InstanceInfo], tuple[str, str]]
UnitKey = Callable[[Unit], tuple[str, str]]


def _tag_key(tag: str) -> InstanceKey:
    def key(i: InstanceInfo) -> tuple[str, str]:
        value = i.tags.get(tag)
        return (value, value) if value is not None else ("", f"(no {tag} tag)")

    return key


def _field_key(name: str, missing: str) -> InstanceKey:
    def key(i: InstanceInfo) -> tuple[str, str]:
        value = getattr(i, name)
        return (value, value) if value else ("", missing)

    return key


def _instance_key(i: InstanceInfo) -> tuple[str, str]:
    return i.instance_id, i.name


def _gpu_key(u: Unit) -> tuple[str, str]:
    return str(u.gpu.pk), u.gpu.label


def _slice_key(u: Unit) -> tuple[str, str]:
    return u.key, u.label


def _model_key(u: Unit) -> tuple[str, str]:
    model = u.instance.gpu_model or u.gpu.name
    return model, model


# Groupings by something of the instance add up per-instance figures; the others go unit by unit.
INSTANCE_GROUPS: dict[str, InstanceKey] = {
    "instance": _instance_key,
    "instance_type": _field_key("instance_type", "(no instance type)"),
    "region": _field_key("region", "(no region)"),
    "availability_zone": _field_key("availability_zone", "(no zone)"),
    "lifecycle": _field_key("lifecycle", "(no lifecycle)"),
}
UNIT_GROUPS: dict[str, UnitKey] = {"gpu_model": _model_key, "gpu": _gpu_key, "slice": _slice_key}
GROUPS = (*INSTANCE_GROUPS, *UNIT_GROUPS, *HOLDER_GROUPS)
"""Every group-by name, besides `tag:<key>`."""


def is_group_name(name: str) -> bool:
    return name in GROUPS or (name.startswith("tag:") and len(name) > 4)


def instance_key(name: str) -> InstanceKey | None:
    """The (key, label) of an instance in a grouping by something of the instance; None for a unit-level one.
    KeyError for an unknown name."""
    if name.startswith("tag:") and len(name) > 4:
        return _tag_key(name[4:])
    if name in UNIT_GROUPS or name in HOLDER_GROUPS:
        return None
    return INSTANCE_GROUPS[name]


def by_holder(names: Sequence[str]) -> bool:
    """Whether a grouping of these names splits units among their holders."""
    return any(n in HOLDER_GROUPS for n in names)


def by_value(names: Sequence[str]) -> str | None:
    """The one grouping by holder among `names` when the others are all by something of the instance: such a
    grouping reads what each value held per instance (app/store/holder_groups.py), not every process; else None."""
    held = [n for n in names if n in HOLDER_GROUPS]
    if len(held) != 1 or any(n not in HOLDER_GROUPS and instance_key(n) is None for n in names):
        return None
    return held[0]


def _unit_level(name: str) -> UnitKey:
    if name in UNIT_GROUPS:
        return UNIT_GROUPS[name]
    key = instance_key(name)
    assert key is not None
    return lambda u: key(u.instance)


def _part_level(name: str) -> Callable[[Part], tuple[str, str]]:
    key = holder_key(name)
    if key is not None:
        return key
    unit_key = _unit_level(name)
    return lambda p: unit_key(p.unit)


@dataclass
class GroupRow:
    key: str
    label: str
    figures: Figures = field(default_factory=Figures)
    units: list[Unit] = field(default_factory=list)
    gpus: set[int] = field(default_factory=set)
    prices: set[str] = field(default_factory=set)
    """Sources of the prices of this row's units."""
    usd_by_source: dict[str, float] = field(default_factory=dict)
    """The row's cost per kind of price source (`Price.kind`, "billed", "spot history"), USD."""
    parts: list[tuple[str, str]] = field(default_factory=list)
    """(key, label) per grouping, in the order asked for."""

    @property
    def sample(self) -> Unit:
        return self.units[0]

    def add_sources(self, usd_by_source: Mapping[str, float], scale: float = 1.0) -> None:
        for kind, usd in usd_by_source.items():
            self.usd_by_source[kind] = self.usd_by_source.get(kind, 0.0) + usd * scale

    @property
    def source_shares(self) -> dict[str, float]:
        """Each price source's share of the row's priced dollars, 0-1, largest first."""
        total = sum(self.usd_by_source.values())
        if total <= 0:
            return {}
        return {k: v / total for k, v in sorted(self.usd_by_source.items(), key=lambda kv: -kv[1]) if v > 0}


PIECE_SOURCES = (BILLED, SPOT_HISTORY)


def price_labels(unit: Unit) -> set[str]:
    """The sources of a unit's prices as rows list them: the instance's own (as app/pricing words it) where some of
    its cost is at that price or it has none, and "billed" or "spot history" where the bill or the history priced
    some of it."""
    own = unit.instance.price
    labels = {kind if kind in PIECE_SOURCES else own.source for kind, usd in unit.usd_by_source().items() if usd}
    return labels or {own.source}


def group_rows(
    by_instance: dict[int, GroupRow],
    units: Sequence[Unit],
    names: Sequence[str],
    parts: Sequence[Part] | None = None,
    values: HeldValues | None = None,
) -> list[GroupRow]:
    """Rows per combination of the named groupings (keys and labels joined by " / "), largest waste
    first. Groupings by something of the instance add up per-instance figures; one grouping by holder among them
    takes what each value held per group (`values`, read for these names, needed for it); other groupings by holder
    go part by part (`parts`: the units split among their holders, needed for them); the rest go unit by unit.
    KeyError for an unknown name; ValueError for a grouping by holder without what it needs."""
    instance_keys = [instance_key(n) for n in names]
    rows: dict[str, GroupRow] = {}

    def row_for(parts: list[tuple[str, str]]) -> GroupRow:
        key = " / ".join(k for k, _l in parts)
        row = rows.get(key)
        if row is None:
            row = rows[key] = GroupRow(key, " / ".join(label for _k, label in parts))
            row.parts = parts
        return row

    single = by_value(names)
    if single is not None and (values is not None or parts is None):
        if values is None or values.groups != tuple(names):
            raise ValueError(f"a grouping by {single} needs what each of its values held, read for {list(names)}")
        _add_values(row_for, by_instance, names, values)
    elif by_holder(names):
        if parts is None:
            raise ValueError("a grouping by holder needs the units split among their holders")
        part_keys = [_part_level(n) for n in names]
        for part in parts:
            unit = part.unit
            row = row_for([k(part) for k in part_keys])
            row.figures.add(part.figures)
            row.units.append(unit)
            row.gpus.add(unit.gpu.pk)
            row.prices |= price_labels(unit)
            whole = unit.figures().cost
            if whole:
                row.add_sources(unit.usd_by_source(), part.figures.cost / whole)
    elif all(k is not None for k in instance_keys):
        for inst_row in by_instance.values():
            inst = inst_row.sample.instance
            row = row_for([k(inst) for k in instance_keys if k is not None])
            row.figures.add(inst_row.figures)
            row.units.extend(inst_row.units)
            row.gpus |= inst_row.gpus
            row.prices |= inst_row.prices
            row.add_sources(inst_row.usd_by_source)
    else:
        unit_keys = [_unit_level(n) for n in names]
        for unit in units:
            row = row_for([k(unit) for k in unit_keys])
            row.figures.add(unit.figures())
            row.units.append(unit)
            row.gpus.add(unit.gpu.pk)
            row.prices |= price_labels(unit)
            row.add_sources(unit.usd_by_source())
    return sorted(rows.values(), key=lambda r: (-r.figures.waste, -r.figures.cost, r.label))


def instance_group(names: Sequence[str], inst: InstanceInfo) -> str:
    """The key of an instance's group under the groupings by something of the instance among `names` (empty when
    there are none): what app.analyse.holder_groups sums values per."""
    return " / ".join(key(inst)[0] for n in names if (key := instance_key(n)) is not None)


def _add_values(
    row_for: Callable[[list[tuple[str, str]]], GroupRow],
    by_instance: dict[int, GroupRow],
    names: Sequence[str],
    held: HeldValues,
) -> None:
    """Each group of instances split among the values of the grouping by holder that held its devices, and what they
    leave of it as the part of no holder. A value's row names one instance of its group as its sample."""
    keys = [instance_key(n) for n in names]
    at = names.index(held.grouping)
    bases: dict[str, list[tuple[str, str]]] = {}
    members: dict[str, list[GroupRow]] = {}
    for inst_row in by_instance.values():
        inst = inst_row.sample.instance
        base = [k(inst) if k is not None else (NO_HOLDER, NO_HOLDER) for k in keys]
        group = " / ".join(b[0] for b, k in zip(base, keys, strict=True) if k is not None)
        bases.setdefault(group, base)
        members.setdefault(group, []).append(inst_row)
    prices = {g: {p for m in rows for p in m.prices} for g, rows in members.items()}
    sources: dict[str, GroupRow] = {}
    for g, rows in members.items():
        summed = sources[g] = GroupRow(g, g)
        for m in rows:
            summed.add_sources(m.usd_by_source)
    taken: dict[str, Figures] = {}
    for v in held.sums:
        found = bases.get(v.group)
        if found is None:
            continue
        figures = v.figures
        taken.setdefault(v.group, Figures()).add(figures)
        parts = list(found)
        parts[at] = value_label(held.grouping, v.key, v.label)
        row = row_for(parts)
        row.figures.add(figures)
        if not row.units:
            row.units.append(members[v.group][0].sample)
        row.prices |= prices[v.group]
        row.add_sources(v.usd_by_source)
        left_sources = sources[v.group].usd_by_source
        for kind, usd in v.usd_by_source.items():
            left_sources[kind] = left_sources.get(kind, 0.0) - usd
    for group, inst_rows in members.items():
        whole = Figures()
        for inst_row in inst_rows:
            whole.add(inst_row.figures)
        left = rest(whole, [taken[group]]) if group in taken else whole
        if left.all_hours > 1e-9 or left.capacity_unknown:
            row = row_for(bases[group])
            row.figures.add(left)
            for inst_row in inst_rows:
                row.units.extend(inst_row.units)
                row.gpus |= inst_row.gpus
            row.prices |= prices[group]
            # What the values leave of the group's cost by source (each value's own, from the database).
            row.add_sources({k: usd for k, usd in sources[group].usd_by_source.items() if usd > 1e-9})


def per_instance(units: Iterable[Unit]) -> dict[int, GroupRow]:
    rows: dict[int, GroupRow] = {}
    own: dict[int, float] = {}  # cost at the instance's own price, of units priced at nothing else (most)
    for unit in units:
        inst = unit.instance
        row = rows.get(inst.pk)
        if row is None:
            row = rows[inst.pk] = GroupRow(inst.instance_id, inst.name)
            own[inst.pk] = 0.0
        row.figures.add(unit.figures())
        row.units.append(unit)
        row.gpus.add(unit.gpu.pk)
        if unit.sources is None:
            own[inst.pk] += unit.figures().cost
        else:
            row.add_sources(unit.sources)
            row.prices |= price_labels(unit)
    for pk, row in rows.items():
        price = row.sample.instance.price
        if own[pk] and price.kind is not None:
            row.add_sources({price.kind: own[pk]})
            row.prices.add(price.source)
        if not row.prices:
            row.prices.add(price.source)
    return rows


def summarise(rows: Iterable[GroupRow]) -> Figures:
    total = Figures()
    for row in rows:
        total.add(row.figures)
    return total
