"""GET /metrics: the Prometheus text format, for a caller that may read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from ..auth import requires
from ..ingest.schemas import ErrorOut
from ..state import AppState, app_state
from .access import check_reader
from .fleet import FleetCollector

router = APIRouter(tags=["metrics"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        401: "Missing, unknown or revoked token.",
        403: "Token lacks the `read` scope, or GPUFLEET_AUTH=off and the client is not on this host.",
        503: "The database is down and the token was not checked lately, so it cannot be checked now.",
    }.items()
}


def _scrape(state: AppState, request: Request) -> bytes:
    check_reader(state, request)
    return state.metrics.exposition(FleetCollector(state))


@router.get(
    "/metrics",
    summary="Server health and fleet figures in the Prometheus text format",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}, **_ERRORS},
    openapi_extra=requires("read"),
)
async def metrics(request: Request) -> Response:
    """Ingest counters and latency, database errors, and the fleet now (agents, GPUs by state, waste in USD/h);
    docs/metrics.md lists every metric. Needs a token with the `read` scope (or a dashboard login)."""
    state = app_state(request)
    body = await run_in_threadpool(_scrape, state, request)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
