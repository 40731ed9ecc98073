"""MIG GPUs priced where the bill knows the price: free capacity per hour at the price now, a slice's hours with no
process at the prices in force over the window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.mig import MigGpuView, mig_gpus, mig_instances, underused_slices, unpartitioned
from app.analyse.now import current_state, latest_samples
from app.analyse.price_now import prices_now
from app.analyse.waste import analyse_waste
from app.analyse.window import Window
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, idle, unknown
from tests.app.analyse.test_price_now import bill
from tests.factories import gpu, mig_slice

H = timedelta(hours=1)


def mig_fleet(feeder: Feeder) -> None:
    """A p4d GPU in MIG mode for four hours from t0: a 3g slice that never has a process, 4 compute slices free."""
    node = gpu(0, uid="GPU-mig", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-a")], unpartitioned=4)
    feeder.feed([node], start=feeder.t0, hours=4, fn={"GPU-mig": idle, "MIG-a": unknown}, instance_id="i-mig")


def views(analyst: Analyst, sessions: sessionmaker[Session], feeder: Feeder) -> list[MigGpuView]:
    t0 = feeder.t0
    window = Window(start=t0, end=t0 + 4 * H, now=t0 + 4 * H, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        analysis = analyse_waste(session, fleet, window, analyst.thresholds)
        states = current_state(fleet, latest_samples(session, now=window.now, thresholds=analyst.thresholds))
        return mig_gpus(analysis, states, prices_now(session, mig_instances(fleet), window.now))


def test_at_its_own_price(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    mig_fleet(feeder)
    [v] = views(analyst, sessions, feeder)
    assert v.free_usd_per_hour == pytest.approx(P4D_PER_GPU_HOUR * 4 / 7)
    assert v.price.source == "catalog"
    [s] = underused_slices([v])
    assert s.no_process_cost == pytest.approx(4 * P4D_PER_GPU_HOUR * 3 / 7)
    assert s.usd_per_hour == pytest.approx(P4D_PER_GPU_HOUR * 3 / 7)


def test_priced_by_the_bill(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    mig_fleet(feeder)
    # Its first two hours billed at $56/h, $7 per GPU-hour; the last two not billed yet (the catalog's price).
    bill(sessions, "i-mig", [t0, t0 + H], 56.0)
    [v] = views(analyst, sessions, feeder)
    # Now: the newest billed hour.
    assert v.free_usd_per_hour == pytest.approx(7.0 * 4 / 7)
    assert v.price.source == "billed" and v.price.usd_per_gpu_hour == pytest.approx(7.0)
    assert unpartitioned([v]) == [v]
    [s] = underused_slices([v])
    assert s.slot.reason == "no process all window"
    assert s.no_process_cost == pytest.approx((2 * 7.0 + 2 * P4D_PER_GPU_HOUR) * 3 / 7)
    assert s.no_process_cost == pytest.approx(s.unit.figures().cost)
    assert s.usd_per_hour == pytest.approx(7.0 * 3 / 7)
