"""The fleet now, as Prometheus gauges, read from PostgreSQL at scrape time.

The figures come from the same analysis functions as the dashboard overview (`load_fleet`,
`latest_samples`, `current_state`, `gpu_equivalents_now`, `idle_gpus`, `prices_now`), so /metrics and the pages
agree: dollars per hour are at each instance's price now (app/analyse/price_now.py). A scrape reads the inventory,
one `device_status` row per device and the price pieces of the instances with something idle: a few queries,
however long the history. Every label has a bounded set of values; instance types are capped at `MAX_INSTANCE_TYPES`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..analyse.fleet import GONE, OFFLINE, ONLINE, Fleet, GpuInfo, free_slices, load_fleet
from ..analyse.idle import idle_gpus
from ..analyse.now import current_state, gpu_equivalents_now, latest_samples
from ..analyse.price_now import prices_now
from ..analyse.states import IDLE, IDLE_HELD, STATES, UNPARTITIONED, Thresholds
from ..analyse.window import Filters
from ..pricing.resolve import Pricer

log = logging.getLogger("gpufleet")

AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("under_1m", 60.0),
    ("under_5m", 300.0),
    ("under_1h", 3600.0),
    ("under_24h", 86400.0),
)
"""Last-seen age buckets of agents: (label, upper bound in s); older ones are `OLDER`."""
OLDER = "over_24h"
INSTANCE_STATUSES = (ONLINE, OFFLINE, GONE)
WASTE_STATES = (IDLE, IDLE_HELD, UNPARTITIONED)
EQUIVALENT_STATES = (*STATES, UNPARTITIONED)

MAX_INSTANCE_TYPES = 50
"""Instance types with their own label value, those with the most GPUs; the rest are `OTHER_TYPES`."""
OTHER_TYPES = "other"
NO_TYPE = "none"
"""Label value of an instance that reported no instance type (on-premises hosts)."""


@dataclass(frozen=True)
class FleetFigures:
    """The fleet at one moment; every key is a label value of a bounded set."""

    agents: dict[str, int]
    """Instances by how long ago their agent last sent data (AGE_BUCKETS, OLDER)."""
    instances: dict[str, int]
    """Instances by status: online, offline, gone."""
    gpus: dict[tuple[str, str], int]
    """GPUs by (instance type label, instance status)."""
    passthrough_gpus: dict[str, int]
    """GPUs not in MIG mode by current state."""
    mig_gpus: int
    mig_slices: dict[str, int]
    """Live MIG slices by current state (offline when their GPU's own data stopped)."""
    gpu_equivalents: dict[str, float]
    """GPUs per current state, slices and free MIG capacity by their share: the overview's "now" column. What the
    sized slices of a GPU with an incomplete layout leave is unknown."""
    idle_gpus: int
    """Passthrough GPUs idle for at least `idle_min_hours`: the overview's "Idle GPUs now"."""
    idle_gpus_usd_per_hour: float
    """What those cost at the price now, USD/h (priced ones only)."""
    waste_usd_per_hour: dict[tuple[str, str], float]
    """Price now per hour of what is idle, idle-held or unpartitioned now, by (instance type label, state),
    USD/h."""
    unpriced_idle_gpu_equivalents: float
    """GPU equivalents idle, idle-held or unpartitioned now that have no price (left out of the dollars)."""


def age_bucket(seconds: float) -> str:
    for label, bound in AGE_BUCKETS:
        if seconds < bound:
            return label
    return OLDER


def type_labels(fleet: Fleet, limit: int = MAX_INSTANCE_TYPES) -> dict[str | None, str]:
    """Label value per instance type of the fleet: the `limit` types with the most GPUs keep their name."""
    per_type: Counter[str | None] = Counter(g.instance.instance_type for g in fleet.gpus.values())
    for inst in fleet.instances.values():
        per_type.setdefault(inst.instance_type, 0)
    ranked = sorted(per_type, key=lambda t: (-per_type[t], t or ""))
    return {t: (t or NO_TYPE) if i < limit else OTHER_TYPES for i, t in enumerate(ranked)}


def idle_shares(fleet: Fleet, states: dict[int, str]) -> Iterator[tuple[GpuInfo, str, float]]:
    """(GPU, state, share of the GPU) of every part of the fleet that is idle, idle-held or unpartitioned now,
    by the rules of `gpu_equivalents_now`: nothing on a MIG GPU whose own data stopped counts, and neither does a
    slice of unknown size (its share, and so its price, is unknown) nor the free capacity of a GPU whose layout
    is not known in full."""
    for pk, gpu in fleet.gpus.items():
        if not gpu.mig_mode:
            if states[pk] in (IDLE, IDLE_HELD):
                yield gpu, states[pk], 1.0
            continue
        if states[pk] == OFFLINE:
            continue
        live = fleet.live_slices(pk)
        for sl in live:
            share = sl.fraction
            if share is not None and states[sl.pk] in (IDLE, IDLE_HELD):
                yield gpu, states[sl.pk], share
        free = free_slices(gpu, live)
        if free:
            yield gpu, UNPARTITIONED, free / 7


def fleet_figures(
    session: Session, *, pricer: Pricer, thresholds: Thresholds, now: datetime, max_types: int = MAX_INSTANCE_TYPES
) -> FleetFigures:
    """The whole fleet's figures at `now`; `max_types` instance types keep their own label value."""
    # Slices retired before now play no part in any figure of the present.
    fleet = load_fleet(session, filters=Filters(), pricer=pricer, thresholds=thresholds, now=now, since=now)
    latest = latest_samples(session, now=now, thresholds=thresholds)
    states = current_state(fleet, latest)
    idle = idle_gpus(session, fleet, latest, now=now, thresholds=thresholds)
    labels = type_labels(fleet, max_types)

    agents = dict.fromkeys([b for b, _ in AGE_BUCKETS] + [OLDER], 0)
    instances = dict.fromkeys(INSTANCE_STATUSES, 0)
    for inst in fleet.instances.values():
        agents[age_bucket((now - inst.last_seen).total_seconds())] += 1
        instances[inst.status] += 1

    gpus: Counter[tuple[str, str]] = Counter()
    passthrough = dict.fromkeys(STATES, 0)
    for pk, gpu in fleet.gpus.items():
        gpus[labels[gpu.instance.instance_type], gpu.instance.status] += 1
        if not gpu.mig_mode:
            passthrough[states[pk]] += 1

    slices = dict.fromkeys(STATES, 0)
    for pk, sl in fleet.slices.items():
        if sl.retired_at is None:
            slices[OFFLINE if states[sl.gpu.pk] == OFFLINE else states[pk]] += 1

    waste: dict[tuple[str, str], float] = {}
    unpriced = 0.0
    shares = list(idle_shares(fleet, states))
    prices = prices_now(session, {gpu.instance.pk: gpu.instance for gpu, _s, _f in shares}.values(), now)
    for gpu, state, share in shares:
        rate = prices[gpu.instance.pk].usd_per_gpu_hour
        if rate is None:
            unpriced += share
            continue
        key = (labels[gpu.instance.instance_type], state)
        waste[key] = waste.get(key, 0.0) + rate * share

    return FleetFigures(
        agents=agents,
        instances=instances,
        gpus=dict(gpus),
        passthrough_gpus=passthrough,
        mig_gpus=sum(1 for g in fleet.gpus.values() if g.mig_mode),
        mig_slices=slices,
        gpu_equivalents={s: 0.0 for s in EQUIVALENT_STATES} | gpu_equivalents_now(fleet, states),
        idle_gpus=len(idle),
        idle_gpus_usd_per_hour=sum(g.usd_per_hour or 0.0 for g in idle),
        waste_usd_per_hour=waste,
        unpriced_idle_gpu_equivalents=unpriced,
    )


def _gauge(name: str, doc: str, values: dict[str, float] | dict[str, int], label: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _gauge2(
    name: str, doc: str, values: dict[tuple[str, str], float] | dict[tuple[str, str], int], labels: list[str]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def fleet_families(f: FleetFigures) -> list[Metric]:
    """The figures as metric families, HELP text included (docs/metrics.md lists them)."""
    return [
        _gauge(
            "gpufleet_agents",
            "Instances by how long ago their agent last sent data: under_1m, under_5m, under_1h, under_24h, over_24h.",
            f.agents,
            "last_seen",
        ),
        _gauge("gpufleet_instances", "Instances by status: online, offline, gone.", f.instances, "status"),
        _gauge2(
            "gpufleet_gpus",
            f"GPUs by instance type (top {MAX_INSTANCE_TYPES} by GPUs, the rest as 'other') and instance status.",
            f.gpus,
            ["instance_type", "status"],
        ),
        _gauge(
            "gpufleet_passthrough_gpus",
            "GPUs not in MIG mode by current state: active, idle-held, idle, unknown, offline.",
            f.passthrough_gpus,
            "state",
        ),
        GaugeMetricFamily("gpufleet_mig_gpus", "GPUs in MIG mode.", value=f.mig_gpus),
        _gauge(
            "gpufleet_mig_slices",
            "Live MIG slices by current state (offline when their GPU's data stopped).",
            f.mig_slices,
            "state",
        ),
        _gauge(
            "gpufleet_gpu_equivalents",
            "GPUs by current state, a MIG slice counting compute slices / 7, free MIG capacity as unpartitioned, "
            "and MIG capacity of unknown size as unknown.",
            f.gpu_equivalents,
            "state",
        ),
        GaugeMetricFamily(
            "gpufleet_idle_gpus",
            "Passthrough GPUs online and idle (or idle-held) for at least GPUFLEET_IDLE_MIN_HOURS.",
            value=f.idle_gpus,
        ),
        GaugeMetricFamily(
            "gpufleet_idle_gpus_usd_per_hour",
            "What the GPUs of gpufleet_idle_gpus cost per hour, USD/h (priced ones).",
            value=f.idle_gpus_usd_per_hour,
        ),
        _gauge2(
            "gpufleet_waste_usd_per_hour",
            "Price per hour of the GPUs, slices and free MIG capacity idle, idle-held or unpartitioned now, USD/h, "
            "by instance type and state.",
            f.waste_usd_per_hour,
            ["instance_type", "state"],
        ),
        GaugeMetricFamily(
            "gpufleet_unpriced_idle_gpu_equivalents",
            "GPU equivalents idle, idle-held or unpartitioned now with no price (not in gpufleet_waste_usd_per_hour).",
            value=f.unpriced_idle_gpu_equivalents,
        ),
    ]


class FleetCollector:
    """Reads the fleet at every collect(). A database failure gives `gpufleet_database_up 0` and a count in
    `gpufleet_database_errors_total{during="scrape"}` instead of an error."""

    def __init__(
        self,
        session: Session,
        *,
        pricer: Pricer,
        thresholds: Thresholds,
        on_database_error: Callable[[], None],
    ) -> None:
        self.session = session
        self.pricer = pricer
        self.thresholds = thresholds
        self.on_database_error = on_database_error

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        families: list[Metric] = []
        try:
            figures = fleet_figures(self.session, pricer=self.pricer, thresholds=self.thresholds, now=datetime.now(UTC))
            families = fleet_families(figures)
            up = 1
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            log.warning("metrics: reading the fleet failed: %s", reason)
            self.session.rollback()
            self.on_database_error()
            up = 0
        yield GaugeMetricFamily(
            "gpufleet_database_up", "1 if the fleet was read from the database for this scrape, else 0.", value=up
        )
        yield GaugeMetricFamily(
            "gpufleet_fleet_read_seconds",
            "Time this scrape took to read the fleet from the database, s.",
            value=time.perf_counter() - started,
        )
        yield from families
