"""The inventory an analysis covers: instances with their price and status, their GPUs and MIG slices."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..models import Event, Gpu, Instance, MigSlice
from ..pricing.resolve import Price, Pricer
from .states import Thresholds
from .window import Filters

ONLINE = "online"
OFFLINE = "offline"
GONE = "gone"


@dataclass(frozen=True)
class InstanceInfo:
    pk: int
    instance_id: str
    hostname: str | None
    instance_type: str | None
    region: str | None
    availability_zone: str | None
    lifecycle: str | None
    tags: dict[str, str]
    agent_version: str | None
    interval_s: float | None
    agent_errors: dict[str, int]
    first_seen: datetime
    last_seen: datetime
    price: Price
    gpu_model: str | None
    status: str
    """online, offline (no data for `offline_after_s`), or gone (taken as terminated: offline hours stop)."""
    tracked_until: datetime
    """Data is expected up to here: now, or last_seen for a gone instance."""

    @property
    def name(self) -> str:
        return self.tags.get("Name") or self.hostname or self.instance_id


@dataclass(frozen=True)
class GpuInfo:
    pk: int
    uuid: str
    instance: InstanceInfo
    index: int
    name: str
    memory_total_mib: int | None
    mig_mode: bool
    unpartitioned_slices: int | None
    util_reason: str | None
    first_seen: datetime

    @property
    def label(self) -> str:
        return f"{self.instance.name} GPU {self.index}"


@dataclass(frozen=True)
class SliceInfo:
    pk: int
    uuid: str
    gpu: GpuInfo
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    compute_slices: int
    memory_total_mib: int | None
    util_reason: str | None
    first_seen: datetime
    retired_at: datetime | None

    @property
    def fraction(self) -> float:
        """Share of its GPU: compute slices out of 7."""
        return self.compute_slices / 7

    @property
    def label(self) -> str:
        return f"{self.gpu.label} {self.profile} (GI {self.gpu_instance_id})"


@dataclass(frozen=True)
class FilterOptions:
    """Values present in the whole fleet, for the filter form."""

    regions: list[str]
    instance_types: list[str]
    lifecycles: list[str]
    tags: list[str]
    """`key:value` pairs, most common first."""


@dataclass
class Fleet:
    instances: dict[int, InstanceInfo]
    gpus: dict[int, GpuInfo]
    slices: dict[int, SliceInfo]
    options: FilterOptions
    total_instances: int
    """Instances known before filtering."""
    slices_by_gpu: dict[int, list[SliceInfo]] = field(default_factory=dict)

    def device_ids(self) -> list[int]:
        return [*self.gpus, *self.slices]


def _status(last_seen: datetime, interrupted: bool, now: datetime, t: Thresholds) -> str:
    silent = now - last_seen
    if silent <= timedelta(seconds=t.offline_after_s):
        return ONLINE
    if interrupted or silent >= timedelta(hours=t.gone_after_h):
        return GONE
    return OFFLINE


def load_fleet(
    session: Session,
    *,
    filters: Filters,
    pricer: Pricer,
    thresholds: Thresholds,
    now: datetime,
    since: datetime | None = None,
) -> Fleet:
    """Instances matching `filters` with their GPUs and slices; slices retired before `since` are left out."""
    rows = session.execute(select(Instance)).scalars().all()
    interrupted = set(
        session.execute(select(Event.instance_pk).where(Event.kind == "spot_interruption").distinct()).scalars()
    )
    gpus_per_instance: Counter[int] = Counter(session.execute(select(Gpu.instance_pk)).scalars())
    options = _options(rows)
    instances: dict[int, InstanceInfo] = {}
    for inst in rows:
        if filters.instance_ids and inst.instance_id not in filters.instance_ids:
            continue
        if not filters.match(
            region=inst.region, instance_type=inst.instance_type, lifecycle=inst.lifecycle, tags=inst.tags
        ):
            continue
        status = _status(inst.last_seen, inst.id in interrupted, now, thresholds)
        instances[inst.id] = InstanceInfo(
            pk=inst.id,
            instance_id=inst.instance_id,
            hostname=inst.hostname,
            instance_type=inst.instance_type,
            region=inst.region,
            availability_zone=inst.availability_zone,
            lifecycle=inst.lifecycle,
            tags=dict(inst.tags),
            agent_version=inst.agent_version,
            interval_s=inst.interval_s,
            agent_errors=dict(inst.agent_errors or {}),
            first_seen=inst.first_seen,
            last_seen=inst.last_seen,
            price=pricer.price(
                instance_type=inst.instance_type,
                lifecycle=inst.lifecycle,
                agent_usd_per_hour=inst.price_usd_per_hour,
                gpus_seen=gpus_per_instance[inst.id],
            ),
            gpu_model=pricer.gpu_model(inst.instance_type),
            status=status,
            tracked_until=inst.last_seen if status == GONE else now,
        )
    gpus: dict[int, GpuInfo] = {}
    if instances:
        for g in session.execute(select(Gpu).where(Gpu.instance_pk.in_(instances))).scalars():
            gpus[g.id] = GpuInfo(
                pk=g.id,
                uuid=g.uuid,
                instance=instances[g.instance_pk],
                index=g.gpu_index,
                name=g.name,
                memory_total_mib=g.memory_total_mib,
                mig_mode=g.mig_mode,
                unpartitioned_slices=g.unpartitioned_slices,
                util_reason=g.util_reason,
                first_seen=g.first_seen,
            )
    slices: dict[int, SliceInfo] = {}
    by_gpu: dict[int, list[SliceInfo]] = {}
    if gpus:
        stmt = select(MigSlice).where(MigSlice.gpu_pk.in_(gpus))
        if since is not None:
            stmt = stmt.where((MigSlice.retired_at.is_(None)) | (MigSlice.retired_at > since))
        for s in session.execute(stmt.order_by(MigSlice.gpu_instance_id, MigSlice.compute_instance_id)).scalars():
            info = SliceInfo(
                pk=s.id,
                uuid=s.uuid,
                gpu=gpus[s.gpu_pk],
                gpu_instance_id=s.gpu_instance_id,
                compute_instance_id=s.compute_instance_id,
                profile=s.profile,
                compute_slices=s.compute_slices,
                memory_total_mib=s.memory_total_mib,
                util_reason=s.util_reason,
                first_seen=s.first_seen,
                retired_at=s.retired_at,
            )
            slices[s.id] = info
            by_gpu.setdefault(s.gpu_pk, []).append(info)
    return Fleet(
        instances=instances,
        gpus=gpus,
        slices=slices,
        options=options,
        total_instances=len(rows),
        slices_by_gpu=by_gpu,
    )


def _options(rows: Any) -> FilterOptions:
    tags: Counter[str] = Counter()
    regions: set[str] = set()
    types: set[str] = set()
    lifecycles: set[str] = set()
    for inst in rows:
        if inst.region:
            regions.add(inst.region)
        if inst.instance_type:
            types.add(inst.instance_type)
        if inst.lifecycle:
            lifecycles.add(inst.lifecycle)
        for k, v in (inst.tags or {}).items():
            tags[f"{k}:{v}"] += 1
    return FilterOptions(
        regions=sorted(regions),
        instance_types=sorted(types),
        lifecycles=sorted(lifecycles),
        tags=[t for t, _n in tags.most_common(50)],
    )
