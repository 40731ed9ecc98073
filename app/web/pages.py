"""The dashboard's pages: thin handlers. Each reads its query (app/params.py), builds its view model
(app/web/views/) on the request's database session and answers it as HTML, as an htmx fragment or as JSON
(app/web/respond.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from ..analyse.states import Thresholds
from ..deps import SessionDep
from ..errors import ApiError
from ..openapi_params import query_param
from ..params import BadParameter, page_query
from ..state import app_state
from .access import page_reader
from .errors import wants_json
from .respond import Chrome, bad_parameter, page_openapi, respond
from .views.billing import DEFAULT_WINDOW as BILLING_WINDOW
from .views.billing import BillingView, build_billing
from .views.heatmap import HeatmapView, build_heatmap
from .views.idle import IdleView, build_idle
from .views.inputs import PageInputs
from .views.instance import InstanceView, build_instance
from .views.instances import InstancesView, build_instances
from .views.mig import MigView, build_mig
from .views.overview import OverviewView, build_overview
from .views.waste import WasteView, build_waste
from .views.week import WeekView, build_week

# Every page needs a reader: a route added here is protected without saying so (tests/app/test_auth_matrix.py).
router = APIRouter(tags=["dashboard"], dependencies=[Depends(page_reader)])


def _serve(
    request: Request,
    session: SessionDep,
    *,
    page: str,
    template: str,
    build: Callable[[PageInputs], Any],
    default_window: str = "24h",
    group_by: bool = False,
    rows: bool = False,
) -> Response:
    state = app_state(request)
    now = datetime.now(UTC)
    try:
        q = page_query(request.query_params, now=now, default_window=default_window, group_by=group_by, rows=rows)
    except BadParameter as err:
        return bad_parameter(request, page, err)
    thresholds = Thresholds.from_settings(state.settings)
    inputs = PageInputs(session, q, now, thresholds, state.pricer, state.fleet_rows)
    view = build(inputs)
    options = inputs.loaded.options if inputs.loaded is not None else None
    chrome = Chrome(page, q, now, state.settings.refresh_s, thresholds, options)
    missing = getattr(view, "missing", False)
    if missing and wants_json(request):
        raise ApiError(404, "no such instance")
    return respond(request, template, view, chrome, status_code=404 if missing else 200)


GROUP_BY = query_param(
    "group_by",
    "What a row is: instance, instance_type (default), region, availability_zone, lifecycle, gpu, slice, "
    "gpu_model or tag:<key>.",
    "tag:team",
)
ROWS = query_param("rows", "What a heatmap row is: instance (default), gpu or tag:<key>.", "gpu")


@router.get("/", **page_openapi(OverviewView, summary="Fleet overview", table=False))
def overview(request: Request, session: SessionDep) -> Response:
    """Cards, GPU-hours by state over the window and the change against the previous window, waste by type and
    tag, top wasters."""
    return _serve(request, session, page="overview", template="overview.html", build=build_overview)


@router.get("/gpus/idle", **page_openapi(IdleView, summary="Idle GPUs"))
def idle_page(request: Request, session: SessionDep) -> Response:
    """Passthrough GPUs idle now for longer than the idle bound, with what they burned."""
    return _serve(request, session, page="idle", template="idle.html", build=build_idle)


@router.get(
    "/mig",
    **page_openapi(
        MigView,
        summary="MIG layouts and under-used slices",
        extra_params=[query_param("page", "Page of the MIG GPUs, from 1; 100 a page.", "1")],
        table=False,
    ),
)
def mig_page(request: Request, session: SessionDep) -> Response:
    """MIG GPUs with their slices, unpartitioned capacity and under-used slices."""
    return _serve(request, session, page="mig", template="mig.html", build=build_mig)


@router.get("/waste", **page_openapi(WasteView, summary="Waste, grouped", extra_params=[GROUP_BY]))
def waste_page(request: Request, session: SessionDep) -> Response:
    """Cost and waste per group over the window."""
    return _serve(request, session, page="waste", template="waste.html", build=build_waste, group_by=True)


PAGE = query_param("page", "Page of the rows, from 1; 50 rows a page, the most wasteful first.", "1")


@router.get(
    "/heatmap",
    **page_openapi(
        HeatmapView,
        summary="States over time, per row",
        extra_params=[ROWS, PAGE],
        table=False,
        default_window="7 days",
    ),
)
def heatmap_page(request: Request, session: SessionDep) -> Response:
    """One row per instance, GPU or tag value, one column per hour (up to 7 days) or day, coloured by state."""
    return _serve(
        request, session, page="heatmap", template="heatmap.html", build=build_heatmap, default_window="7d", rows=True
    )


@router.get(
    "/heatmap/week",
    **page_openapi(WeekView, summary="Wasted dollars by hour of week", table=False, default_window="30 days"),
)
def week_page(request: Request, session: SessionDep) -> Response:
    """Wasted USD per weekday and hour of day (UTC) over the window: when the waste happens."""
    return _serve(request, session, page="heatmap", template="week.html", build=build_week, default_window="30d")


@router.get("/instances", **page_openapi(InstancesView, summary="Instances"))
def instances_page(request: Request, session: SessionDep) -> Response:
    """Every instance with its agent, price, utilization, cost and waste over the window."""
    return _serve(request, session, page="instances", template="instances.html", build=build_instances)


@router.get(
    "/instances/{instance_id}", **page_openapi(InstanceView, summary="One instance", filters=False, table=False)
)
def instance_page(request: Request, session: SessionDep, instance_id: str) -> Response:
    """One instance: identity, figures, every GPU and slice now, and charts of all of them over the window."""
    return _serve(
        request, session, page="instances", template="instance.html", build=lambda p: build_instance(p, instance_id)
    )


@router.get(
    "/billing",
    **page_openapi(
        BillingView, summary="The bill against the agents", filters=False, table=False, default_window="30 days"
    ),
)
def billing_page(request: Request, session: SessionDep) -> Response:
    """GPU instances the AWS bill charges for that no agent reports, monitored instances whose billed and reported
    instance-hours disagree, the imported exports and the spot price history read."""
    settings = app_state(request).settings
    return _serve(
        request,
        session,
        page="billing",
        template="billing.html",
        build=lambda p: build_billing(p, settings),
        default_window=BILLING_WINDOW,
    )
