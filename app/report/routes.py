"""GET /api/v1/report: the utilization report as JSON or CSV, for a token with the `read` scope.

The query string is read by hand, so that every bad value answers 400 with a message naming its parameter;
the parameters are described to OpenAPI through `openapi_extra` instead of being declared to FastAPI.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..analyse.states import Thresholds
from ..analyse.window import PRESETS, WindowError, parse_filters, parse_window
from ..auth import require_read, requires
from ..db import session_scope
from ..errors import ApiError, FieldProblem
from ..ingest.schemas import ErrorOut
from ..state import AppState, app_state
from .schemas import ReportOut
from .service import DEFAULT_WINDOW, FIGURE_COLUMNS, Report, build_report, check_retention, parse_group_by

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
            raise WindowError("format", f"unknown format {asked!r}; json or csv")
        return asked
    return "csv" if wants_csv(request.headers.get("accept", "")) else "json"


def _build(state: AppState, request: Request) -> tuple[Report, str]:
    now = datetime.now(UTC)
    q = request.query_params
    with session_scope(state.sessions) as session:
        require_read(session, request, now=now)
    try:
        fmt = _format(request)
        window = parse_window(
            q.get("window") or None, q.get("start") or None, q.get("end") or None, now=now, default=DEFAULT_WINDOW
        )
        check_retention(
            window,
            rollup_retention_days=state.settings.rollup_retention_days,
            param="window" if q.get("window") else "start",
        )
        filters = parse_filters(
            region=q.getlist("region"),
            instance_type=q.getlist("instance_type"),
            lifecycle=q.getlist("lifecycle"),
            tag=q.getlist("tag"),
        )
        group_by = parse_group_by(q.getlist("group_by"))
    except WindowError as err:
        raise ApiError(400, "bad report parameter", [FieldProblem(err.param, err.message)]) from None
    with state.sessions() as session:
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


def _param(name: str, description: str, example: Any, *, repeat: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if repeat:
        schema = {"type": "array", "items": schema}
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
        "example": example,
        **({"style": "form", "explode": True} if repeat else {}),
    }


PARAMETERS = [
    _param(
        "start",
        "Start of the window, ISO 8601 (UTC when no offset is given), rounded down to the hour. With neither "
        "`start` nor `window`: the last 7 days. Must not be before the oldest rollups kept "
        "(`GPUFLEET_ROLLUP_RETENTION_DAYS`).",
        "2026-11-01T00:00:00Z",
    ),
    _param("end", "End of the window, ISO 8601, rounded up to the hour; needs `start`. Default: now.", "2026-11-08"),
    _param(
        "window",
        f"Instead of `start`/`end`, a preset as on the dashboard: {', '.join(PRESETS)}. "
        "7d and 30d start at a UTC midnight.",
        "30d",
    ),
    _param(
        "group_by",
        "One or more of instance, instance_type, region, availability_zone, lifecycle, gpu, slice, gpu_model, "
        "tag:<key>; repeat the parameter or separate names with commas. Several give one row per combination. "
        "Default: instance_type.",
        ["instance_type", "tag:team"],
        repeat=True,
    ),
    _param("region", "Only instances in these regions (repeatable).", ["us-east-1"], repeat=True),
    _param("instance_type", "Only instances of these types (repeatable).", ["p4d.24xlarge"], repeat=True),
    _param(
        "lifecycle",
        "Only instances of these lifecycles: spot, on-demand, on-prem (repeatable).",
        ["spot"],
        repeat=True,
    ),
    _param(
        "tag",
        "Only instances with this tag, `key:value` (or `key=value`); repeated, every one must match.",
        ["team:vision"],
        repeat=True,
    ),
    _param(
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
    "price_source": "catalog on-demand",
}
# One group, so the totals are that group's figures.
_JSON_EXAMPLE = {
    "start": "2026-11-01T00:00:00+00:00",
    "end": "2026-11-08T00:00:00+00:00",
    "group_by": ["instance_type"],
    "rows": [{"group": {"instance_type": "p4d.24xlarge"}, **_EXAMPLE_FIGURES}],
    "totals": _EXAMPLE_FIGURES,
}


def _csv_example() -> str:
    header = ",".join(["start", "end", "instance_type", *FIGURE_COLUMNS])
    t = "2026-11-01T00:00:00+00:00,2026-11-08T00:00:00+00:00"
    figures = "1344,31.25,0,520,96,728,0,0,3688.883856,1998.145422,263.491704,2536.107651,USD,catalog on-demand"
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
async def report(request: Request) -> Response:
    """GPU-hours, utilization, hours per state and cost per group over a window (default: the last 7 days),
    with the same figures as the dashboard. Needs a bearer token with the `read` (or `admin`) scope, or a
    dashboard login."""
    state = app_state(request)
    built, fmt = await run_in_threadpool(_build, state, request)
    if fmt == "csv":
        name = f"gpufleet-report-{built.window.start:%Y%m%d}.csv"
        return StreamingResponse(
            built.csv_chunks(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    body: dict[str, Any] = built.as_json()
    return JSONResponse(body)
