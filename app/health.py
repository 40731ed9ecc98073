"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from .auth import requires
from .migrate import current_revision, head_revision
from .outage import RETRY_AFTER_S, database_unavailable, describe
from .state import AppState, app_state

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up", openapi_extra=requires(None))
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _readiness(state: AppState) -> tuple[bool, dict[str, str | None]]:
    head = head_revision()
    try:
        with state.engine.connect() as conn:
            current = current_revision(conn)
    except SQLAlchemyError as exc:
        if database_unavailable(exc):
            state.outage.down(exc)
        return False, {"status": "not ready", "reason": f"database unreachable: {describe(exc)}"}
    if current != head:
        return False, {
            "status": "not ready",
            "reason": f"database schema at {current or 'nothing'}, expected {head}: run `gpufleet migrate`",
        }
    return True, {"status": "ready", "schema": current}


@router.get(
    "/readyz",
    summary="The database answers and its schema is at the newest migration",
    responses={503: {"description": "Not ready; `reason` says why, `Retry-After` when to ask again."}},
    openapi_extra=requires(None),
)
async def readyz(request: Request) -> JSONResponse:
    ok, body = await run_in_threadpool(_readiness, app_state(request))
    if ok:
        return JSONResponse(body)
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
