"""GET /metrics: the Prometheus text format, for a caller that may read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.orm import Session

from ..analyse.states import Thresholds
from ..auth import requires
from ..deps import SessionDep
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


def _scrape(state: AppState, session: Session, request: Request) -> bytes:
    def on_database_error() -> None:
        state.metrics.database_error("scrape")

    check_reader(session, state.settings, state.metrics.readers, request, on_database_error=on_database_error)
    collector = FleetCollector(
        session,
        pricer=state.pricer,
        thresholds=Thresholds.from_settings(state.settings),
        on_database_error=on_database_error,
    )
    return state.metrics.exposition(collector)


@router.get(
    "/metrics",
    summary="Server health and fleet figures in the Prometheus text format",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}, **_ERRORS},
    openapi_extra=requires("read"),
)
def metrics(request: Request, session: SessionDep) -> Response:
    """Ingest counters and latency, database errors, and the fleet now (agents, GPUs by state, waste in USD/h);
    docs/metrics.md lists every metric. Needs a token with the `read` scope (or a dashboard login)."""
    body = _scrape(app_state(request), session, request)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
