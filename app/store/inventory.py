"""Inventory upsert: instances, GPUs and MIG slices from each batch, with changes kept as events.

A GPU that shows up on another instance is moved and an event says from where. A MIG slot (GPU instance +
compute instance id) that comes back with another UUID or profile retires the old slice row and starts a new
one, so samples already stored stay tied to the profile they were taken under.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, insert, literal, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from ..ingest.schemas import GpuIn, IngestBatchIn, InstanceIn, SliceIn
from ..models import Event, Gpu, Instance, MigSlice

_GPU_COLUMNS = (
    Gpu.id,
    Gpu.uuid,
    Gpu.instance_pk,
    Gpu.gpu_index,
    Gpu.name,
    Gpu.memory_total_mib,
    Gpu.mig_mode,
    Gpu.unpartitioned_slices,
    Gpu.util_reason,
    Gpu.layout_complete,
    Gpu.permission_denied,
)
_SLICE_COLUMNS = (
    MigSlice.id,
    MigSlice.uuid,
    MigSlice.gpu_pk,
    MigSlice.gpu_instance_id,
    MigSlice.compute_instance_id,
    MigSlice.profile,
    MigSlice.compute_slices,
    MigSlice.memory_total_mib,
    MigSlice.util_reason,
)
# A row of _SLICE_COLUMNS (typed loosely: SQLAlchemy's Row generics are invariant per column tuple).
SliceRow = Any
_INSTANCE_FIELDS = (
    "hostname",
    "instance_type",
    "region",
    "availability_zone",
    "lifecycle",
    "ami_id",
    "price_usd_per_hour",
)
# Changes to these are worth an event: they change what the instance costs.
_PRICED_FIELDS = ("instance_type", "lifecycle", "region", "price_usd_per_hour")


@dataclass
class InventoryResult:
    instance_pk: int
    device_ids: dict[str, int]
    events: list[dict[str, Any]] = field(default_factory=list)
    # False for a replayed older batch: its inventory was not applied, so it must not be cached as stored.
    newest: bool = True


def upsert_inventory(session: Session, batch: IngestBatchIn, *, first: datetime, last: datetime) -> InventoryResult:
    """Bring instances/gpus/mig_slices in line with the batch; `first`/`last` bound its samples in time."""
    instance_pk, events, is_newest = _upsert_instance(session, batch, first=first, last=last)
    result = InventoryResult(instance_pk=instance_pk, device_ids={}, events=events, newest=is_newest)
    if batch.gpus and is_newest:
        _upsert_gpus(session, batch.gpus, result, at=first)
    elif batch.gpus:
        _map_replayed(session, batch.gpus, result, last=last)
    return result


def _event(
    kind: str, at: datetime, instance_pk: int | None, device_id: int | None = None, **details: Any
) -> dict[str, Any]:
    return {"ts": at, "kind": kind, "instance_pk": instance_pk, "device_id": device_id, "details": details}


def _instance_values(inst: InstanceIn, batch: IngestBatchIn) -> dict[str, Any]:
    values: dict[str, Any] = {name: getattr(inst, name) for name in _INSTANCE_FIELDS}
    values["tags"] = dict(inst.tags)
    values["agent_version"] = batch.agent.version
    values["interval_s"] = batch.agent.interval_s
    values["agent_errors"] = dict(batch.agent.errors)
    return values


def _upsert_instance(
    session: Session, batch: IngestBatchIn, *, first: datetime, last: datetime
) -> tuple[int, list[dict[str, Any]], bool]:
    """The instance's row id, events for priced changes, and whether this batch is the newest seen."""
    inst = batch.instance
    values = _instance_values(inst, batch)
    row = session.execute(
        select(Instance.id, Instance.first_seen, Instance.last_seen, *[getattr(Instance, k) for k in values]).where(
            Instance.instance_id == inst.instance_id
        )
    ).first()
    if row is None:
        # Two first batches of one new instance can race; the loser just takes the row.
        stmt = (
            pg_insert(Instance)
            .values(instance_id=inst.instance_id, first_seen=first, last_seen=last, **values)
            .on_conflict_do_update(index_elements=[Instance.instance_id], set_={"last_seen": Instance.last_seen})
            .returning(Instance.id)
        )
        return int(session.execute(stmt).scalar_one()), [], True
    events: list[dict[str, Any]] = []
    current = row._mapping
    changed = {k: v for k, v in values.items() if current[k] != v}
    # A replayed old batch must not roll identity or last_seen back.
    is_newest = last >= current["last_seen"]
    update_values: dict[str, Any] = {}
    if last > current["last_seen"]:
        update_values["last_seen"] = last
    if first < current["first_seen"]:
        update_values["first_seen"] = first
    if changed and is_newest:
        update_values.update(changed)
        for k in _PRICED_FIELDS:
            if k in changed:
                events.append(_event("instance_changed", first, row.id, field=k, old=current[k], new=changed[k]))
    if update_values:
        session.execute(update(Instance).where(Instance.id == row.id).values(**update_values))
    return int(row.id), events, is_newest


def _map_replayed(session: Session, gpus: list[GpuIn], result: InventoryResult, *, last: datetime) -> None:
    """A batch older than what is stored (an agent replaying its spool): tie its samples to the devices they
    were taken on and change nothing, so a replay cannot undo a move or a MIG reconfiguration seen since."""
    known_gpus: dict[str, int] = {
        uuid: gpu_id
        for uuid, gpu_id in session.execute(select(Gpu.uuid, Gpu.id).where(Gpu.uuid.in_([g.uuid for g in gpus])))
    }
    slice_uuids = [sl.uuid for g in gpus for sl in g.slices]
    known_slices: dict[str, int] = {}
    if slice_uuids:
        # Retired rows count too; for a UUID seen more than once, the latest row wins.
        for uuid, slice_id in session.execute(
            select(MigSlice.uuid, MigSlice.id).where(MigSlice.uuid.in_(slice_uuids)).order_by(MigSlice.id)
        ):
            known_slices[uuid] = slice_id
    for gpu in gpus:
        if gpu.uuid not in known_gpus:
            # Never seen at all: nothing newer to protect, so store it as any new GPU.
            _upsert_gpus(session, [gpu], result, at=last)
            continue
        gpu_pk = known_gpus[gpu.uuid]
        result.device_ids[gpu.uuid] = gpu_pk
        for sl in gpu.slices:
            if sl.uuid in known_slices:
                result.device_ids[sl.uuid] = known_slices[sl.uuid]
                continue
            # A slice of a layout that is already gone: keep it, retired, so its samples have a device.
            slice_id = _insert_slice(session, sl, gpu_pk, first_seen=last, retired_at=last)
            result.device_ids[sl.uuid] = slice_id


def _upsert_gpus(session: Session, gpus: list[GpuIn], result: InventoryResult, *, at: datetime) -> None:
    instance_pk = result.instance_pk
    # Plain rows, not ORM objects: this runs for every batch and nothing here is written back through them.
    existing = {
        g.uuid: g for g in session.execute(select(*_GPU_COLUMNS).where(Gpu.uuid.in_([gpu.uuid for gpu in gpus])))
    }
    live_slices: dict[int, list[SliceRow]] = {}
    slice_uuids = [sl.uuid for gpu in gpus for sl in gpu.slices]
    gpu_pks = [g.id for g in existing.values()]
    if gpu_pks or slice_uuids:
        for sl in session.execute(
            select(*_SLICE_COLUMNS).where(
                MigSlice.retired_at.is_(None),
                MigSlice.gpu_pk.in_(gpu_pks) | MigSlice.uuid.in_(slice_uuids),
            )
        ):
            live_slices.setdefault(sl.gpu_pk, []).append(sl)

    for gpu in gpus:
        values = {
            "instance_pk": instance_pk,
            "gpu_index": gpu.index,
            "name": gpu.name,
            "memory_total_mib": gpu.memory_total_mib,
            "mig_mode": gpu.mig_mode,
            "unpartitioned_slices": gpu.unpartitioned_slices,
            "util_reason": gpu.util_unavailable_reason,
            "layout_complete": gpu.layout_complete,
            "permission_denied": [p.model_dump() for p in gpu.permission_denied],
        }
        row = existing.get(gpu.uuid)
        if row is None:
            gpu_pk = session.execute(
                insert(Gpu).values(uuid=gpu.uuid, first_seen=at, updated_at=at, **values).returning(Gpu.id)
            ).scalar_one()
            is_new = True
        else:
            gpu_pk = row.id
            is_new = False
            if row.instance_pk != instance_pk:
                result.events.append(
                    _event("gpu_moved", at, instance_pk, gpu_pk, uuid=gpu.uuid, from_instance_pk=row.instance_pk)
                )
            if row.mig_mode != gpu.mig_mode:
                result.events.append(_event("mig_mode_changed", at, instance_pk, gpu_pk, mig_mode=gpu.mig_mode))
            changed = {k: v for k, v in values.items() if getattr(row, k) != v}
            if changed:
                session.execute(update(Gpu).where(Gpu.id == gpu_pk).values(updated_at=at, **changed))
        result.device_ids[gpu.uuid] = gpu_pk
        _sync_slices(session, gpu, gpu_pk, live_slices, result, at=at, announce=not is_new)


def _sync_slices(
    session: Session,
    gpu: GpuIn,
    gpu_pk: int,
    live_slices: dict[int, list[SliceRow]],
    result: InventoryResult,
    *,
    at: datetime,
    announce: bool,
) -> None:
    live = {sl.uuid: sl for sl in live_slices.get(gpu_pk, [])}
    by_slot = {(sl.gpu_instance_id, sl.compute_instance_id): sl for sl in live.values()}
    # Slices reported under this GPU that the database still has live under another one.
    strays = {sl.uuid: sl for pk, rows in live_slices.items() if pk != gpu_pk for sl in rows}
    wanted = {sl.uuid for sl in gpu.slices}
    to_retire: list[SliceRow] = []
    new: list[SliceIn] = []
    for sl in gpu.slices:
        row = live.get(sl.uuid)
        if row is not None and _same_slice(row, sl):
            result.device_ids[sl.uuid] = row.id
            if row.util_reason != sl.util_unavailable_reason or row.memory_total_mib != sl.memory_total_mib:
                session.execute(
                    update(MigSlice)
                    .where(MigSlice.id == row.id)
                    .values(util_reason=sl.util_unavailable_reason, memory_total_mib=sl.memory_total_mib)
                )
            continue
        if row is not None:
            to_retire.append(row)
        previous = by_slot.get((sl.gpu_instance_id, sl.compute_instance_id))
        if previous is not None and previous.uuid not in wanted and previous not in to_retire:
            to_retire.append(previous)
        if sl.uuid in strays:
            to_retire.append(strays.pop(sl.uuid))
        if announce or previous is not None:
            result.events.append(
                _event(
                    "mig_reconfigured",
                    at,
                    result.instance_pk,
                    gpu_pk,
                    gpu_instance_id=sl.gpu_instance_id,
                    compute_instance_id=sl.compute_instance_id,
                    old_profile=previous.profile if previous is not None else None,
                    new_profile=sl.profile,
                    old_uuid=previous.uuid if previous is not None else None,
                    new_uuid=sl.uuid,
                )
            )
        new.append(sl)
    for row in live.values():
        if row.uuid not in wanted and row not in to_retire:
            to_retire.append(row)
            result.events.append(
                _event(
                    "mig_slice_removed",
                    at,
                    result.instance_pk,
                    row.id,
                    gpu_instance_id=row.gpu_instance_id,
                    profile=row.profile,
                    uuid=row.uuid,
                )
            )
    if to_retire:
        session.execute(update(MigSlice).where(MigSlice.id.in_([r.id for r in to_retire])).values(retired_at=at))
    for sl in new:
        result.device_ids[sl.uuid] = _insert_slice(session, sl, gpu_pk, first_seen=at)


def _insert_slice(
    session: Session, sl: SliceIn, gpu_pk: int, *, first_seen: datetime, retired_at: datetime | None = None
) -> int:
    return int(
        session.execute(
            insert(MigSlice)
            .values(
                uuid=sl.uuid,
                gpu_pk=gpu_pk,
                gpu_instance_id=sl.gpu_instance_id,
                compute_instance_id=sl.compute_instance_id,
                profile=sl.profile,
                compute_slices=sl.compute_slices,
                memory_total_mib=sl.memory_total_mib,
                util_reason=sl.util_unavailable_reason,
                first_seen=first_seen,
                retired_at=retired_at,
            )
            .returning(MigSlice.id)
        ).scalar_one()
    )


def _same_slice(row: SliceRow, sl: SliceIn) -> bool:
    return (row.gpu_instance_id, row.compute_instance_id, row.profile, row.compute_slices) == (
        sl.gpu_instance_id,
        sl.compute_instance_id,
        sl.profile,
        sl.compute_slices,
    )


def insert_events(session: Session, events: list[dict[str, Any]]) -> None:
    if events:
        session.execute(insert(Event), events)


def inventory_fingerprint(batch: IngestBatchIn) -> str:
    """A digest of everything upsert_inventory reads from a batch: equal digests, nothing to upsert.

    The agent's error counts are left out: they change from batch to batch, and touch_instance stores them.
    """
    parts = [batch.instance.model_dump_json(), batch.agent.version or "", repr(batch.agent.interval_s)]
    parts += [g.model_dump_json() for g in batch.gpus]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class KnownInventory:
    fingerprint: str
    instance_pk: int
    device_ids: dict[str, int]
    expires: float


class InventoryCache:
    """Per-process memory of each instance's last stored inventory, so a batch from an agent whose hardware
    did not change skips the inventory queries. Entries are written only after a commit, and expire, which
    bounds how long a change made through another server process can go unseen here."""

    def __init__(self, ttl_s: float = 300.0) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, KnownInventory] = {}
        self._lock = threading.Lock()

    def get(self, instance_id: str, fingerprint: str) -> KnownInventory | None:
        with self._lock:
            entry = self._entries.get(instance_id)
        if entry is None or entry.fingerprint != fingerprint or entry.expires < time.monotonic():
            return None
        return entry

    def put(self, instance_id: str, fingerprint: str, result: InventoryResult) -> None:
        if not result.newest:
            # The entry from the newest batch, if any, still describes what is stored.
            return
        entry = KnownInventory(fingerprint, result.instance_pk, dict(result.device_ids), time.monotonic() + self.ttl_s)
        with self._lock:
            if result.events:
                # Something moved: whatever other instances this process remembers may be stale now.
                self._entries.clear()
            self._entries[instance_id] = entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def touch_instance(
    session: Session, instance_pk: int, *, first: datetime, last: datetime, agent_errors: dict[str, int]
) -> None:
    """Widen the instance's time span and store the batch's error counts unless it is an older replay; for a
    batch whose inventory fingerprint is unchanged."""
    newest = Instance.last_seen <= last  # SET expressions read the row as it was, so this is before the update
    session.execute(
        update(Instance)
        .where(Instance.id == instance_pk)
        .values(
            last_seen=func.greatest(Instance.last_seen, last),
            first_seen=func.least(Instance.first_seen, first),
            agent_errors=case((newest, literal(agent_errors, JSONB)), else_=Instance.agent_errors),
        )
    )
