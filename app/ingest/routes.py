"""POST /api/v1/ingest: authenticate, read and check the body, store it in one transaction."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from ..auth import authenticate, requires
from ..db import session_scope
from ..errors import ApiError
from ..metrics.server import IngestTally
from ..state import AppState, app_state
from .parse import check_batch, decode_body, parse_batch, too_large
from .schemas import ErrorOut, IngestBatchIn, IngestResult
from .service import DuplicateBatch, batch_days, ingest_batch

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "Body is not JSON, or not valid gzip.",
        401: "Missing, unknown or revoked token.",
        403: "Token lacks the `ingest` scope.",
        413: "Body larger than the limit (after gzip is undone).",
        415: "Unsupported Content-Type or Content-Encoding.",
        422: "Batch does not follow the schema; `detail` names each field at fault.",
    }.items()
}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(state: AppState, headers: Headers, body: bytes, now: datetime, tally: IngestTally) -> IngestBatchIn:
    settings = state.settings
    raw = decode_body(body, headers.get("content-encoding"), max_bytes=settings.max_body_bytes)
    batch = parse_batch(raw)
    tally.samples = sum(len(iv.samples) for iv in batch.intervals)
    check_batch(
        batch, now=now, max_future_skew_s=settings.max_future_skew_s, raw_retention_days=settings.raw_retention_days
    )
    return batch


def _handle(state: AppState, headers: Headers, body: bytes, tally: IngestTally) -> IngestResult:
    """Everything after the body is read, in one worker thread and one transaction."""
    now = datetime.now(UTC)
    batch: IngestBatchIn | None = None
    problem: ApiError | None = None
    try:
        batch = _parse(state, headers, body, now, tally)
        # Before the session opens: a thread must never hold one pooled connection while waiting for another.
        state.partitions.ensure(state.engine, batch_days(batch))
    except ApiError as exc:
        problem = exc
    try:
        with session_scope(state.sessions) as session:
            caller = authenticate(session, headers.get("authorization"), needed="ingest", now=now)
            # Only an authenticated caller learns what is wrong with its batch.
            if problem is not None:
                raise problem
            assert batch is not None
            stored = ingest_batch(
                session,
                batch,
                token_id=caller.token_id,
                received_at=now,
                mem_held_mib=state.settings.mem_held_mib,
                known=state.inventory,
            )
    except DuplicateBatch:
        assert batch is not None
        return IngestResult(status="duplicate", batch_id=batch.batch_id, samples=0)
    state.inventory.put(batch.instance.instance_id, stored.fingerprint, stored.inventory)
    return stored.result


@router.post(
    "/api/v1/ingest",
    response_model=IngestResult,
    summary="Store one batch of utilization samples from an agent",
    responses=_ERRORS,
    openapi_extra={
        **requires("ingest"),
        "requestBody": {
            "required": True,
            "description": "One batch (schema version 1). May be gzip-compressed (`Content-Encoding: gzip`).",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatchIn"}}},
        },
    },
)
async def ingest(request: Request) -> IngestResult:
    """Idempotent by `batch_id`: a batch sent again after a lost answer is acknowledged and stored once."""
    state = app_state(request)
    with state.metrics.observe_ingest() as tally:
        content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if content_type not in ("application/json", ""):
            raise ApiError(415, f"unsupported Content-Type {content_type!r}: send application/json")
        body = await _read_body(request, state.settings.max_body_bytes)
        result: IngestResult = await run_in_threadpool(_handle, state, request.headers, body, tally)
        tally.accept(result.status, result.samples)
    return result
