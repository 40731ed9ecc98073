"""POST /api/v1/ingest: admit the caller from its headers, read and check the body within the memory budget,
store it in one transaction within a bounded number of slots (app/ingest/admission.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from ..auth import requires
from ..db import session_scope
from ..errors import ApiError
from ..metrics.server import SHED, IngestTally
from ..settings import PARSED_BYTES_PER_JSON_BYTE
from ..state import AppState, app_state
from ..store.inventory import inventory_fingerprint
from .admission import Hold, Shed
from .binding import admit_identity, authenticate_reporter, check_reporter, record_binding
from .parse import check_batch, decode_body, parse_batch, too_large
from .schemas import ErrorOut, IngestBatchIn, IngestResult
from .service import DuplicateBatch, batch_days, ingest_batch

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "Body is not JSON, or not valid gzip.",
        401: "Missing, unknown or revoked token, or an instance identity that does not verify.",
        403: "Token lacks the `ingest` scope, or the token or identity may not report this instance or move its GPUs.",
        413: "Body larger than the limit (after gzip is undone).",
        415: "Unsupported Content-Type or Content-Encoding.",
        422: "Batch does not follow the schema; `detail` names each field at fault.",
        503: "The server is at a load limit; send the same batch again after `Retry-After` seconds.",
    }.items()
}
ENCODINGS = ("identity", "gzip")


def _check_headers(headers: Headers, max_body_bytes: int) -> int:
    """415 or 413 from the headers alone; returns the declared body length (0 if none was declared)."""
    content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type not in ("application/json", ""):
        raise ApiError(415, f"unsupported Content-Type {content_type!r}: send application/json")
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}: send identity or gzip")
    declared = headers.get("content-length", "")
    length = int(declared) if declared.isdigit() else 0
    if length > max_body_bytes:
        raise too_large(max_body_bytes)
    return length


def _body_pending(headers: Headers) -> bool:
    """Whether the client sends a body that an early answer leaves unread on the connection."""
    declared = headers.get("content-length", "")
    return (declared.isdigit() and int(declared) > 0) or "chunked" in headers.get("transfer-encoding", "").lower()


async def _read_body(request: Request, limit: int, hold: Hold) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        hold.grow(size - hold.bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(
    state: AppState, headers: Headers, body: bytes, now: datetime, hold: Hold, tally: IngestTally
) -> IngestBatchIn:
    settings = state.settings
    raw = decode_body(body, headers.get("content-encoding"), max_bytes=settings.max_body_bytes)
    # Taken before parsing: the inflated copy lives beside the body, and the parsed batch until it is stored.
    hold.grow((len(raw) if raw is not body else 0) + PARSED_BYTES_PER_JSON_BYTE * len(raw))
    batch = parse_batch(raw)
    tally.samples = sum(len(iv.samples) for iv in batch.intervals)
    check_batch(
        batch, now=now, max_future_skew_s=settings.max_future_skew_s, raw_retention_days=settings.raw_retention_days
    )
    return batch


def _store(state: AppState, headers: Headers, batch: IngestBatchIn, now: datetime) -> IngestResult:
    """One transaction. The token is checked again inside it: a token revoked after its cached lookup stores
    nothing."""
    # Before the session opens: a thread must never hold one pooled connection while waiting for another.
    state.partitions.ensure(state.engine, batch_days(batch))
    try:
        with session_scope(state.sessions) as session:
            # A token, or the instance's signed identity; and whether it may report this (app/ingest/binding.py).
            reporter = authenticate_reporter(session, headers, state.settings, now=now)
            fingerprint = inventory_fingerprint(batch)
            known = state.inventory.get(batch.instance.instance_id, fingerprint) is not None
            binding = check_reporter(session, batch, reporter, inventory_known=known)
            stored = ingest_batch(
                session,
                batch,
                token_id=reporter.token_id,
                received_at=now,
                mem_held_mib=state.settings.mem_held_mib,
                known=state.inventory,
                fingerprint=fingerprint,
            )
            record_binding(session, batch, reporter, binding)
    except DuplicateBatch:
        return IngestResult(status="duplicate", batch_id=batch.batch_id, samples=0)
    state.inventory.put(batch.instance.instance_id, stored.fingerprint, stored.inventory)
    return stored.result


async def _admit_and_store(state: AppState, request: Request, tally: IngestTally) -> IngestResult:
    """Checks in the order of their cost: the caller and the headers before a byte of the body is read, the
    memory budget while it arrives, a free slot before it is parsed and stored."""
    admission = state.admission
    limit = state.settings.max_body_bytes
    authorization = request.headers.get("authorization")
    read = False
    try:
        if not admit_identity(request.headers, state.settings):
            await admission.caller(state.sessions, authorization)
        declared = _check_headers(request.headers, limit)
        with admission.hold() as hold:
            hold.grow(declared)
            body = await _read_body(request, limit, hold)
            read = True
            return await _parse_and_store(state, request.headers, body, hold, tally)
    except ApiError as exc:
        if not read and _body_pending(request.headers):
            # Answered before the body was read: closing the connection spares receiving the rest of it.
            exc.headers = {**(exc.headers or {}), "Connection": "close"}
        elif read and exc.status_code in (401, 403) and authorization:
            admission.tokens.forget(authorization)  # the store's own check disagreed with the cached lookup
        raise


async def _parse_and_store(
    state: AppState, headers: Headers, body: bytes, hold: Hold, tally: IngestTally
) -> IngestResult:
    admission = state.admission
    async with admission.storing.hold(admission.wait_s, admission.busy("ingest", "GPUFLEET_INGEST_MAX_STORING")):
        async with admission.parsing.hold(admission.wait_s, admission.busy("parse", "GPUFLEET_INGEST_MAX_PARSING")):
            now = datetime.now(UTC)
            batch = await run_in_threadpool(_parse, state, headers, body, now, hold, tally)
            del body  # only the parsed batch is needed from here on
        return await run_in_threadpool(_store, state, headers, batch, now)


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
        try:
            result = await _admit_and_store(state, request, tally)
        except Shed:
            tally.reason = SHED
            raise
        tally.accept(result.status, result.samples)
    return result
