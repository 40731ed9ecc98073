"""Query parameters, read in one place for the dashboard's pages and the report.

Every value that cannot be used raises `BadParameter` naming its parameter; pages answer it with 400 and an
error page (or the JSON error shape), the report with the JSON error shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.datastructures import QueryParams

from .analyse.grouping import GROUPS, is_group_name
from .analyse.window import (
    DEFAULT_PRESET,
    LIFECYCLES,
    MAX_WINDOW,
    PRESETS,
    Filters,
    Window,
    ceil_hour,
    floor_hour,
    preset_window,
)

MAX_GROUPINGS = 8
HEAT_ROWS = ("instance", "gpu")
"""What a heatmap row can be, besides `tag:<key>`."""


class BadParameter(ValueError):
    """A query parameter that cannot be used; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def _parse_time(param: str, value: str) -> datetime:
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace(" ", "+"))
    except ValueError:
        raise BadParameter(param, f"not an ISO 8601 time: {value!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    # Rounding out to whole hours must stay inside the years datetime can hold (1-9999).
    if not datetime(1, 1, 2, tzinfo=UTC) <= t <= datetime(9999, 12, 30, tzinfo=UTC):
        raise BadParameter(param, f"out of range: {value!r}")
    return t.astimezone(UTC)


def parse_window(
    window: str | None, start: str | None, end: str | None, *, now: datetime, default: str = DEFAULT_PRESET
) -> Window:
    """A preset (`window=24h`) or explicit `start`/`end` (ISO 8601; end defaults to now), rounded out to hours."""
    if start or end:
        if window:
            raise BadParameter("window", "give either window or start/end, not both")
        if not start:
            raise BadParameter("start", "required with end")
        t0 = _parse_time("start", start)
        t1 = _parse_time("end", end) if end else now
        if t1 <= t0:
            raise BadParameter("end", "must be after start")
        if t1 - t0 > MAX_WINDOW:
            raise BadParameter("end", f"window longer than {MAX_WINDOW.days} days")
        s, e = floor_hour(t0), ceil_hour(t1)
        return Window(start=s, end=e, now=now, label=f"{s:%Y-%m-%d %H:%M} to {e:%Y-%m-%d %H:%M} UTC")
    name = window or default
    if name not in PRESETS:
        raise BadParameter("window", f"unknown window {name!r}; one of {', '.join(PRESETS)}")
    return preset_window(name, now)


def _clean(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip() for v in values if v and v.strip()))


def parse_tag(value: str) -> tuple[str, str]:
    key, sep, val = value.partition(":")
    if not sep:
        key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise BadParameter("tag", f"expected key:value, got {value!r}")
    return key.strip(), val.strip()


def parse_filters(
    *,
    region: Sequence[str] = (),
    instance_type: Sequence[str] = (),
    lifecycle: Sequence[str] = (),
    tag: Sequence[str] = (),
) -> Filters:
    lifecycles = _clean(lifecycle)
    for value in lifecycles:
        if value not in LIFECYCLES:
            raise BadParameter("lifecycle", f"unknown lifecycle {value!r}; one of {', '.join(LIFECYCLES)}")
    return Filters(
        regions=_clean(region),
        instance_types=_clean(instance_type),
        lifecycles=lifecycles,
        tags=tuple(dict.fromkeys(parse_tag(t) for t in _clean(tag))),
    )


def filters_of(q: QueryParams) -> Filters:
    return parse_filters(
        region=q.getlist("region"),
        instance_type=q.getlist("instance_type"),
        lifecycle=q.getlist("lifecycle"),
        tag=q.getlist("tag"),
    )


def window_of(q: QueryParams, *, now: datetime, default: str = DEFAULT_PRESET) -> Window:
    return parse_window(q.get("window") or None, q.get("start") or None, q.get("end") or None, now=now, default=default)


def parse_group_by(values: Sequence[str]) -> list[str]:
    """Group-by names from repeated and/or comma-separated values (default: instance type)."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for name in names:
        if not is_group_name(name):
            raise BadParameter("group_by", f"unknown grouping {name!r}; one of {', '.join(GROUPS)} or tag:<key>")
    if len(set(names)) != len(names):
        raise BadParameter("group_by", "a grouping is named twice")
    if len(names) > MAX_GROUPINGS:
        raise BadParameter("group_by", f"at most {MAX_GROUPINGS} groupings at once, got {len(names)}")
    return names or ["instance_type"]


def parse_heat_rows(value: str | None) -> str:
    """What one heatmap row is: `instance` (default), `gpu` or `tag:<key>`."""
    rows = (value or "instance").strip()
    if rows in HEAT_ROWS or (rows.startswith("tag:") and len(rows) > 4):
        return rows
    raise BadParameter("rows", f"unknown rows {rows!r}; one of {', '.join(HEAT_ROWS)} or tag:<key>")


@dataclass(frozen=True)
class PageQuery:
    """What a dashboard page was asked for: window, filters, table order and page, and the page's own choices."""

    window: Window
    filters: Filters
    sort: str | None
    dir: str
    page: int
    group_by: str
    """The waste page's grouping."""
    rows: str
    """The heatmap's rows."""

    def scoped(self, instance_id: str) -> PageQuery:
        """The same query narrowed to one instance (the instance page)."""
        return PageQuery(
            self.window, Filters(instance_ids=(instance_id,)), self.sort, self.dir, self.page, self.group_by, self.rows
        )


def page_query(
    q: QueryParams,
    *,
    now: datetime,
    default_window: str = DEFAULT_PRESET,
    group_by: bool = False,
    rows: bool = False,
) -> PageQuery:
    """Every parameter a dashboard page reads; BadParameter for the first that cannot be used. `group_by` and
    `rows` are read only by the pages that take them (the waste page, the heatmap); elsewhere they are ignored."""
    window = window_of(q, now=now, default=default_window)
    filters = filters_of(q)
    direction = q.get("dir", "desc")
    if direction not in ("asc", "desc"):
        raise BadParameter("dir", "must be asc or desc")
    page = q.get("page", "1")
    if not page.isdigit() or int(page) < 1:
        raise BadParameter("page", "must be a whole number from 1")
    grouping = "instance_type"
    if group_by:
        names = parse_group_by([q.get("group_by") or grouping])
        if len(names) != 1:
            raise BadParameter("group_by", "the waste page groups by one thing at a time")
        grouping = names[0]
    heat_rows = parse_heat_rows(q.get("rows")) if rows else "instance"
    return PageQuery(window, filters, q.get("sort") or None, direction, int(page), grouping, heat_rows)
