"""Grouping units: by something of their instance (type, region, zone, lifecycle, a tag, the instance itself), by
something of the unit (GPU model, GPU, slice), by the process that held it (user, process, container, namespace,
pod, Slurm job: app/analyse/holders.py), and by combinations of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .figures import Figures, Unit
from .fleet import InstanceInfo
from .holders import HOLDER_GROUPS, NO_HOLDER, GroupHeld, Part, group_figures, holder_key, rest_of, value_label

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
    parts: list[tuple[str, str]] = field(default_factory=list)
    """(key, label) per grouping, in the order asked for."""

    @property
    def sample(self) -> Unit:
        return self.units[0]


def group_rows(
    by_instance: dict[int, GroupRow],
    units: Sequence[Unit],
    names: Sequence[str],
    parts: Sequence[Part] | None = None,
    values: tuple[str, dict[int, list[GroupHeld]]] | None = None,
) -> list[GroupRow]:
    """Rows per combination of the named groupings (keys and labels joined by " / "), largest waste
    first. Groupings by something of the instance add up per-instance figures; one grouping by holder among them
    adds up what each value held per instance (`values`: the grouping and, per instance, its values, needed for
    it); other groupings by holder go part by part (`parts`: the units split among their holders, needed for
    them); the rest go unit by unit. KeyError for an unknown name; ValueError for a grouping by holder without
    what it needs."""
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
        if values is None or values[0] != single:
            raise ValueError(f"a grouping by {single} needs what each of its values held per instance")
        _add_values(rows, row_for, by_instance, names, single, values[1])
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
            row.prices.add(unit.instance.price.source)
    elif all(k is not None for k in instance_keys):
        for inst_row in by_instance.values():
            inst = inst_row.sample.instance
            row = row_for([k(inst) for k in instance_keys if k is not None])
            row.figures.add(inst_row.figures)
            row.units.extend(inst_row.units)
            row.gpus |= inst_row.gpus
            row.prices |= inst_row.prices
    else:
        unit_keys = [_unit_level(n) for n in names]
        for unit in units:
            row = row_for([k(unit) for k in unit_keys])
            row.figures.add(unit.figures())
            row.units.append(unit)
            row.gpus.add(unit.gpu.pk)
            row.prices.add(unit.instance.price.source)
    return sorted(rows.values(), key=lambda r: (-r.figures.waste, -r.figures.cost, r.label))


def _add_values(
    rows: dict[str, GroupRow],
    row_for: Callable[[list[tuple[str, str]]], GroupRow],
    by_instance: dict[int, GroupRow],
    names: Sequence[str],
    grouping: str,
    held: dict[int, list[GroupHeld]],
) -> None:
    """Each instance's figures split among the values of `grouping` that held its devices, and what they leave as
    the part of no holder."""
    keys = [instance_key(n) for n in names]
    at = names.index(grouping)
    for pk, inst_row in by_instance.items():
        inst = inst_row.sample.instance
        base = [k(inst) if k is not None else (NO_HOLDER, NO_HOLDER) for k in keys]
        rate = inst.price.usd_per_gpu_hour
        taken = Figures()
        for g in held.get(pk, ()):
            figures = group_figures(g, rate)
            taken.add(figures)
            parts = list(base)
            parts[at] = value_label(grouping, g.key, g.label)
            _add_to(row_for(parts), figures, inst_row)
        rest = rest_of(inst_row.figures, taken)
        if rest.all_hours > 1e-9 or rest.capacity_unknown:
            _add_to(row_for(base), rest, inst_row)


def _add_to(row: GroupRow, figures: Figures, inst_row: GroupRow) -> None:
    row.figures.add(figures)
    row.units.extend(inst_row.units)
    row.gpus |= inst_row.gpus
    row.prices |= inst_row.prices


def per_instance(units: Iterable[Unit]) -> dict[int, GroupRow]:
    rows: dict[int, GroupRow] = {}
    for unit in units:
        inst = unit.instance
        row = rows.get(inst.pk)
        if row is None:
            row = rows[inst.pk] = GroupRow(inst.instance_id, inst.name)
            row.prices.add(inst.price.source)
        row.figures.add(unit.figures())
        row.units.append(unit)
        row.gpus.add(unit.gpu.pk)
    return rows


def summarise(rows: Iterable[GroupRow]) -> Figures:
    total = Figures()
    for row in rows:
        total.add(row.figures)
    return total
