"""Fleet figures for /metrics on constructed fleets, at an explicit `now`: known answers, bounded labels, and the
same split as the overview's `gpu_equivalents_now`."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import load_fleet
from app.analyse.now import current_state, gpu_equivalents_now, latest_samples
from app.analyse.states import IDLE, IDLE_HELD, UNPARTITIONED, Thresholds
from app.analyse.window import Filters
from app.metrics.fleet import (
    NO_TYPE,
    OLDER,
    OTHER_TYPES,
    FleetFigures,
    age_bucket,
    fleet_families,
    fleet_figures,
    idle_shares,
)
from app.pricing.resolve import Pricer
from tests.app.analyse.test_price_now import bill, spot_history
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, SampleFn, busy, held, idle, unknown

H = timedelta(hours=1)
T = Thresholds()


def figures(sessions: sessionmaker[Session], now: datetime, **kw: int) -> FleetFigures:
    with sessions() as session:
        return fleet_figures(session, pricer=Pricer(), thresholds=T, now=now, **kw)


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [
        (-5, "under_1m"),
        (0, "under_1m"),
        (59.9, "under_1m"),
        (60, "under_5m"),
        (299, "under_5m"),
        (300, "under_1h"),
        (3599, "under_1h"),
        (3600, "under_24h"),
        (86399, "under_24h"),
        (86400, OLDER),
    ],
)
def test_age_buckets(seconds: float, bucket: str) -> None:
    assert age_bucket(seconds) == bucket


def test_a_mixed_fleet(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    now = t0 + 2 * H
    feeder.feed([gpu(0), gpu(1)], start=t0, hours=2, fn=idle, instance_id="i-idle")
    feeder.feed([gpu(0)], start=t0, hours=2, fn=held, instance_id="i-held")
    feeder.feed([gpu(0)], start=t0, hours=2, fn=busy(60), instance_id="i-busy", instance_type="g5.xlarge")
    feeder.feed([gpu(0)], start=t0, hours=2, fn=unknown, instance_id="i-unknown", instance_type="g5.xlarge")
    mig = gpu(0, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)
    slices: dict[str, SampleFn] = {mig["uuid"]: idle, mig["slices"][0]["uuid"]: idle, mig["slices"][1]["uuid"]: held}
    feeder.feed([mig], start=t0, hours=2, fn=slices, instance_id="i-mig")
    # Stopped 30 minutes before now: offline, and so are its MIG slices.
    stopped = gpu(0, mig=True, slices=[mig_slice(1, "7g.40gb")], unpartitioned=0)
    feeder.feed([stopped], start=t0, hours=1.5, fn=idle, instance_id="i-stopped")
    # No price for this type: idle, but outside the dollars.
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle, instance_id="i-p5e", instance_type="p5e.48xlarge")

    f = figures(sessions, now)
    assert f.instances == {"online": 6, "offline": 1, "gone": 0}
    assert f.agents == {"under_1m": 6, "under_5m": 0, "under_1h": 1, "under_24h": 0, OLDER: 0}
    assert f.passthrough_gpus == {"active": 1, "idle-held": 1, "idle": 3, "unknown": 1, "offline": 0}
    assert f.mig_gpus == 2
    assert f.mig_slices == {"active": 0, "idle-held": 1, "idle": 1, "unknown": 0, "offline": 1}
    assert f.gpus == {
        ("p4d.24xlarge", "online"): 4,
        ("p4d.24xlarge", "offline"): 1,
        ("g5.xlarge", "online"): 2,
        ("p5e.48xlarge", "online"): 1,
    }
    assert f.idle_gpus == 4  # i-idle x2, i-held, i-p5e: idle for two hours
    assert f.idle_gpus_usd_per_hour == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert f.waste_usd_per_hour == pytest.approx(
        {
            ("p4d.24xlarge", IDLE): (2 + 3 / 7) * P4D_PER_GPU_HOUR,
            ("p4d.24xlarge", IDLE_HELD): (1 + 2 / 7) * P4D_PER_GPU_HOUR,
            ("p4d.24xlarge", UNPARTITIONED): 2 / 7 * P4D_PER_GPU_HOUR,
        }
    )
    assert f.unpriced_idle_gpu_equivalents == 1
    assert f.gpu_equivalents == pytest.approx(
        {
            "active": 1,
            "idle-held": 1 + 2 / 7,
            "idle": 3 + 3 / 7,
            "unknown": 1,
            "offline": 1,
            UNPARTITIONED: 2 / 7,
        }
    )


def test_idle_shares_split_like_the_overview(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    now = t0 + 2 * H
    mig = gpu(1, mig=True, slices=[mig_slice(1), mig_slice(2, "1g.5gb")])
    fns = {mig["slices"][0]["uuid"]: held, mig["slices"][1]["uuid"]: idle, mig["uuid"]: idle}
    feeder.feed([gpu(0), mig], start=t0, hours=2, fn=lambda u, t: fns.get(u, idle)(u, t))
    with sessions() as session:
        fleet = load_fleet(session, filters=Filters(), pricer=Pricer(), thresholds=T, now=now)
        states = current_state(fleet, latest_samples(session, now=now, thresholds=T))
    shares: dict[str, float] = {}
    for _gpu, state, share in idle_shares(fleet, states):
        shares[state] = shares.get(state, 0.0) + share
    overview = gpu_equivalents_now(fleet, states)
    assert shares == pytest.approx({s: overview[s] for s in (IDLE, IDLE_HELD, UNPARTITIONED)})
    assert shares[UNPARTITIONED] == pytest.approx(3 / 7)  # 7 - 3 - 1 compute slices in no slice


def test_instance_types_are_capped(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    story = [("p4d.24xlarge", 3), ("g5.12xlarge", 2), ("g6.xlarge", 1), ("g4dn.xlarge", 1), (None, 1)]
    for i, (itype, n) in enumerate(story):
        lifecycle = "on-prem" if itype is None else "on-demand"
        gpus = [gpu(k) for k in range(n)]
        feeder.feed(gpus, start=t0, hours=1, fn=idle, instance_id=f"i-{i}", instance_type=itype, lifecycle=lifecycle)
    f = figures(sessions, t0 + H, max_types=2)
    assert f.gpus == {("p4d.24xlarge", "online"): 3, ("g5.12xlarge", "online"): 2, (OTHER_TYPES, "online"): 3}
    assert {t for t, _s in f.waste_usd_per_hour} <= {"p4d.24xlarge", "g5.12xlarge", OTHER_TYPES}
    f = figures(sessions, t0 + H)
    assert (NO_TYPE, "online") in f.gpus
    assert len(f.gpus) == 5


def test_an_empty_fleet_still_has_every_series(sessions: sessionmaker[Session], feeder: Feeder) -> None:
    f = figures(sessions, feeder.t0)
    text = _render(f)
    families = {m.name: m for m in text_string_to_metric_families(text)}
    assert len(families["gpufleet_passthrough_gpus"].samples) == 5
    assert len(families["gpufleet_gpu_equivalents"].samples) == 6
    assert len(families["gpufleet_agents"].samples) == 5
    assert families["gpufleet_gpus"].samples == []
    assert families["gpufleet_idle_gpus"].samples[0].value == 0


class _Families:
    def __init__(self, f: FleetFigures) -> None:
        self.families = fleet_families(f)

    def collect(self) -> list[Metric]:
        return self.families


def _render(f: FleetFigures) -> str:
    return generate_latest(_Families(f)).decode()


def test_capacity_of_unknown_size_is_neither_free_nor_priced(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    """An idle 3g slice and an idle slice of unknown size with 2 slices reported free; another GPU whose layout
    is incomplete. Only the 3g slice is priced; what the sized slices leave counts as unknown."""
    t0 = feeder.t0
    now = t0 + 2 * H
    unsized = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    incomplete = dict(gpu(1, mig=True, slices=[mig_slice(1, "4g.20gb")], unpartitioned=3), layout_complete=False)
    feeder.feed([unsized, incomplete], start=t0, hours=2, fn=idle, instance_id="i-mig")

    f = figures(sessions, now)
    assert f.waste_usd_per_hour == pytest.approx({("p4d.24xlarge", IDLE): (3 / 7 + 4 / 7) * P4D_PER_GPU_HOUR})
    assert f.unpriced_idle_gpu_equivalents == 0
    assert f.gpu_equivalents == pytest.approx(
        {"active": 0, "idle-held": 0, "idle": 1, "unknown": 1, "offline": 0, UNPARTITIONED: 0}
    )
    assert f.mig_slices["idle"] == 3  # the unsized slice is still a slice, counted by state


def test_dollars_per_hour_are_at_the_price_now(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    """Idle GPUs billed at $40/h ($5 per GPU-hour), an idle spot g5 whose pool is at $0.30/h (its catalog price is
    $1.006/h) and a MIG GPU billed at $56/h with a held 3g slice and 4 compute slices free."""
    t0 = feeder.t0
    now = t0 + 2 * H
    feeder.feed([gpu(0), gpu(1)], start=t0, hours=2, fn=idle, instance_id="i-billed")
    spot = {"instance_type": "g5.xlarge", "lifecycle": "spot", "availability_zone": "us-east-1b"}
    feeder.feed([gpu(0, name="NVIDIA A10G")], start=t0, hours=2, fn=idle, instance_id="i-spot", **spot)
    mig = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    feeder.feed([mig], start=t0, hours=2, fn={mig["uuid"]: idle, mig["slices"][0]["uuid"]: held}, instance_id="i-mig")
    bill(sessions, "i-billed", [t0, t0 + H, t0 + 2 * H], 40.0)
    bill(sessions, "i-mig", [t0, t0 + H, t0 + 2 * H], 56.0)
    spot_history(sessions, [(t0 - 24 * H, 0.30)])

    f = figures(sessions, now)
    assert f.idle_gpus == 3
    assert f.idle_gpus_usd_per_hour == pytest.approx(2 * 5.0 + 0.30)
    assert f.waste_usd_per_hour == pytest.approx(
        {
            ("p4d.24xlarge", IDLE): 2 * 5.0,
            ("g5.xlarge", IDLE): 0.30,
            ("p4d.24xlarge", IDLE_HELD): 3 / 7 * 7.0,
            ("p4d.24xlarge", UNPARTITIONED): 4 / 7 * 7.0,
        }
    )
    families = {m.name: m for m in text_string_to_metric_families(_render(f))}
    assert families["gpufleet_idle_gpus_usd_per_hour"].samples[0].value == pytest.approx(10.30)
