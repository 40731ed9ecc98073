"""What one evaluation of the alert rules reads of the fleet (app/alerts/findings.py): the inventory, the newest
samples, the idle GPUs, waste over trailing windows, spot interruption notices and who holds what, all at one
`now` and in the evaluation's transaction.

Each part is read the first time a rule needs it and kept for the rules after it, so an evaluation reads only what
its enabled rules use, and each part once: ten rules of six conditions cost what six conditions cost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..analyse.figures import Figures
from ..analyse.fleet import (
    GONE,
    OFFLINE,
    ONLINE,
    DeviceRowsCache,
    Fleet,
    GpuInfo,
    InstanceInfo,
    free_slices,
    load_fleet,
)
from ..analyse.idle import IdleGpu, idle_gpus
from ..analyse.mig import MigGpuView, UnderusedSlice, mig_gpus, underused_slices, unpartitioned
from ..analyse.now import Latest, current_state, latest_samples
from ..analyse.price_now import BILL_LAG, PriceNow, price_at, read_pieces
from ..analyse.states import OFFLINE as OFFLINE_STATE
from ..analyse.states import Thresholds
from ..analyse.timeline import BucketFigures, row_totals
from ..analyse.units import build_units
from ..analyse.usage import window_usage
from ..analyse.waste import WasteAnalysis
from ..analyse.window import HOUR, Filters, Window, floor_hour
from ..billing.prices import PricePiece
from ..pricing.config import load_price_config
from ..pricing.resolve import Pricer
from ..settings import Settings

T = TypeVar("T")

CAPACITY_BLOCK = "capacity block"
"""billed_prices.reservation_kind of hours in a Capacity Block for ML (app/billing/tables.py)."""

NOTICE_H = 1.0
"""A spot interruption notice counts this many hours after the agent saw it (while the instance is not gone)."""

_ROWS = DeviceRowsCache()
"""The GPU and slice rows kept between evaluations of this process, when the caller passes no cache of its own."""

# Everything read here is keyed by row ids the same fleet read gives, and read in the evaluation's transaction.
_HOLDERS_SQL = text(
    "SELECT n.device_id, h.user_name, h.uid FROM device_status d "
    "JOIN device_holders_now n ON n.device_id = d.device_id AND n.ts = d.ts "
    "JOIN holders h ON h.id = n.holder_id "
    "ORDER BY n.device_id, n.used_mib DESC NULLS LAST, h.pid"
)
_BLOCKS_SQL = text(
    "SELECT DISTINCT ON (instance_id) instance_id, reservation_kind FROM billed_prices "
    "WHERE instance_id = ANY(CAST(:ids AS text[])) AND starts <= :now AND ends > :since "
    "ORDER BY instance_id, starts DESC"
)
_LAYOUT_SQL = text(
    "SELECT gpu_pk, max(greatest(first_seen, coalesce(retired_at, first_seen))) FROM mig_slices "
    "WHERE gpu_pk = ANY(CAST(:ids AS int4[])) GROUP BY gpu_pk "
    "UNION ALL SELECT device_id, max(ts) FROM events WHERE instance_pk = ANY(CAST(:instances AS int8[])) "
    "AND kind = 'mig_mode_changed' AND device_id = ANY(CAST(:ids AS int4[])) GROUP BY device_id"
)
"""Events are read through their instances' index: the table keeps every event of the fleet's history."""
_NOTICES_SQL = text(
    "SELECT DISTINCT ON (instance_pk) instance_pk, ts, details FROM events "
    "WHERE kind = 'spot_interruption' AND ts >= :since AND ts <= :now AND instance_pk IS NOT NULL "
    "ORDER BY instance_pk, ts DESC"
)


def user_of(user_name: str | None, uid: int | None) -> str | None:
    """A holder's user as the grouping by user names it (app/analyse/holders.py): the name, else "uid N"."""
    if user_name:
        return user_name
    return None if uid is None else f"uid {uid}"


def trailing_window(now: datetime, hours: float) -> Window:
    """Whole UTC hours covering at least the last `hours` up to now: from the hour `hours` before now began to the
    end of the current hour (rollups are hourly, so a window starts and ends on an hour)."""
    start = floor_hour(now - timedelta(hours=hours))
    return Window(start=start, end=floor_hour(now) + HOUR, now=now, label=f"last {hours:g} h")


@dataclass(frozen=True)
class Notice:
    """The newest spot interruption notice of an instance, as its agent reported it."""

    ts: datetime
    """When the agent saw the notice."""
    details: dict[str, Any]
    """As sent: `action` (terminate, stop, hibernate) and `time` (when EC2 acts), or `raw`."""


@dataclass(frozen=True)
class FreeCapacity:
    """A MIG GPU reporting now with compute slices in no slice."""

    view: MigGpuView
    since: datetime
    """When its layout last changed: the newest slice made or retired on it, its MIG mode turned on, or its
    first sight."""


@dataclass
class TagSum:
    """What the instances of one tag value wasted over a window, USD."""

    waste: float = 0.0
    idle: float = 0.0
    idle_held: float = 0.0
    gpu_hours: float = 0.0
    instances: int = 0


@dataclass
class Snapshot:
    """The fleet as one evaluation sees it. Parts are read on first use, in the caller's session, and kept."""

    session: Session
    now: datetime
    thresholds: Thresholds
    pricer: Pricer
    rows_cache: DeviceRowsCache | None = None
    _memo: dict[Hashable, Any] = field(default_factory=dict, repr=False)
    _blocks: dict[int, bool] = field(default_factory=dict, repr=False)

    def memo(self, key: Hashable, make: Callable[[], T]) -> T:
        """`make()` the first time `key` is asked for, the same object after: what rules of one condition share."""
        if key not in self._memo:
            self._memo[key] = make()
        found: T = self._memo[key]
        return found

    @cached_property
    def day(self) -> Window:
        """The last 24 h (tag_waste's window)."""
        return trailing_window(self.now, 24)

    @cached_property
    def fleet(self) -> Fleet:
        """Every instance with its GPUs and the slices live in the last day's window; unfiltered: each rule applies
        its own scope."""
        return load_fleet(
            self.session,
            filters=Filters(),
            pricer=self.pricer,
            thresholds=self.thresholds,
            now=self.now,
            since=self.day.start,
            cache=self.rows_cache,
        )

    @cached_property
    def latest(self) -> dict[int, Latest]:
        """Newest sample per device within the offline bound."""
        return latest_samples(self.session, now=self.now, thresholds=self.thresholds)

    @cached_property
    def states(self) -> dict[int, str]:
        """State now of every GPU and live slice."""
        return current_state(self.fleet, self.latest)

    @cached_property
    def idle(self) -> list[IdleGpu]:
        """Every passthrough GPU idle now, however short its stretch: each gpu_idle rule keeps those idle for its
        own `for`, so one read serves rules of any duration."""
        return idle_gpus(
            self.session, self.fleet, self.latest, now=self.now, thresholds=replace(self.thresholds, idle_min_hours=0)
        )

    @cached_property
    def notices(self) -> dict[int, Notice]:
        """Per instance (pk), its newest spot interruption notice of the last `NOTICE_H` hours."""
        since = self.now - timedelta(hours=NOTICE_H)
        rows = self.session.execute(_NOTICES_SQL, {"since": since, "now": self.now}).all()
        return {pk: Notice(ts, dict(details or {})) for pk, ts, details in rows}

    @cached_property
    def _all_holders(self) -> dict[int, tuple[str, ...]]:
        """Per device someone holds, its holders' users (most memory first, each once), as of its newest sample.
        One read for the whole fleet: rules ask of thousands of devices, and sending their ids costs more than the
        rows of the few that are held and not asked about."""
        found: dict[int, list[str]] = {}
        for device_id, name, uid in self.session.execute(_HOLDERS_SQL):
            user = user_of(name, uid)
            users = found.setdefault(device_id, [])
            if user is not None and user not in users:
                users.append(user)
        return {d: tuple(users) for d, users in found.items()}

    def holders(self, device_ids: Iterable[int]) -> dict[int, tuple[str, ...]]:
        """Per device, the users of the processes holding it as of its newest sample (most memory first, each
        once); a device no one holds maps to ()."""
        held = self._all_holders
        return {d: held.get(d, ()) for d in device_ids}

    @cached_property
    def mig_fleet(self) -> Fleet:
        """The GPUs in MIG mode now, with their slices and instances: what slice_underused judges."""
        fleet = self.fleet
        gpus = {pk: g for pk, g in fleet.gpus.items() if g.mig_mode}
        return Fleet(
            instances={g.instance.pk: g.instance for g in gpus.values()},
            gpus=gpus,
            slices={pk: s for pk, s in fleet.slices.items() if s.gpu.pk in gpus},
            options=fleet.options,
            total_instances=fleet.total_instances,
            slices_by_gpu={pk: fleet.slices_by_gpu[pk] for pk in gpus if pk in fleet.slices_by_gpu},
        )

    def underused(self, hours: float) -> tuple[Window, list[UnderusedSlice]]:
        """The live slices under-used over the last `hours` as the MIG page says of its window (app/analyse/mig.py),
        that have existed that long, on a GPU and an instance that report now; and the window they were judged
        over. Their units are at their instances' own prices: whether a slice is under-used does not depend on
        price, and the bill's hour-by-hour repricing of every MIG device would cost more than the rest of an
        evaluation (findings.py prices what they cost from the price pieces)."""
        window = trailing_window(self.now, hours)
        fleet = self.mig_fleet
        bound = self.thresholds.idle_util_pct
        usage = window_usage(self.session, window, idle_util_pct=bound, device_ids=fleet.device_ids())
        analysis = WasteAnalysis(window, self.thresholds, build_units(fleet, usage, window), Figures(), fleet)
        views = mig_gpus(analysis, self.states, self.prices(list(fleet.instances.values())))
        cutoff = self.now - timedelta(hours=hours)
        return window, [
            s
            for s in underused_slices(views)
            if s.slot.slice.first_seen <= cutoff and s.slot.state != OFFLINE_STATE and s.gpu.instance.status == ONLINE
        ]

    @cached_property
    def free_capacity(self) -> list[FreeCapacity]:
        """MIG GPUs that report now with known free capacity (app/analyse/mig.py `unpartitioned`, without the
        window's figures), most expensive first."""
        fleet, states = self.fleet, self.states
        free = [
            (gpu, free_slices(gpu, fleet.live_slices(gpu.pk)))
            for gpu in fleet.gpus.values()
            if gpu.mig_mode and states.get(gpu.pk, OFFLINE_STATE) != OFFLINE_STATE
        ]
        prices = self.prices(list({gpu.instance.pk: gpu.instance for gpu, n in free if n}.values()))
        views = unpartitioned([MigGpuView(gpu, [], n, None, False, prices[gpu.instance.pk]) for gpu, n in free if n])
        changed = self.layout_changed([v.gpu for v in views])
        return [FreeCapacity(v, max(v.gpu.first_seen, changed.get(v.gpu.pk, v.gpu.first_seen))) for v in views]

    @cached_property
    def silent(self) -> list[InstanceInfo]:
        """Instances offline now and not taken as gone (app/analyse/fleet.py statuses)."""
        return [i for i in self.fleet.instances.values() if i.status == OFFLINE]

    @cached_property
    def noticed(self) -> list[tuple[InstanceInfo, Notice]]:
        """Instances not gone with a spot interruption notice of the last NOTICE_H hours, and the notice."""
        found = self.fleet.instances
        return [(found[pk], n) for pk, n in self.notices.items() if pk in found and found[pk].status != GONE]

    @cached_property
    def day_waste(self) -> dict[int, BucketFigures]:
        """Per instance (pk), its figures over the last 24 h (`day`): the per-instance rollups, each hour at the price
        in force then (app/analyse/timeline.py `row_totals`, the window analysis's figures read per instance). One
        read for every tag_waste rule, whatever its tag or scope."""
        rows = {pk: n for n, pk in enumerate(self.fleet.instances)}
        totals = row_totals(self.session, self.fleet, self.day, thresholds=self.thresholds, rows=rows)
        return {pk: totals[n] for pk, n in rows.items() if n in totals}

    def tag_sums(self, key: str, filters: Filters) -> dict[str | None, TagSum]:
        """Waste of the last 24 h per value of the tag `key` (None: instances without it), summed over the instances
        `filters` let through."""
        sums: dict[str | None, TagSum] = {}
        instances = self.fleet.instances
        for pk, f in self.day_waste.items():
            inst = instances[pk]
            if not self.passes(filters, inst):
                continue
            acc = sums.setdefault(inst.tags.get(key), TagSum())
            acc.waste += f.idle_cost + f.idle_held_cost
            acc.idle += f.idle_cost
            acc.idle_held += f.idle_held_cost
            acc.gpu_hours += f.active_h + f.idle_held_h + f.idle_h + f.unpartitioned_h + f.unknown_h
            acc.instances += 1
        return sums

    @staticmethod
    def passes(filters: Filters, inst: InstanceInfo) -> bool:
        """Whether the instance passes the instance filters."""
        return filters.match(
            region=inst.region, instance_type=inst.instance_type, lifecycle=inst.lifecycle, tags=inst.tags
        )

    def instance_holders(self, instances: Collection[InstanceInfo]) -> dict[int, tuple[str, ...]]:
        """Per instance (pk), the users holding any of its GPUs or live slices as of their newest samples, each
        once: for an instance gone silent, who held it when it was last heard from."""
        devices: dict[int, list[int]] = {i.pk: [] for i in instances}
        fleet = self.fleet
        for gpu in fleet.gpus.values():
            if gpu.instance.pk in devices:
                devices[gpu.instance.pk] += [gpu.pk, *(s.pk for s in fleet.live_slices(gpu.pk))]
        held = self.holders(d for ids in devices.values() for d in ids)
        return {pk: tuple(dict.fromkeys(u for d in ids for u in held[d])) for pk, ids in devices.items()}

    @cached_property
    def recent_pieces(self) -> dict[int, list[PricePiece]]:
        """Every instance's price pieces from `BILL_LAG` before the current hour to its end (app/analyse/price_now.py
        `read_pieces`): what each price now needs, and every mean price over that time. One read."""
        return read_pieces(self.session, self.fleet.instances.values(), self.now)

    def prices(self, instances: Collection[InstanceInfo]) -> dict[int, PriceNow]:
        """Each instance's price now, by pk."""
        pieces = self.recent_pieces
        return {i.pk: price_at(i, pieces.get(i.pk, ()), self.now) for i in instances}

    def pieces(self, instances: Collection[InstanceInfo], since: datetime) -> dict[int, list[PricePiece]]:
        """The instances' price pieces from `since` (or the bill's lag, if earlier) to the end of the current hour:
        from the recent read, unless `since` lies before it."""
        if since >= floor_hour(self.now) - BILL_LAG:
            return self.recent_pieces
        return read_pieces(self.session, instances, self.now, since=since)

    def capacity_blocks(self, instances: Collection[InstanceInfo]) -> dict[int, bool]:
        """Per instance (pk), whether it runs in a Capacity Block for ML, as far as the bill tells: its newest billed
        hours, covering now or ended within the bill's lag (`BILL_LAG`), were in one. The bill lags about a day,
        so an instance whose block ended since still counts: the stop action's guard errs on the side of leaving
        it running. False for an instance the bill does not show."""
        missing = [i for i in instances if i.pk not in self._blocks]
        if missing:
            by_id = {i.instance_id: i.pk for i in missing}
            self._blocks.update(dict.fromkeys((i.pk for i in missing), False))
            params = {"ids": list(by_id), "now": self.now, "since": floor_hour(self.now) - BILL_LAG}
            for instance_id, kind in self.session.execute(_BLOCKS_SQL, params):
                self._blocks[by_id[instance_id]] = kind == CAPACITY_BLOCK
        return {i.pk: self._blocks[i.pk] for i in instances}

    def layout_changed(self, gpus: Collection[GpuInfo]) -> dict[int, datetime]:
        """Per MIG GPU (pk), when its layout last changed as stored: the newest slice made or retired on it, or its
        MIG mode turned on. GPUs with neither are left out (their first sight stands for it)."""
        out: dict[int, datetime] = {}
        if not gpus:
            return out
        params = {"ids": [g.pk for g in gpus], "instances": list({g.instance.pk for g in gpus})}
        for pk, at in self.session.execute(_LAYOUT_SQL, params):
            if at is not None and (pk not in out or at > out[pk]):
                out[pk] = at
        return out


def load_snapshot(
    session: Session,
    settings: Settings,
    *,
    now: datetime,
    pricer: Pricer | None = None,
    rows_cache: DeviceRowsCache | None = None,
) -> Snapshot:
    """The fleet at `now` for one evaluation; nothing is read until a rule asks. `pricer` and `rows_cache` are the
    server's (app/state.py) where it has them: else the price file of `settings` is read, and this process's own
    row cache kept."""
    return Snapshot(
        session,
        now,
        Thresholds.from_settings(settings),
        pricer if pricer is not None else Pricer(load_price_config(settings.prices_file)),
        rows_cache if rows_cache is not None else _ROWS,
    )
