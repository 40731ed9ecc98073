"""The dashboard's pages. Each handler parses the query string, runs the analysis and renders a template; an
htmx request gets only the page's `live` block, built from the same figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy.orm import Session

from ..analyse.fleet import GONE, OFFLINE, ONLINE, Fleet, GpuInfo, free_slices, load_fleet
from ..analyse.idle import idle_gpus
from ..analyse.mig import MigGpuView, mig_gpus, underused_slices, unpartitioned
from ..analyse.now import current_state, gpu_equivalents_now, latest_samples
from ..analyse.series import Point, device_series, series_step
from ..analyse.states import OFFLINE as STATE_OFFLINE
from ..analyse.states import UNKNOWN, UNPARTITIONED, Thresholds
from ..analyse.waste import GPU, GROUPS, SLICE, analyse_waste, is_group_name
from ..analyse.window import PRESETS, Filters, Window, WindowError, parse_filters, parse_window
from ..sources import SOURCE_NAMES
from ..state import AppState, app_state
from .access import page_reader
from .charts import MigSlot, Series, mig_layout_svg, state_bar_svg, timeseries_svg
from .delivery import delivery
from .privileges import SEE_ALSO, grant_notes
from .templating import is_htmx, render

# Every page needs a reader: a route added here is protected without saying so (tests/app/test_auth_matrix.py).
router = APIRouter(include_in_schema=False, dependencies=[Depends(page_reader)])

TOP = 10
TOP_MIG = 50


@dataclass(frozen=True)
class Query:
    window: Window
    filters: Filters
    sort: str | None
    dir: str
    page: int = 1


def _query(request: Request, now: datetime) -> Query:
    q = request.query_params
    window = parse_window(q.get("window") or None, q.get("start") or None, q.get("end") or None, now=now)
    filters = parse_filters(
        region=q.getlist("region"),
        instance_type=q.getlist("instance_type"),
        lifecycle=q.getlist("lifecycle"),
        tag=q.getlist("tag"),
    )
    direction = q.get("dir", "desc")
    if direction not in ("asc", "desc"):
        raise WindowError("dir", "must be asc or desc")
    page = q.get("page", "1")
    if not page.isdigit() or int(page) < 1:
        raise WindowError("page", "must be a whole number from 1")
    return Query(window, filters, q.get("sort") or None, direction, int(page))


def sort_rows(
    rows: Sequence[Any], columns: dict[str, Callable[[Any], Any]], sort: str | None, direction: str, default: str
) -> tuple[list[Any], str]:
    """Rows ordered by one column; rows whose value is None go last either way. Unknown columns: default."""
    key = sort if sort in columns else default
    get = columns[key]
    present = [r for r in rows if get(r) is not None]
    absent = [r for r in rows if get(r) is None]
    present.sort(key=get, reverse=direction == "desc")
    return present + absent, key


PER_PAGE = 100


@dataclass(frozen=True)
class Pager:
    """One page of a long table: rows [first, last) of total."""

    page: int
    pages: int
    total: int
    first: int
    last: int


def paginate(rows: Sequence[Any], page: int, per_page: int = PER_PAGE) -> tuple[list[Any], Pager]:
    """The rows of one page (from 1; past the end: the last page)."""
    pages = max(1, -(-len(rows) // per_page))
    page = min(max(page, 1), pages)
    first = (page - 1) * per_page
    last = min(first + per_page, len(rows))
    return list(rows[first:last]), Pager(page, pages, len(rows), first, last)


def _thresholds(state: AppState) -> Thresholds:
    return Thresholds.from_settings(state.settings)


def _fleet(session: Session, state: AppState, q: Query, now: datetime) -> Fleet:
    return load_fleet(
        session,
        filters=q.filters,
        pricer=state.pricer,
        thresholds=_thresholds(state),
        now=now,
        since=q.window.start,
        cache=state.fleet_rows,
    )


def _page(
    request: Request,
    template: str,
    page: str,
    build: Callable[[Session, AppState, Query, datetime], dict[str, Any]],
) -> HTMLResponse:
    state = app_state(request)
    now = datetime.now(UTC)
    try:
        q = _query(request, now)
    except WindowError as err:
        return render(
            request,
            "error.html",
            {"page": page, "title": "Bad request", "message": str(err), "param": err.param},
            status_code=400,
        )
    with state.sessions() as session:
        context = build(session, state, q, now)
    fleet = context.get("fleet")
    context.update(
        filter_options=_filter_options(fleet),
        filter_current=_filter_current(q),
        page=page,
        now=now,
        window=q.window,
        filters=q.filters,
        sort=context.get("sort", q.sort),
        dir=q.dir,
        presets=list(PRESETS),
        refresh_s=state.settings.refresh_s,
        thresholds=_thresholds(state),
    )
    status = 404 if "missing" in context else 200
    return render(request, template, context, block="live" if is_htmx(request) else None, status_code=status)


def _filter_options(fleet: Fleet | None) -> dict[str, list[str]]:
    if fleet is None:
        return {}
    return {"region": fleet.options.regions, "instance_type": fleet.options.instance_types}


def _filter_current(q: Query) -> dict[str, Any]:
    return {
        "window": q.window.label if q.window.label in PRESETS else None,
        "region": list(q.filters.regions),
        "instance_type": list(q.filters.instance_types),
        "lifecycle": list(q.filters.lifecycles),
        "tag": [f"{k}:{v}" for k, v in q.filters.tags],
    }


def _no_agents(fleet: Fleet) -> bool:
    return fleet.total_instances == 0


def _overview(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
    t = _thresholds(state)
    fleet = _fleet(session, state, q, now)
    analysis = analyse_waste(session, fleet, q.window, t)
    latest = latest_samples(session, now=now, thresholds=t)
    states = current_state(fleet, latest)
    idle = idle_gpus(session, fleet, latest, now=now, thresholds=t)
    totals = analysis.totals
    units = [u for u in analysis.units if u.figures().waste > 0]
    units.sort(key=lambda u: -u.figures().waste)
    status = {s: sum(1 for i in fleet.instances.values() if i.status == s) for s in (ONLINE, OFFLINE, GONE)}
    tag_key = overview_tag_key(fleet)
    return {
        "fleet": fleet,
        "analysis": analysis,
        "totals": totals,
        "no_agents": _no_agents(fleet),
        "status": status,
        "mig_gpus": sum(1 for g in fleet.gpus.values() if g.mig_mode),
        "live_slices": sum(1 for s in fleet.slices.values() if s.retired_at is None),
        "now_equivalents": gpu_equivalents_now(fleet, states),
        "idle": idle,
        "idle_burn_per_day": sum(g.usd_per_day or 0.0 for g in idle),
        "state_bar": state_bar_svg(totals.state_hours, width=960, height=20),
        "by_type": analysis.group("instance_type")[:TOP],
        "tag_key": tag_key,
        "by_tag": analysis.group(f"tag:{tag_key}")[:TOP] if tag_key else [],
        "top_units": units[:TOP],
    }


def overview_tag_key(fleet: Fleet) -> str | None:
    """The tag the overview groups by: `team` when any instance has it, else the most common key."""
    keys = [t.split(":", 1)[0] for t in fleet.options.tags]
    if "team" in keys:
        return "team"
    return keys[0] if keys else None


@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    return _page(request, "overview.html", "overview", _overview)


_IDLE_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "instance": lambda g: g.gpu.instance.name,
    "type": lambda g: g.gpu.instance.instance_type,
    "since": lambda g: g.since,
    "hours": lambda g: g.idle_hours,
    "burned": lambda g: g.burned_usd,
    "per_day": lambda g: g.usd_per_day,
    "mem": lambda g: g.latest.mem_used_mib if g.latest else None,
}


def _idle(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
    t = _thresholds(state)
    fleet = _fleet(session, state, q, now)
    latest = latest_samples(session, now=now, thresholds=t)
    idle = idle_gpus(session, fleet, latest, now=now, thresholds=t)
    rows, sort = sort_rows(idle, _IDLE_COLUMNS, q.sort, q.dir, "burned")
    rows, pager = paginate(rows, q.page)
    return {
        "fleet": fleet,
        "no_agents": _no_agents(fleet),
        "rows": rows,
        "pager": pager,
        "sort": sort,
        "burned": sum(g.burned_usd or 0.0 for g in idle),
        "per_day": sum(g.usd_per_day or 0.0 for g in idle),
        "unpriced": sum(1 for g in idle if g.usd_per_hour is None),
    }


@router.get("/gpus/idle", response_class=HTMLResponse)
def idle_page(request: Request) -> HTMLResponse:
    return _page(request, "idle.html", "idle", _idle)


def _mig(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
    t = _thresholds(state)
    fleet = _fleet(session, state, q, now)
    analysis = analyse_waste(session, fleet, q.window, t)
    latest = latest_samples(session, now=now, thresholds=t)
    views = mig_gpus(analysis, current_state(fleet, latest))
    free = unpartitioned(views)
    underused = underused_slices(views)
    shown, pager = paginate(views, q.page)
    return {
        "layouts": [mig_layout_svg(_slots(v), width=280, height=40, title=_layout_title(v)) for v in shown],
        "fleet": fleet,
        "no_agents": _no_agents(fleet),
        "views": shown,
        "pager": pager,
        "underused": underused[:TOP_MIG],
        "underused_total": len(underused),
        "free": free[:TOP_MIG],
        "free_total": len(free),
        "free_unknown_total": sum(1 for v in views if v.free_unknown and not v.offline),
        "free_per_hour": sum(v.free_usd_per_hour or 0.0 for v in free),
        "analysis": analysis,
    }


def _layout_title(view: MigGpuView) -> str:
    return "MIG layout, free capacity unknown" if view.free_unknown else "MIG layout"


def _slots(view: MigGpuView) -> list[MigSlot]:
    """Slices side by side in GPU-instance order, then the free capacity: NVML placement is not reported, so
    the columns show shares of the GPU, not physical slice positions. A slice of unknown size is one hatched
    column marked "?"; a GPU whose free capacity is unknown gets no free block."""
    slots = []
    column = 0
    for slot in view.slots:
        sl = slot.slice
        size = min(sl.compute_slices or 1, 7 - column)
        if size <= 0:
            break
        unit = slot.unit
        util = unit.avg_util if unit is not None else None
        name = f"{sl.profile_label} (GI {sl.gpu_instance_id})"
        if sl.compute_slices is None:
            name += ", size unknown"
        detail = f"{name}: {slot.state} now"
        detail += f", {util:.1f}% average" if util is not None else ", utilization unknown"
        if slot.reason:
            detail += f"; under-used: {slot.reason}"
        if sl.compute_slices is None:
            slots.append(MigSlot(column, size, "?", UNKNOWN, detail))
        else:
            slots.append(MigSlot(column, size, sl.profile, slot.state, detail))
        column += size
    if view.free_slices is None:
        return slots
    free = min(view.free_slices, 7 - column)
    if free > 0:
        state = STATE_OFFLINE if view.offline else UNPARTITIONED
        slots.append(MigSlot(column, free, f"{free} free", state, f"{free} of 7 compute slices in no slice"))
    return slots


@router.get("/mig", response_class=HTMLResponse)
def mig_page(request: Request) -> HTMLResponse:
    return _page(request, "mig.html", "mig", _mig)


_GROUP_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "label": lambda r: r.label.lower(),
    "gpu_hours": lambda r: r.figures.gpu_hours,
    "util": lambda r: r.figures.avg_util,
    "unknown": lambda r: r.figures.unknown_share,
    "cost": lambda r: r.figures.cost,
    "idle_cost": lambda r: r.figures.idle_cost,
    "held_cost": lambda r: r.figures.idle_held_cost,
    "unused_cost": lambda r: r.figures.unused_cost,
    "waste": lambda r: r.figures.waste,
    "offline": lambda r: r.figures.offline_h,
}
GROUP_LABELS = {
    "instance": "Instance",
    "instance_type": "Instance type",
    "region": "Region",
    "availability_zone": "Availability zone",
    "lifecycle": "Lifecycle",
    "gpu_model": "GPU model",
    "gpu": "GPU",
    "slice": "GPU / slice",
}


def _group_by(fleet: Fleet) -> dict[str, str]:
    options = dict(GROUP_LABELS)
    for key in sorted({t.split(":", 1)[0] for t in fleet.options.tags}):
        options[f"tag:{key}"] = f"Tag {key}"
    return options


@router.get("/waste", response_class=HTMLResponse)
def waste_page(request: Request) -> HTMLResponse:
    group_by = request.query_params.get("group_by") or "instance_type"

    def build(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
        t = _thresholds(state)
        fleet = _fleet(session, state, q, now)
        analysis = analyse_waste(session, fleet, q.window, t)
        rows, sort = sort_rows(analysis.group(group_by), _GROUP_COLUMNS, q.sort, q.dir, "waste")
        rows, pager = paginate(rows, q.page)
        return {
            "fleet": fleet,
            "no_agents": _no_agents(fleet),
            "analysis": analysis,
            "totals": analysis.totals,
            "rows": rows,
            "pager": pager,
            "sort": sort,
            "group_by": group_by,
            "group_by_options": _group_by(fleet),
            "monthly": analysis.monthly,
        }

    if not is_group_name(group_by):
        return render(
            request,
            "error.html",
            {
                "page": "waste",
                "title": "Bad request",
                "message": f"group_by: unknown grouping {group_by!r}; one of {', '.join(GROUPS)} or tag:<key>",
                "param": "group_by",
            },
            status_code=400,
        )
    return _page(request, "waste.html", "waste", build)


_INSTANCE_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "name": lambda r: (r["instance"].name.lower(), r["instance"].instance_id),
    "type": lambda r: r["instance"].instance_type,
    "region": lambda r: r["instance"].region,
    "gpus": lambda r: r["gpus"],
    "last_seen": lambda r: r["instance"].last_seen,
    "price": lambda r: r["instance"].price.usd_per_instance_hour,
    "cost": lambda r: r["figures"].cost if r["figures"] else None,
    "waste": lambda r: r["figures"].waste if r["figures"] else None,
    "util": lambda r: r["figures"].avg_util if r["figures"] else None,
}


def _instances(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
    t = _thresholds(state)
    fleet = _fleet(session, state, q, now)
    analysis = analyse_waste(session, fleet, q.window, t)
    by_instance = {r.key: r for r in analysis.group("instance")}
    gpu_counts: dict[int, int] = {}
    mig_counts: dict[int, int] = {}
    refused: set[int] = set()
    for g in fleet.gpus.values():
        gpu_counts[g.instance.pk] = gpu_counts.get(g.instance.pk, 0) + 1
        if g.mig_mode:
            mig_counts[g.instance.pk] = mig_counts.get(g.instance.pk, 0) + 1
        if g.permission_denied:
            refused.add(g.instance.pk)
    rows = []
    for inst in fleet.instances.values():
        group = by_instance.get(inst.instance_id)
        rows.append(
            {
                "instance": inst,
                "gpus": gpu_counts.get(inst.pk, 0),
                "mig": mig_counts.get(inst.pk, 0),
                "refused": inst.pk in refused,
                "figures": group.figures if group else None,
            }
        )
    rows, sort = sort_rows(rows, _INSTANCE_COLUMNS, q.sort, q.dir, "waste")
    rows, pager = paginate(rows, q.page)
    return {
        "fleet": fleet,
        "no_agents": _no_agents(fleet),
        "rows": rows,
        "pager": pager,
        "sort": sort,
        "analysis": analysis,
    }


@router.get("/instances", response_class=HTMLResponse)
def instances_page(request: Request) -> HTMLResponse:
    return _page(request, "instances.html", "instances", _instances)


_METRICS = (("util", "Utilization, %"), ("mem_used_mib", "Memory, MiB"), ("power_w", "Power, W"))


def _gpu_charts(
    gpu: GpuInfo,
    devices: list[tuple[str, int, str]],
    series: dict[int, list[Point]],
    window: Window,
    now: datetime,
    step: int,
) -> dict[str, Markup]:
    """One chart per metric for a GPU: a line for the GPU and one per slice (power is the GPU's only)."""
    limits = {"util": 100.0, "mem_used_mib": float(gpu.memory_total_mib or 0) or None, "power_w": None}
    charts = {}
    for metric, label in _METRICS:
        lines = [
            Series(name, [(p.ts, getattr(p, metric)) for p in series.get(pk, [])], css)
            for name, pk, css in devices
            if metric != "power_w" or pk == gpu.pk
        ]
        charts[metric] = timeseries_svg(
            lines,
            start=window.start,
            end=min(window.end, now),
            step_s=step,
            y_label=label,
            y_max=limits[metric],
            title=f"{gpu.label}: {label}",
        )
    return charts


def _instance_detail(instance_id: str) -> Callable[[Session, AppState, Query, datetime], dict[str, Any]]:
    def build(session: Session, state: AppState, q: Query, now: datetime) -> dict[str, Any]:
        t = _thresholds(state)
        scoped = Query(q.window, Filters(instance_ids=(instance_id,)), q.sort, q.dir, q.page)
        fleet = _fleet(session, state, scoped, now)
        if not fleet.instances:
            return {"missing": instance_id, "fleet": fleet}
        inst = next(iter(fleet.instances.values()))
        analysis = analyse_waste(session, fleet, q.window, t)
        ids = fleet.device_ids()
        latest = latest_samples(session, now=now, thresholds=t, device_ids=ids)
        states = current_state(fleet, latest)
        step = series_step(q.window, inst.interval_s)
        series = device_series(session, ids, q.window, step_s=step)
        units = {u.key: u for u in analysis.units}
        gpus = []
        for gpu in sorted(fleet.gpus.values(), key=lambda g: g.gpu_index):
            slices = fleet.live_slices(gpu.pk)
            devices = [(f"GPU {gpu.gpu_index}", gpu.pk, "series-1")] + [
                (f"{s.profile_label} GI {s.gpu_instance_id}", s.pk, f"series-{i % 7 + 2}") for i, s in enumerate(slices)
            ]
            charts = _gpu_charts(gpu, devices, series, q.window, now, step)
            gpus.append(
                {
                    "gpu": gpu,
                    "state": states.get(gpu.pk),
                    "latest": latest.get(gpu.pk),
                    "unit": units.get(f"{GPU}:{gpu.pk}"),
                    "free_slices": free_slices(gpu, slices),
                    "grants": grant_notes(gpu.permission_denied),
                    "slices": [
                        {
                            "slice": s,
                            "state": states.get(s.pk),
                            "latest": latest.get(s.pk),
                            "unit": units.get(f"{SLICE}:{s.pk}"),
                        }
                        for s in slices
                    ],
                    "charts": charts,
                }
            )
        group = analysis.group("instance")
        return {
            "fleet": fleet,
            "instance": inst,
            "analysis": analysis,
            "figures": group[0].figures if group else None,
            "gpus": gpus,
            "step_s": step,
            "source_names": SOURCE_NAMES,
            "privileges_see_also": SEE_ALSO,
            "delivery": delivery(session, inst.pk, inst.instance_id, since=q.window.start, until=q.window.end),
        }

    return build


@router.get("/instances/{instance_id}", response_class=HTMLResponse)
def instance_page(request: Request, instance_id: str) -> HTMLResponse:
    return _page(request, "instance.html", "instances", _instance_detail(instance_id))
