"""Waste by holder: each unit's figures over a window split among the processes that held its device
(docs/waste.md, "Holders").

The holder rollups (app/store/holders.py) give each process its share of the device's seconds: an interval with two
processes gives each half. A holder's part of the unit is its seconds, with the device's utilization over them,
weighted and priced as the unit is; what the holders' parts leave of the unit (time with no process, idle time,
offline time, unpartitioned capacity) is the part of no holder, "(none)". The parts of a unit add up to the unit, so
every grouping by holder adds up to the same totals as any other grouping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .figures import Figures, Unit, usage_figures
from .holder_groups import MISSING
from .states import UNPARTITIONED
from .usage import DeviceUsage
from .window import Window, union_of_reads

NO_HOLDER = "(none)"
"""The group of time no process held: its key and its label."""


class HolderInfo(NamedTuple):
    """A process that held a device (`holders`): strings as the agent sent them."""

    pk: int
    instance_pk: int
    pid: int
    executable: str | None
    uid: int | None
    user_name: str | None
    container_id: str | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    job_id: str | None
    started_at: datetime | None
    first_seen: datetime
    """Start of the first interval it was seen in, on any device of its instance."""
    last_seen: datetime


class HeldUsage(NamedTuple):
    """One holder's part of one device over a window, s (its share of each interval's seconds)."""

    device_id: int
    holder_id: int
    secs: float
    util_known_s: float
    util_sum: float
    """The device's utilization x the seconds with a figure, %*s."""
    below_s: float
    """Seconds with the device's utilization under the idle threshold: idle-held."""
    mem_known_s: float
    """Seconds (whole, not shared) with a memory figure for the holder."""
    mem_mib_s: float
    """Memory held x those seconds, MiB*s."""

    @property
    def avg_mem_mib(self) -> float | None:
        """Mean memory held over the seconds with a figure, MiB."""
        return self.mem_mib_s / self.mem_known_s if self.mem_known_s > 0 else None


@dataclass(slots=True)
class Part:
    """What one holder (None: no holder) makes of one unit over the window."""

    unit: Unit
    holder: HolderInfo | None
    figures: Figures
    held: HeldUsage | None = None
    """The holder's seconds and memory on the unit's device, before any scaling; None for no holder."""


HolderKey = Callable[[HolderInfo], tuple[str, str]]


def _attribute(name: str, missing: str) -> HolderKey:
    def key(h: HolderInfo) -> tuple[str, str]:
        value: str | None = getattr(h, name)
        return (value, value) if value else ("", missing)

    return key


def _user(h: HolderInfo) -> tuple[str, str]:
    if h.user_name:
        return h.user_name, h.user_name
    if h.uid is not None:
        return f"uid {h.uid}", f"uid {h.uid}"
    return "", MISSING["user"]


def _container(h: HolderInfo) -> tuple[str, str]:
    # As `docker ps` shows an id: its first 12 characters.
    return (h.container_id, h.container_id[:12]) if h.container_id else ("", MISSING["container"])


def _pod(h: HolderInfo) -> tuple[str, str]:
    if not h.pod and not h.pod_uid:
        return "", MISSING["pod"]
    name = h.pod or h.pod_uid or ""
    label = f"{h.namespace}/{name}" if h.namespace else name
    return h.pod_uid or label, label


HOLDER_GROUPS: dict[str, HolderKey] = {
    "user": _user,
    "process": _attribute("executable", MISSING["process"]),
    "container": _container,
    "namespace": _attribute("namespace", MISSING["namespace"]),
    "pod": _pod,
    "job": _attribute("job_id", MISSING["job"]),
}
"""Groupings by the process holding a device; `process` groups by executable name, `job` by Slurm job id."""


def holder_key(name: str) -> Callable[[Part], tuple[str, str]] | None:
    """The (key, label) of a part in a grouping by holder; None for another grouping."""
    key = HOLDER_GROUPS.get(name)
    if key is None:
        return None

    def of(part: Part) -> tuple[str, str]:
        return key(part.holder) if part.holder is not None else (NO_HOLDER, NO_HOLDER)

    return of


GROUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "user": ("uid", "user_name"),
    "process": ("executable",),
    "container": ("container_id",),
    "namespace": ("namespace",),
    "pod": ("pod_uid", "namespace", "pod"),
    "job": ("job_id",),
}
"""The `holders` columns each grouping by holder reads."""
_INFO_COLUMNS = (
    ("instance_pk", "int8"),
    ("pid", "int4"),
    ("executable", "text"),
    ("uid", "int8"),
    ("user_name", "text"),
    ("container_id", "text"),
    ("pod_uid", "text"),
    ("namespace", "text"),
    ("pod", "text"),
    ("job_id", "text"),
    ("started_at", "timestamptz"),
)
"""HolderInfo's fields after its id, before its first and last seen, with their types."""
_SUMS = ("secs", "util_known_s", "util_sum", "lt{b}_s", "mem_known_s", "mem_mib_s")


def holder_columns(names: Sequence[str]) -> tuple[str, ...]:
    """The `holders` columns the named groupings by holder read, in HolderInfo's order."""
    wanted = {c for n in names for c in GROUP_COLUMNS.get(n, ())}
    return tuple(c for c, _t in _INFO_COLUMNS if c in wanted)


@lru_cache(maxsize=64)
def _held_sql(bound: int, shape: tuple[tuple[str, int], ...], filtered: bool, columns: tuple[str, ...] | None) -> str:
    """Per device and holder (`columns` None), or per device and value of `columns` (holders alike in them taken
    together, so a month by user is a row per device and user rather than per process): the sums over the window,
    then HolderInfo's fields (NULL for one not read) with its first and last seen."""
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    names = [n.format(b=bound) for n in _SUMS]
    device_filter = "device_id = ANY(CAST(:ids AS int4[]))" if filtered else ""
    tables = ("holder_rollups_daily", "holder_rollups_hourly")
    rollups = union_of_reads(shape, tables, "device_id, holder_id", names, device_filter)
    sums = ", ".join(f"CAST(sum({n}) AS float8) AS {n}" for n in names)
    if columns is None:
        info = ", ".join(f"h.{c}" for c, _t in _INFO_COLUMNS)
        return (
            f"SELECT u.*, {info}, h.first_seen, h.last_seen FROM (SELECT device_id, holder_id, {sums} "
            f"FROM ({rollups}) r GROUP BY 1, 2 HAVING sum(secs) > 0.001) u JOIN holders h ON h.id = u.holder_id"
        )
    info = ", ".join(f"h.{c}" if c in columns else f"CAST(NULL AS {t})" for c, t in _INFO_COLUMNS)
    keys = ", ".join(f"h.{c}" for c in columns)
    return (
        f"SELECT r.device_id, 0, {sums}, {info}, min(h.first_seen), max(h.last_seen) "
        f"FROM ({rollups}) r JOIN holders h ON h.id = r.holder_id "
        f"GROUP BY r.device_id, {keys} HAVING sum(secs) > 0.001"
    )


def held_usage(
    session: Session,
    window: Window,
    *,
    idle_util_pct: int,
    device_ids: Sequence[int] | None = None,
    columns: tuple[str, ...] | None = None,
) -> tuple[dict[int, list[HeldUsage]], dict[int, HolderInfo]]:
    """Per device, its holders' parts over the window, and the holders they name; `device_ids` narrows the read.
    With `columns` (holder_columns), a holder is every process alike in them, numbered here, with only those
    fields."""
    reads = window.rollup_reads()
    by_device: dict[int, list[HeldUsage]] = {}
    holders: dict[int, HolderInfo] = {}
    if not reads or (device_ids is not None and not device_ids):
        return by_device, holders
    params: dict[str, Any] = {}
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    if device_ids is not None:
        params["ids"] = list(device_ids)
    sql = _held_sql(idle_util_pct, tuple((r.table, r.sign) for r in reads), device_ids is not None, columns)
    make_usage, make_holder = HeldUsage._make, HolderInfo._make
    numbers: dict[tuple[Any, ...], int] = {}
    for row in fetch_binary(session, sql, params):
        holder_id = row[1]
        if columns is not None:
            values = tuple(row[8:19])
            holder_id = numbers.setdefault(values, len(numbers) + 1)
        usage = make_usage((row[0], holder_id, *row[2:8]))
        by_device.setdefault(usage.device_id, []).append(usage)
        if holder_id not in holders:
            holders[holder_id] = make_holder((holder_id, *row[8:]))
    return by_device, holders


_FIELDS = tuple(f.name for f in fields(Figures))


def rest(whole: Figures, parts: Sequence[Figures]) -> Figures:
    """What `parts` leave of `whole`, field by field, never under 0."""
    left = Figures()
    for name in _FIELDS:
        setattr(left, name, max(0.0, getattr(whole, name) - sum(getattr(p, name) for p in parts)))
    return left


def _held_figures(unit: Unit, held: HeldUsage, scale: float) -> Figures:
    """A holder's part of a unit: its seconds as the unit's, with no idle and no time without a process (a device
    that a process holds is never idle). Seconds under the idle threshold had a utilization figure, so they count
    as known even in rows written before holder rollups had utilization (migration 0012). Priced at the unit's mean
    price over the window: for a unit priced piece by piece, each holder's part is the same share of every hour."""
    known = max(held.util_known_s, held.below_s)
    usage = DeviceUsage(
        held.device_id, held.secs * scale, known * scale, held.util_sum * scale, held.below_s * scale, 0.0, 0.0
    )
    if unit.weight is None:
        return Figures(unsized_slice_h=usage.covered_s / 3600)
    return usage_figures(usage, unit.weight, unit.mean_usd_per_gpu_hour, 0.0)


def split_units(units: Sequence[Unit], held: dict[int, list[HeldUsage]], holders: dict[int, HolderInfo]) -> list[Part]:
    """Every unit as its holders' parts and the part of no holder (left out where it is empty). Unpartitioned
    capacity has no holder. Where a device's holders claim more seconds than its unit covers (a GPU whose MIG mode
    changed in the window: only its passthrough time is its unit's), their parts are scaled down to fit."""
    parts: list[Part] = []
    for unit in units:
        whole = unit.figures()
        device = unit.slice.pk if unit.slice is not None else unit.gpu.pk
        found = held.get(device) if unit.kind != UNPARTITIONED else None
        if not found:
            parts.append(Part(unit, None, whole))
            continue
        claimed = sum(h.secs for h in found)
        covered = unit.covered_s
        scale = min(1.0, covered / claimed) if claimed > 0 else 0.0
        mine = [Part(unit, holders[h.holder_id], _held_figures(unit, h, scale), h) for h in found]
        parts.extend(mine)
        left = rest(whole, [p.figures for p in mine])
        if left.all_hours > 1e-9 or left.capacity_unknown:
            parts.append(Part(unit, None, left))
    return parts
