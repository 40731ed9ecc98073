"""Jinja2 rendering for the dashboard: the environment, `render`, the display filters and the static assets.

Templates live in `app/web/templates/`; the assets in the repository's `static/` folder, which `app/static`
points at in a checkout and which the wheel ships as `app/static/`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlencode

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined, select_autoescape
from jinja2_fragments import BlockNotFoundError, render_block
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from .. import __version__
from .chart_data import heat_rows, metric_lines, strip_rows
from .charts import (
    STATE_HELP,
    bars_svg,
    device_lines_svg,
    hour_of_week_svg,
    mig_layout_svg,
    stacked_states_svg,
    state_bar_svg,
    state_class,
    state_heatmap_svg,
    state_label,
    state_strip_svg,
    timeseries_svg,
)
from .csrf import csrf_field
from .privileges import SEE_ALSO

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

DASH = "\u2013"
"""What a filter shows for a missing value: an en dash."""

Number = float | Decimal
QueryValue = str | int | float | Sequence[str | int | float] | None


@dataclass(frozen=True)
class NavItem:
    key: str
    """The `page` value that marks this entry as the current page."""
    href: str
    label: str
    admin: bool = False
    """Shown to admins only (and, read only, with GPUFLEET_AUTH=off)."""


NAV = (
    NavItem("overview", "/", "Overview"),
    NavItem("idle", "/gpus/idle", "Idle GPUs"),
    NavItem("mig", "/mig", "MIG"),
    NavItem("waste", "/waste", "Waste"),
    NavItem("heatmap", "/heatmap", "Heatmaps"),
    NavItem("instances", "/instances", "Instances"),
    NavItem("billing", "/billing", "Billing"),
    NavItem("alerts", "/alerts", "Alerts", admin=True),
)

WINDOWS = (("1h", "1 h"), ("6h", "6 h"), ("24h", "24 h"), ("7d", "7 d"), ("30d", "30 d"))
LIFECYCLES = (("spot", "spot"), ("on-demand", "on-demand"), ("on-prem", "on-prem"))


# Filters. Each takes None and shows DASH for it unless its docstring says otherwise.


def usd(value: Number | None) -> str:
    """Dollars: `$2.74`, `$1,234.56`, `$12,346` (no cents from $10,000 on); None is "no price"."""
    if value is None:
        return "no price"
    v = float(value)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if 0 < v < 0.005:
        return f"{sign}<$0.01"
    return f"{sign}${v:,.0f}" if round(v, 2) >= 10_000 else f"{sign}${v:,.2f}"


def usd_rate(value: Number | None) -> str:
    """Dollars per hour: `$2.74/h`, `$0.526/h` (three decimals under a dollar, as price lists give them)."""
    if value is None:
        return DASH
    v = float(value)
    if abs(v) >= 1000:
        return f"${v:,.0f}/h"
    return f"${v:,.3f}/h" if abs(v) < 1 else f"${v:,.2f}/h"


def pct(value: Number | None, *, fraction: bool = False) -> str:
    """A percentage with one decimal, `42.0%`; `fraction=True` takes 0-1 instead of 0-100. None: "unknown"."""
    if value is None:
        return "unknown"
    v = float(value) * (100 if fraction else 1)
    return f"{v:,.1f}%"


def hours(value: Number | None) -> str:
    """A duration given in hours: `3.0 h`, from 48 h on in days, `2.5 d`."""
    if value is None:
        return DASH
    v = float(value)
    return f"{v / 24:,.1f} d" if abs(v) >= 48 else f"{v:,.1f} h"


def mib(value: Number | None) -> str:
    """Memory given in MiB: `512 MiB`, `80 GiB`, `4.8 GiB`."""
    if value is None:
        return DASH
    v = float(value)
    if abs(v) < 1024:
        return f"{v:,.0f} MiB"
    gib = v / 1024
    return f"{gib:,.0f} GiB" if round(gib, 1) == round(gib) else f"{gib:,.1f} GiB"


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """How long before `now` (default: the clock): `42 s ago`, `5 min ago`, `3 h ago` (under 48 h), `2 d ago`."""
    if value is None:
        return DASH
    seconds = ((_aware(now) if now is not None else datetime.now(UTC)) - _aware(value)).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        return "just now"
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 48 * 3600:
        text = f"{int(seconds // 3600)} h"
    else:
        text = f"{int(seconds // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def utc(value: datetime | None) -> str:
    """A moment in UTC to the minute: `2026-11-21 14:05 UTC`; naive datetimes are taken as UTC."""
    if value is None:
        return DASH
    return f"{_aware(value).astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def num(value: Number | None, decimals: int = 0) -> str:
    """A number with thousands separators: `12,345`; `decimals` after the point."""
    if value is None:
        return DASH
    v = float(value)
    if not math.isfinite(v):
        return DASH
    return f"{v:,.{decimals}f}"


def state_hours(rows: Iterable[Any]) -> dict[str, float]:
    """Rows with `state` and `gpu_hours` (a view's state table) as {state: GPU-hours}, for a state bar."""
    return {r.state: r.gpu_hours for r in rows}


FILTERS = {
    "state_hours": state_hours,
    "metric_lines": metric_lines,
    "strip_rows": strip_rows,
    "heat_rows": heat_rows,
    "usd": usd,
    "usd_rate": usd_rate,
    "pct": pct,
    "hours": hours,
    "mib": mib,
    "ago": ago,
    "utc": utc,
    "num": num,
    "state_class": state_class,
    "state_label": state_label,
}


# URLs.


def url_with(request: Request, **changes: QueryValue) -> str:
    """The current path and query with the named parameters replaced (a list repeats one) or, for None, removed.

    Other parameters keep their order and repetitions, so `tag=team:a&tag=env:prod` survives a new `sort`.
    """
    items: list[tuple[str, str]] = []
    done: set[str] = set()
    for key, value in request.query_params.multi_items():
        if key not in changes:
            items.append((key, value))
        elif key not in done:
            items += _pairs(key, changes[key])
            done.add(key)
    for key, change in changes.items():
        if key not in done:
            items += _pairs(key, change)
    query = urlencode(items, safe=":,")
    return f"{request.url.path}?{query}" if query else request.url.path


def _pairs(key: str, value: QueryValue) -> list[tuple[str, str]]:
    if value is None:
        return []
    if isinstance(value, str | int | float):
        return [(key, str(value))]
    return [(key, str(v)) for v in value]


def static_url(path: str) -> str:
    """The URL of an asset under `static/`, with a digest of its content so browsers may cache it for good."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"not a path inside static/: {path!r}")
    stat = (STATIC_DIR / rel).stat()
    return f"/static/{rel}?v={_digest(str(rel), stat.st_mtime_ns, stat.st_size)}"


@lru_cache(maxsize=256)
def _digest(rel: str, _mtime_ns: int, _size: int) -> str:
    # Keyed on mtime and size too, so an edited file gets a new URL without a restart.
    return hashlib.sha256((STATIC_DIR / rel).read_bytes()).hexdigest()[:12]


class AssetFiles(StaticFiles):
    """`static/`, cached for a year when asked for by a versioned URL (see `static_url`)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304) and "v" in QueryParams(scope.get("query_string", b"")):
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


# Form helpers.


def as_list(value: object) -> list[str]:
    """None, one value or several, as a list of strings (query parameters may repeat)."""
    if value is None:
        return []
    if isinstance(value, str | int | float):
        return [str(value)]
    if isinstance(value, Iterable):
        return [str(v) for v in value if v is not None]
    return [str(value)]


@dataclass(frozen=True)
class SelectOption:
    value: str
    label: str
    selected: bool


def select_options(items: Iterable[object], current: object) -> list[SelectOption]:
    """The options of a `<select>`: each item a value or a (value, label) pair. A current value missing from
    `items` is added, so a filter in the URL never silently disappears from the form."""
    chosen = as_list(current)
    options: list[SelectOption] = []
    for item in items:
        if isinstance(item, Sequence) and not isinstance(item, str):
            value, label = str(item[0]), str(item[1])
        else:
            value = label = str(item)
        options.append(SelectOption(value, label, value in chosen))
    known = {o.value for o in options}
    options += [SelectOption(v, v, True) for v in chosen if v not in known and v != ""]
    return options


# Who is looking.


def current_reader(request: Request) -> Any:
    """The `app.auth.Reader` that the page's access check found (`request.state.reader`), or None."""
    return getattr(request.state, "reader", None)


def nav_items(request: Request) -> list[NavItem]:
    """The navigation this reader sees: admin pages for admins, and for everyone with GPUFLEET_AUTH=off."""
    reader = current_reader(request)
    admin = reader is not None and (reader.admin or reader.via == "open")
    return [item for item in NAV if admin or not item.admin]


# Rendering.


def make_environment(*extra_dirs: Path) -> Environment:
    """The dashboard's environment; templates in `extra_dirs` (tests) come before the built-in ones."""
    loaders = [FileSystemLoader(d) for d in extra_dirs] + [FileSystemLoader(TEMPLATES_DIR)]
    env = Environment(
        loader=ChoiceLoader(loaders),
        autoescape=select_autoescape(("html", "htm", "xml", "svg"), default_for_string=True, default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    env.globals.update(
        url_with=url_with,
        static_url=static_url,
        nav=NAV,
        nav_items=nav_items,
        windows=WINDOWS,
        lifecycles=LIFECYCLES,
        state_label=state_label,
        state_class=state_class,
        state_help=STATE_HELP,
        state_bar_svg=state_bar_svg,
        mig_layout_svg=mig_layout_svg,
        timeseries_svg=timeseries_svg,
        stacked_states_svg=stacked_states_svg,
        bars_svg=bars_svg,
        state_heatmap_svg=state_heatmap_svg,
        hour_of_week_svg=hour_of_week_svg,
        device_lines_svg=device_lines_svg,
        state_strip_svg=state_strip_svg,
        version=__version__,
        as_list=as_list,
        select_options=select_options,
        csrf_field=csrf_field,
        current_reader=current_reader,
        privileges_see_also=SEE_ALSO,
    )
    return env


environment = make_environment()


def render(
    request: Request,
    template_name: str,
    context: Mapping[str, Any],
    *,
    block: str | None = None,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    env: Environment | None = None,
) -> HTMLResponse:
    """A page, or only its `block` (htmx partial updates), as an HTML response.

    The context also gets `request`; `static_url`, `url_with` and the filters are there in every template.
    """
    environment_ = env or environment
    values = {**context, "request": request}
    if block is None:
        html = environment_.get_template(template_name).render(values)
    else:
        try:
            html = render_block(environment_, template_name, block, values)
        except BlockNotFoundError:
            raise KeyError(f"template {template_name!r} has no block {block!r}") from None
    response = HTMLResponse(html, status_code=status_code, headers=headers)
    # Whole page or fragment depends on the HX-Request header: caches must keep them apart.
    response.headers.add_vary_header("HX-Request")
    return response


def is_htmx(request: Request) -> bool:
    """An htmx request that wants a fragment; a history restore wants the whole page."""
    return request.headers.get("HX-Request") == "true" and request.headers.get("HX-History-Restore-Request") != "true"
