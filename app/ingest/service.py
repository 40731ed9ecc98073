"""Ingest one checked batch: idempotency, inventory, samples and rollups, holders, events. The caller owns the
transaction (one per batch), so a batch that fails anywhere leaves no row behind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import exists, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ..models import IngestBatch
from ..sources import UTIL_SOURCES
from ..store.holders import write_holders
from ..store.inventory import (
    InventoryCache,
    InventoryResult,
    insert_events,
    inventory_fingerprint,
    touch_instance,
    upsert_inventory,
)
from ..store.samples import StageRow, write_samples
from .schemas import IngestBatchIn, IngestResult


class DuplicateBatch(Exception):
    """The batch id is already stored; nothing of this request may be kept."""


def batch_days(batch: IngestBatchIn) -> set[date]:
    """UTC days the batch's samples fall on: each needs a samples partition before the COPY."""
    return {iv.start.astimezone(UTC).date() for iv in batch.intervals if iv.samples}


def _time_span(batch: IngestBatchIn, received_at: datetime) -> tuple[datetime, datetime]:
    if not batch.intervals:
        return received_at, received_at
    first = min(iv.start for iv in batch.intervals)
    last = max(iv.start + timedelta(seconds=iv.duration_s) for iv in batch.intervals)
    return first.astimezone(UTC), min(last, received_at).astimezone(UTC)


def stage_rows(batch: IngestBatchIn, device_ids: dict[str, int]) -> list[StageRow]:
    rows: list[StageRow] = []
    append = rows.append
    for iv in batch.intervals:
        start = iv.start
        dur = iv.duration_s
        for s in iv.samples:
            append(
                (
                    start,
                    device_ids[s.uuid],
                    dur,
                    s.mem_used_mib,
                    s.util,
                    s.sm_active,
                    None if s.power_w is None else round(s.power_w),
                    None if s.temp_c is None else round(s.temp_c),
                    s.procs,
                    UTIL_SOURCES[s.util_source],
                    s.gr_active,
                    s.ecc_uncorrected,
                    s.procs_mem_mib,
                    s.sm_clock_mhz,
                )
            )
    return rows


@dataclass(frozen=True)
class Stored:
    result: IngestResult
    inventory: InventoryResult
    fingerprint: str


def ingest_batch(
    session: Session,
    batch: IngestBatchIn,
    *,
    token_id: int | None,
    received_at: datetime,
    mem_held_mib: int,
    known: InventoryCache | None = None,
    fingerprint: str | None = None,
) -> Stored:
    """Store the batch; raise DuplicateBatch if its id is already stored. `known` is only read here: the
    caller records the inventory in it once the transaction has committed. `fingerprint`: the batch's
    inventory_fingerprint, if the caller has it already."""
    first, last = _time_span(batch, received_at)
    fingerprint = fingerprint or inventory_fingerprint(batch)
    cached = known.get(batch.instance.instance_id, fingerprint) if known is not None else None
    if cached is not None:
        inventory = InventoryResult(instance_pk=cached.instance_pk, device_ids=cached.device_ids)
        _claim(session, batch, inventory.instance_pk, token_id, received_at)
        touch_instance(session, inventory.instance_pk, first=first, last=last, agent_errors=batch.agent.errors)
    else:
        if session.scalar(select(exists().where(IngestBatch.batch_id == batch.batch_id))):
            raise DuplicateBatch(batch.batch_id)
        inventory = upsert_inventory(session, batch, first=first, last=last)
        _claim(session, batch, inventory.instance_pk, token_id, received_at)
    rows = stage_rows(batch, inventory.device_ids)
    # Samples whose device time is already counted (an overlapping interval, the same time under another batch
    # id) are left out, not refused: the answer counts the samples stored.
    stored = write_samples(session, rows, mem_held_mib=mem_held_mib).samples if rows else 0
    if rows and batch.holders:
        write_holders(session, batch, inventory.instance_pk)
    events = inventory.events + [
        {"ts": e.ts, "kind": e.kind, "instance_pk": inventory.instance_pk, "device_id": None, "details": e.details}
        for e in batch.events
    ]
    if batch.agent.dropped_batches:
        events.append(
            {
                "ts": received_at,
                "kind": "agent_dropped_batches",
                "instance_pk": inventory.instance_pk,
                "device_id": None,
                "details": {"count": batch.agent.dropped_batches},
            }
        )
    insert_events(session, events)
    result = IngestResult(status="stored", batch_id=batch.batch_id, samples=stored)
    return Stored(result=result, inventory=inventory, fingerprint=fingerprint)


def _claim(session: Session, batch: IngestBatchIn, instance_pk: int, token_id: int | None, at: datetime) -> None:
    """Insert the batch's idempotency row; a conflict means the batch is stored already (or being stored)."""
    claimed = session.execute(
        pg_insert(IngestBatch)
        .values(
            batch_id=batch.batch_id,
            instance_pk=instance_pk,
            token_id=token_id,
            received_at=at,
            samples=sum(len(iv.samples) for iv in batch.intervals),
            dropped_batches=batch.agent.dropped_batches,
        )
        .on_conflict_do_nothing()
        .returning(IngestBatch.batch_id)
    ).scalar()
    if claimed is None:
        raise DuplicateBatch(batch.batch_id)
