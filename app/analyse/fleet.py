"""The inventory an analysis covers: instances with their price and status, their GPUs and MIG slices."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ..models import Event, Gpu, Instance, MigSlice
from ..pricing.resolve import Price, Pricer
from .states import Thresholds
from .window import Filters

ONLINE = "online"
OFFLINE = "offline"
GONE = "gone"

UNKNOWN_PROFILE = "unknown"
"""The profile an agent sends for a MIG slice whose size it could not read."""


# A plain slotted class, not a frozen one: a frozen dataclass's __init__ costs several times more, and a page
# view builds one per instance. Nothing changes it after load_fleet.
@dataclass(slots=True)
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


class PermissionDenied(NamedTuple):
    """A figure NVML refused to the agent at its privilege: the figure, the NVML call, and what to grant (keys as
    the agent sent them; app.web.privileges words them)."""

    figure: str
    call: str
    grant: str


# GPUs and slices are named tuples: a page view builds thousands, and a tuple is made in C.
class GpuInfo(NamedTuple):
    pk: int
    uuid: str
    instance: InstanceInfo
    gpu_index: int
    name: str
    memory_total_mib: int | None
    mig_mode: bool
    unpartitioned_slices: int | None
    util_reason: str | None
    first_seen: datetime
    layout_complete: bool = True
    """False when the agent found a MIG device it could not size: the free MIG capacity is unknown."""
    permission_denied: tuple[PermissionDenied, ...] = ()
    """Figures of this GPU or its slices that the agent could not read at its privilege."""

    @property
    def label(self) -> str:
        return f"{self.instance.name} GPU {self.gpu_index}"


class SliceInfo(NamedTuple):
    pk: int
    uuid: str
    gpu: GpuInfo
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    compute_slices: int | None
    """None when the agent could not read the slice's size."""
    memory_total_mib: int | None
    util_reason: str | None
    first_seen: datetime
    retired_at: datetime | None

    @property
    def fraction(self) -> float | None:
        """Share of its GPU: compute slices out of 7; None when the size is unknown."""
        return None if self.compute_slices is None else self.compute_slices / 7

    @property
    def profile_label(self) -> str:
        """The profile, or "unknown profile" for one the agent could not read."""
        return "unknown profile" if self.profile == UNKNOWN_PROFILE else self.profile

    @property
    def label(self) -> str:
        return f"{self.gpu.label} {self.profile_label} (GI {self.gpu_instance_id})"


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

    def live_slices(self, gpu_pk: int) -> list[SliceInfo]:
        """The GPU's slices as it is laid out now (not retired)."""
        return [s for s in self.slices_by_gpu.get(gpu_pk, []) if s.retired_at is None]


def layout_known(gpu: GpuInfo, slices: Iterable[SliceInfo]) -> bool:
    """Whether the GPU's MIG layout is known in full: the agent sized every MIG device it found, and every slice
    given has a size. Where it is not, what lies outside the known slices may be free or not: unknown."""
    return gpu.layout_complete and all(s.compute_slices is not None for s in slices)


def free_slices(gpu: GpuInfo, live: list[SliceInfo]) -> int | None:
    """Compute slices (of 7) of a MIG-mode GPU in no slice: as the agent reported, else what its live slices
    leave; 0 for a GPU not in MIG mode; None when the layout is not known in full (`layout_known`)."""
    if not gpu.mig_mode:
        return 0
    if not layout_known(gpu, live):
        return None
    if gpu.unpartitioned_slices is not None:
        return gpu.unpartitioned_slices
    return max(0, 7 - sum(s.compute_slices or 0 for s in live))


_INSTANCE_COLUMNS = (
    Instance.id,
    Instance.instance_id,
    Instance.hostname,
    Instance.instance_type,
    Instance.region,
    Instance.availability_zone,
    Instance.lifecycle,
    Instance.tags,
    Instance.agent_version,
    Instance.interval_s,
    Instance.agent_errors,
    Instance.first_seen,
    Instance.last_seen,
    Instance.price_usd_per_hour,
)
# Column order is the field order of GpuInfo / SliceInfo, with the owner's key where the owner goes.
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
    Gpu.first_seen,
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
    MigSlice.first_seen,
    MigSlice.retired_at,
)


# Row count and sum of row versions (xmin) per table: any insert, update or delete that commits changes one of
# them, whatever order transactions commit in (a max of xmin would miss an older transaction committing late).
_DEVICE_ROWS_VERSION = text(
    "SELECT (SELECT count(*) || ':' || coalesce(sum(xmin::text::int8), 0) FROM gpus)"
    " || '/' || (SELECT count(*) || ':' || coalesce(sum(xmin::text::int8), 0) FROM mig_slices)"
)


class DeviceRowsCache:
    """The GPU and MIG slice rows of the inventory, kept between page views in one server process.

    They change only when an agent reports new hardware or a new MIG layout, while a page reads them on every
    view (thousands of rows); a one-row query on the tables' row versions tells whether the kept rows are
    still what is stored. Instances are read every time: their last-seen time moves with every batch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: str | None = None
        self._rows: tuple[list[Any], list[Any]] = ([], [])

    def rows(self, session: Session) -> tuple[list[Any], list[Any]]:
        """(GPU rows, slice rows), read again only when the tables changed."""
        version = session.execute(_DEVICE_ROWS_VERSION).scalar_one()
        with self._lock:
            if version == self._version:
                return self._rows
        rows = _read_device_rows(session)
        with self._lock:
            self._version, self._rows = version, rows
        return rows


def _read_device_rows(session: Session) -> tuple[list[Any], list[Any]]:
    # The permission list (last column) becomes tuples here, once per read of the tables, not per page view.
    gpus = [
        (*r[:-1], tuple(PermissionDenied(d["figure"], d["call"], d["grant"]) for d in refused))
        for r in session.execute(select(*_GPU_COLUMNS)).all()
        for refused in [r.permission_denied or []]
    ]
    slices = [
        tuple(r)
        for r in session.execute(
            select(*_SLICE_COLUMNS).order_by(MigSlice.gpu_instance_id, MigSlice.compute_instance_id)
        ).all()
    ]
    return gpus, slices


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
    cache: DeviceRowsCache | None = None,
) -> Fleet:
    """Instances matching `filters` with their GPUs and slices; slices retired before `since` are left out.
    With `cache`, GPU and slice rows come from it while the tables are unchanged."""
    # Plain rows rather than ORM objects: a fleet is thousands of devices, read on every page view.
    rows = session.execute(select(*_INSTANCE_COLUMNS)).all()
    interrupted = set(
        session.execute(select(Event.instance_pk).where(Event.kind == "spot_interruption").distinct()).scalars()
    )
    gpu_rows, slice_rows = cache.rows(session) if cache is not None else _read_device_rows(session)
    gpus_per_instance: Counter[int] = Counter(g[2] for g in gpu_rows)
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
    # Tuples unpacked by position: named access on thousands of rows costs more than the queries.
    gpus: dict[int, GpuInfo] = {}
    make_gpu, make_slice = GpuInfo._make, SliceInfo._make
    for gpu_pk, uuid, instance_pk, *rest in gpu_rows:
        owner = instances.get(instance_pk)
        if owner is not None:
            gpus[gpu_pk] = make_gpu((gpu_pk, uuid, owner, *rest))
    slices: dict[int, SliceInfo] = {}
    by_gpu: dict[int, list[SliceInfo]] = {}
    for slice_pk, uuid, gpu_pk, *rest in slice_rows:
        gpu = gpus.get(gpu_pk)
        if gpu is None:
            continue
        retired_at = rest[-1]
        if since is not None and retired_at is not None and retired_at <= since:
            continue
        info = make_slice((slice_pk, uuid, gpu, *rest))
        slices[slice_pk] = info
        by_gpu.setdefault(gpu_pk, []).append(info)
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
