"""GET /api/v1/report: the utilization report as JSON or CSV, for a token with the `read` scope."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..analyse.states import Thresholds
from ..analyse.window import WindowError, parse_filters, parse_window
from ..auth import authenticate
from ..db import session_scope
from ..errors import ApiError, FieldProblem
from ..state import AppState, app_state
from .service import DEFAULT_WINDOW, Report, build_report, parse_group_by

router = APIRouter(tags=["report"])

FORMATS = ("json", "csv")


def _format(request: Request) -> str:
    asked = request.query_params.get("format")
    if asked is not None:
        if asked not in FORMATS:
            raise WindowError("format", f"unknown format {asked!r}; json or csv")
        return asked
    accept = request.headers.get("accept", "")
    return "csv" if "text/csv" in accept and "application/json" not in accept else "json"


def _build(state: AppState, request: Request) -> tuple[Report, str]:
    now = datetime.now(UTC)
    q = request.query_params
    with session_scope(state.sessions) as session:
        authenticate(session, request.headers.get("authorization"), needed="read", now=now)
    try:
        fmt = _format(request)
        window = parse_window(
            q.get("window") or None, q.get("start") or None, q.get("end") or None, now=now, default=DEFAULT_WINDOW
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
        )
    return report, fmt


@router.get("/api/v1/report", summary="Utilization, idle time and cost, grouped", response_model=None)
async def report(request: Request) -> Response:
    """GPU-hours, utilization, hours per state and cost per group over a window (default: the last 7 days),
    with the same figures as the dashboard. `format=csv` (or `Accept: text/csv`) answers CSV."""
    state = app_state(request)
    built, fmt = await run_in_threadpool(_build, state, request)
    if fmt == "csv":
        name = f"gpufleet-report-{built.window.start:%Y%m%d}.csv"
        return StreamingResponse(
            built.csv_lines(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    body: dict[str, Any] = built.as_json()
    return JSONResponse(body)
