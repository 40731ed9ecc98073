"""Pieces every page's view model shares: the window and filters it covers, a table page, figures, an instance.

View models are plain dataclasses of strings, numbers, times and lists: the HTML page, its htmx fragment and its
JSON (`Accept: application/json`) are all made from one, so the three always show the same figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ...analyse.figures import Figures
from ...analyse.fleet import InstanceInfo
from ...analyse.price_now import PriceNow, own_price
from ...analyse.states import Thresholds
from ...analyse.window import Filters, Window

T = TypeVar("T")
PER_PAGE = 100


@dataclass(frozen=True)
class WindowView:
    label: str
    """A preset (`24h`, `7d`, ...) or the explicit range."""
    start: datetime
    end: datetime
    now: datetime
    """When the figures were made."""
    live: bool
    """The window reaches the present, so the figures change as data arrives."""
    hours: float
    """Length of the window up to now, hours."""

    @classmethod
    def of(cls, w: Window) -> WindowView:
        return cls(w.label, w.start, w.end, w.now, w.is_live, w.hours)


@dataclass(frozen=True)
class FilterView:
    regions: list[str]
    instance_types: list[str]
    lifecycles: list[str]
    tags: list[str]
    """`key:value` pairs; an instance must have every one."""

    @classmethod
    def of(cls, f: Filters) -> FilterView:
        return cls(list(f.regions), list(f.instance_types), list(f.lifecycles), [f"{k}:{v}" for k, v in f.tags])


@dataclass(frozen=True)
class ThresholdView:
    idle_util_pct: int
    """Utilization under this is idle, %."""
    mem_held_mib: int
    """Memory at or above this holds a GPU, MiB."""
    idle_min_hours: float
    """A GPU enters the idle list after this long idle, h."""
    underused_util_pct: float
    """A MIG slice averaging under this is under-used, %."""

    @classmethod
    def of(cls, t: Thresholds) -> ThresholdView:
        return cls(t.idle_util_pct, t.mem_held_mib, t.idle_min_hours, t.underused_util_pct)


@dataclass(frozen=True)
class PagerView:
    """One page of a long table: rows [first, last) of total."""

    page: int
    pages: int
    total: int
    first: int
    last: int


def paginate(rows: Sequence[T], page: int, per_page: int = PER_PAGE) -> tuple[list[T], PagerView]:
    """The rows of one page (from 1; past the end: the last page)."""
    pages = max(1, -(-len(rows) // per_page))
    page = min(max(page, 1), pages)
    first = (page - 1) * per_page
    last = min(first + per_page, len(rows))
    return list(rows[first:last]), PagerView(page, pages, len(rows), first, last)


def sort_rows(
    rows: Sequence[T], columns: dict[str, Callable[[T], Any]], sort: str | None, direction: str, default: str
) -> tuple[list[T], str]:
    """Rows ordered by one column; rows whose value is None go last either way. Unknown columns: default."""
    key = sort if sort in columns else default
    get = columns[key]
    present = [r for r in rows if get(r) is not None]
    absent = [r for r in rows if get(r) is None]
    present.sort(key=get, reverse=direction == "desc")
    return present + absent, key


@dataclass(frozen=True)
class Sorting:
    sort: str
    """The column the table is ordered by."""
    dir: str
    """asc or desc."""


@dataclass(frozen=True)
class FiguresView:
    """Figures of a unit or a group over the window. Hours are GPU-equivalent hours; money is USD over priced
    units of known size only (`unpriced_gpu_hours` are left out, never counted as $0)."""

    gpu_hours: float
    active_h: float
    idle_held_h: float
    idle_h: float
    """Includes unpartitioned MIG capacity."""
    unpartitioned_h: float
    unknown_h: float
    offline_h: float
    avg_util_pct: float | None
    """Mean utilization over the hours with a figure, %."""
    unknown_share: float | None
    """Share of GPU-hours with no utilization figure, 0-1."""
    cost: float
    idle_cost: float
    idle_held_cost: float
    unused_cost: float
    waste: float
    """idle_cost + idle_held_cost, USD."""
    unpriced_gpu_hours: float
    unsized_slice_h: float
    free_unknown_h: float
    capacity_unknown: bool
    """Some MIG capacity is of unknown size (left out of GPU-hours and money)."""

    @classmethod
    def of(cls, f: Figures) -> FiguresView:
        return cls(
            f.gpu_hours,
            f.active_h,
            f.idle_held_h,
            f.idle_h,
            f.unpartitioned_h,
            f.unknown_h,
            f.offline_h,
            f.avg_util,
            f.unknown_share,
            f.cost,
            f.idle_cost,
            f.idle_held_cost,
            f.unused_cost,
            f.waste,
            f.unpriced_gpu_hours,
            f.unsized_slice_h,
            f.free_unknown_h,
            f.capacity_unknown,
        )


@dataclass(frozen=True)
class InstanceRef:
    """An instance as tables show it."""

    instance_id: str
    name: str
    instance_type: str | None
    region: str | None
    availability_zone: str | None
    lifecycle: str | None
    status: str
    """online, offline or gone."""
    last_seen: datetime
    tags: dict[str, str]
    usd_per_instance_hour: float | None
    """Its price, USD/h for the whole instance: the price now where the page gives it
    (app/analyse/price_now.py), else its own price (agent, price file, catalog)."""
    usd_per_gpu_hour: float | None
    """The same price, USD per GPU-hour; None without one."""
    price_source: str
    """Where that price came from, in words ("billed", "spot history", "catalog on-demand", ...), or why there
    is none."""
    price_kind: str | None = None
    """Its kind: billed, spot history, agent, price file or catalog; None without a price."""

    @classmethod
    def of(cls, i: InstanceInfo, price: PriceNow | None = None) -> InstanceRef:
        """The instance, with `price` (its price now) as its price, else its own price."""
        p = own_price(i) if price is None else price
        return cls(
            i.instance_id,
            i.name,
            i.instance_type,
            i.region,
            i.availability_zone,
            i.lifecycle,
            i.status,
            i.last_seen,
            i.tags,
            p.usd_per_instance_hour,
            p.usd_per_gpu_hour,
            p.detail,
            p.source,
        )

    @property
    def priced(self) -> bool:
        return self.usd_per_gpu_hour is not None


@dataclass(frozen=True)
class GroupView:
    """A row of a grouped table: its key (what a filter takes), label and figures."""

    key: str
    label: str
    figures: FiguresView


@dataclass(frozen=True)
class Choice:
    """An option of a select: what goes in the query string, and what the reader sees."""

    value: str
    label: str
