"""GET /api/v1/report: the utilization report as JSON or CSV, for a token with the `read` scope.

The query string is read by app/params.py, so that every bad value answers 400 with a message naming its
parameter; the parameters are described to OpenAPI by app/openapi_params.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session
from starlette.responses import Response

from ..analyse.states import Thresholds
from ..auth import Reader, require_read, requires
from ..deps import SessionDep, SettingsDep
from ..errors import ApiError, FieldProblem
from ..ingest.schemas import ErrorOut
from ..openapi_params import FILTER_PARAMS, query_param, window_params
from ..params import BadParameter, filters_of, parse_group_by, window_of
from ..state import AppState, app_state
from ..web.respond import view_json
from ..web.views.billing import DEFAULT_WINDOW as BILLING_WINDOW
from ..web.views.billing import BillingView, billing_view, csv_text
from .schemas import ReportOut
from .service import DEFAULT_WINDOW, FIGURE_COLUMNS, Report, build_report, check_retention

router = APIRouter(tags=["report"])

FORMATS = ("json", "csv")


def _quality(params: list[str]) -> float:
    for p in params:
        name, _, value = p.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 1.0
    return 1.0


def wants_csv(accept: str) -> bool:
    """True when an Accept header prefers `text/csv` to `application/json` (JSON wins a tie)."""
    q = {"text/csv": 0.0, "application/json": 0.0}
    for media_range in accept.split(","):
        kind, *params = media_range.split(";")
        kind = kind.strip().lower()
        if kind in q:
            q[kind] = max(q[kind], _quality(params))
    return q["text/csv"] > q["application/json"]


def _format(request: Request) -> str:
    asked = request.query_params.get("format")
    if asked is not None:
        if asked not in FORMATS:
            raise BadParameter("format", f"unknown format {asked!r}; json or csv")
        return asked
    return "csv" if wants_csv(request.headers.get("accept", "")) else "json"


def report_reader(request: Request, session: SessionDep, settings: SettingsDep) -> Reader:
    return require_read(session, request, settings, now=datetime.now(UTC))


def _build(session: Session, state: AppState, request: Request) -> tuple[Report, str]:
    now = datetime.now(UTC)
    q = request.query_params
    try:
        fmt = _format(request)
        window = window_of(q, now=now, default=DEFAULT_WINDOW)
        check_retention(
            window,
            rollup_retention_days=state.settings.rollup_retention_days,
            param="window" if q.get("window") else "start",
        )
        filters = filters_of(q)
        group_by = parse_group_by(q.getlist("group_by"))
    except BadParameter as err:
        raise ApiError(400, "bad report parameter", [FieldProblem(err.param, err.message)]) from None
    report = build_report(
        session,
        window=window,
        filters=filters,
        group_by=group_by,
        pricer=state.pricer,
        thresholds=Thresholds.from_settings(state.settings),
        now=now,
        cache=state.fleet_rows,
    )
    return report, fmt


PARAMETERS = [
    *window_params("7 days", retention_note=True),
    query_param(
        "group_by",
        "One or more of instance, instance_type, region, availability_zone, lifecycle, gpu, slice, gpu_model, "
        "tag:<key>, and by the process holding the GPU: user, process (executable name), container, namespace, "
        "pod, job (Slurm); repeat the parameter or separate names with commas. Several give one row per "
        "combination. By holder, time no process held groups as (none). Default: instance_type.",
        ["instance_type", "tag:team"],
        repeat=True,
    ),
    *FILTER_PARAMS,
    query_param(
        "format",
        "json or csv. Without it, an Accept header that prefers text/csv to application/json chooses CSV.",
        "csv",
    ),
]

_EXAMPLE_FIGURES: dict[str, Any] = {
    "gpu_hours": 1344.0,
    "avg_util_pct": 31.25,
    "util_unknown_share": 0.0,
    "active_h": 520.0,
    "idle_held_h": 96.0,
    "idle_h": 728.0,
    "unknown_h": 0.0,
    "offline_h": 0.0,
    "cost": 3688.883856,
    "idle_cost": 1998.145422,
    "idle_held_cost": 263.491704,
    "unused_cost": 2536.107651,
    "unpriced_gpu_hours": 0.0,
    "unsized_slice_hours": 0.0,
    "free_unknown_hours": 0.0,
    "currency": "USD",
    "price_source": "billed; catalog on-demand",
    "price_source_shares": "billed 75%; catalog 25%",
    "price_sources": {"billed": 0.75, "catalog": 0.25},
}
# One group, so the totals are that group's figures.
_JSON_EXAMPLE = {
    "start": "2026-11-01T00:00:00+00:00",
    "end": "2026-11-08T00:00:00+00:00",
    "group_by": ["instance_type"],
    "billed_until": "2026-11-07T00:00:00+00:00",
    "rows": [{"group": {"instance_type": "p4d.24xlarge"}, **_EXAMPLE_FIGURES}],
    "totals": _EXAMPLE_FIGURES,
}


def _csv_example() -> str:
    header = ",".join(["start", "end", "instance_type", *FIGURE_COLUMNS])
    t = "2026-11-01T00:00:00+00:00,2026-11-08T00:00:00+00:00"
    figures = (
        "1344,31.25,0,520,96,728,0,0,3688.883856,1998.145422,263.491704,2536.107651,USD,"
        "billed; catalog on-demand,billed 75%; catalog 25%"
    )
    return f"{header}\n{t},p4d.24xlarge,{figures}\n{t},TOTAL,{figures}\n"


def _error(description: str, example: dict[str, Any]) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description, "content": {"application/json": {"example": example}}}


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": ReportOut,
        "description": "One row per group, then the totals. CSV: a header row, one row per group and a last "
        "row whose first group column is TOTAL; ISO times, plain numbers, UTF-8, streamed.",
        "content": {
            "application/json": {"example": _JSON_EXAMPLE},
            "text/csv": {"schema": {"type": "string"}, "example": _csv_example()},
        },
    },
    400: _error(
        "A parameter that cannot be used; `detail` names it.",
        {"error": "bad report parameter", "detail": [{"field": "end", "message": "must be after start"}]},
    ),
    401: _error(
        "No credentials, an unknown or revoked token, or a dashboard login that has ended.",
        {"error": "unknown token", "detail": []},
    ),
    403: _error(
        "A token whose scope does not allow reading (with GPUFLEET_AUTH=off: a client not on the server's host).",
        {"error": "token scope 'ingest' does not allow 'read'", "detail": []},
    ),
}


@router.get(
    "/api/v1/report",
    summary="Utilization, idle time and cost, grouped",
    response_model=None,
    responses=RESPONSES,
    openapi_extra={**requires("read"), "parameters": PARAMETERS},
)
def report(request: Request, session: SessionDep, _reader: Annotated[Reader, Depends(report_reader)]) -> Response:
    """GPU-hours, utilization, hours per state and cost per group over a window (default: the last 7 days),
    with the same figures as the dashboard. Needs a bearer token with the `read` (or `admin`) scope, or a
    dashboard login."""
    built, fmt = _build(session, app_state(request), request)
    if fmt == "csv":
        name = f"gpufleet-report-{built.window.start:%Y%m%d}.csv"
        return StreamingResponse(
            built.csv_chunks(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    body: dict[str, Any] = built.as_json()
    return JSONResponse(body)


BILLING_PARAMETERS = [
    *window_params("30 days"),
    query_param(
        "format",
        "json or csv. Without it, an Accept header that prefers text/csv to application/json chooses CSV.",
        "csv",
    ),
]
_BILLING_CSV_EXAMPLE = (
    "start,end,finding,instance_id,name,instance_type,availability_zone,usage_account,purchase,first_hour,last_hour,"
    "billed_h,reported_h,difference_h,difference_pct,usd\n"
    "2026-11-01T00:00:00+00:00,2026-11-24T15:04:05+00:00,unmonitored,i-0f3e2d1c0b9a87654,,p4d.24xlarge,us-east-1a,"
    "123456789012,on-demand,2026-11-03T08:00:00+00:00,2026-11-23T22:00:00+00:00,495,,,,10869.032\n"
    "2026-11-01T00:00:00+00:00,2026-11-24T15:04:05+00:00,hours differ,i-0a1b2c3d4e5f60718,train-7,g5.xlarge,,,,"
    "2026-11-10T00:00:00+00:00,2026-11-23T22:00:00+00:00,335,201.5,-133.5,-39.850746,337.01\n"
)
BILLING_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": BillingView,
        "description": "The billing page's figures: JSON as the page's own (`Accept: application/json` on /billing); "
        "CSV: a header row, then one row per unmonitored instance and per instance whose hours disagree.",
        "content": {"text/csv": {"schema": {"type": "string"}, "example": _BILLING_CSV_EXAMPLE}},
    },
    400: RESPONSES[400],
    401: RESPONSES[401],
    403: RESPONSES[403],
}


@router.get(
    "/api/v1/billing",
    summary="The bill against the agents",
    response_model=None,
    responses=BILLING_RESPONSES,
    openapi_extra={**requires("read"), "parameters": BILLING_PARAMETERS},
)
def billing(request: Request, session: SessionDep, _reader: Annotated[Reader, Depends(report_reader)]) -> Response:
    """GPU instances the AWS bill charges for that no agent reports, monitored instances whose billed and reported
    instance-hours disagree, the imported exports and the spot price history read, over a window (default: the last
    30 days). Needs a bearer token with the `read` (or `admin`) scope, or a dashboard login."""
    state = app_state(request)
    try:
        fmt = _format(request)
        window = window_of(request.query_params, now=datetime.now(UTC), default=BILLING_WINDOW)
    except BadParameter as err:
        raise ApiError(400, "bad billing parameter", [FieldProblem(err.param, err.message)]) from None
    view = billing_view(session, window, settings=state.settings)
    if fmt == "csv":
        name = f"gpufleet-billing-{window.start:%Y%m%d}.csv"
        return Response(
            csv_text(view),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    return Response(view_json(view), media_type="application/json")
