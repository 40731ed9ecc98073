"""Money per device over whole days whose price changes inside the day (app/analyse/device_money.py): such a day is
read hour by hour once, kept, and read again when its data or its prices change."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.device_money import MixedDays, usage_and_money
from app.analyse.figures import GPU, SLICE
from app.analyse.price_classes import price_classes
from app.analyse.series_prices import load_pieces
from app.analyse.states import UNPARTITIONED
from app.analyse.window import Window, floor_day
from app.billing.tables import spot_prices
from app.db import session_scope
from tests.app.analyse.conftest import Analyst, Feeder, busy, held, idle
from tests.factories import gpu, mig_slice
from tests.feeding import ANA

H = timedelta(hours=1)
SPOT = "i-0d00000000000000d"
POOL = {"instance_type": "g5.xlarge", "availability_zone": "us-east-1b"}


def _feed(feeder: Feeder, start: datetime, hours: float, *, by_ana: bool = False) -> None:
    feeder.feed(
        [gpu(0, name="NVIDIA A10G")],
        start=start,
        hours=hours,
        step_s=600.0,
        fn=(lambda u, t: {**held(u, t), "holders": [{"ref": 0, "used_mib": 30000}]}) if by_ana else idle,
        holders=[ANA] if by_ana else None,
        instance_id=SPOT,
        instance_type="g5.xlarge",
        lifecycle="spot",
        availability_zone="us-east-1b",
    )


def _price(sessions: sessionmaker[Session], at: datetime, usd: float) -> None:
    with session_scope(sessions) as s:
        s.execute(insert(spot_prices).values(**POOL, ts=at, usd_per_hour=usd))


def _pool(sessions: sessionmaker[Session], d0: datetime) -> None:
    """$0.40/h, $0.70/h from d0 10:30, $0.55/h from d0 + 1 day 06:00: both days have two prices."""
    _price(sessions, d0 - 24 * H, 0.40)
    _price(sessions, d0 + 10.5 * H, 0.70)
    _price(sessions, d0 + 30 * H, 0.55)


@pytest.fixture
def d0(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """A spot g5.xlarge idle from midnight d0 for 36 hours, its pool's price changing on both days."""
    d0 = floor_day(feeder.t0) - 2 * timedelta(days=1)
    _feed(feeder, d0, 36)
    _pool(sessions, d0)
    return d0


def test_days_with_two_prices_are_priced_hour_by_hour(analyst: Analyst, d0: datetime) -> None:
    # 10 h at 0.40, the hour of the change at their mean, 19 h at 0.70, 6 h at 0.55.
    cost = 10 * 0.40 + 0.55 + 19 * 0.70 + 6 * 0.55
    for _ in range(2):  # the second time from what the first kept
        a = analyst.waste(d0, d0 + 48 * H)
        assert a.totals.gpu_hours == pytest.approx(36)
        assert a.totals.cost == pytest.approx(cost) and a.totals.waste == pytest.approx(cost)
        (row,) = a.group("instance")
        assert row.source_shares == {"spot history": 1.0}


def test_a_kept_day_is_read_again_when_its_data_or_prices_change(
    analyst: Analyst, feeder: Feeder, sessions: sessionmaker[Session], d0: datetime
) -> None:
    analyst.waste(d0, d0 + 48 * H)
    _feed(feeder, d0 + 36 * H, 12)  # the rest of the second day
    a = analyst.waste(d0, d0 + 48 * H)
    assert a.totals.gpu_hours == pytest.approx(48)
    assert a.totals.cost == pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 18 * 0.55)
    _price(sessions, d0 + 42 * H, 1.0)  # a price read later, inside the second day
    a = analyst.waste(d0, d0 + 48 * H)
    assert a.totals.cost == pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 12 * 0.55 + 6 * 1.0)


def test_the_hours_of_a_kept_day_are_read_once(analyst: Analyst, sessions: sessionmaker[Session], d0: datetime) -> None:
    window = Window(start=d0, end=d0 + 48 * H, now=d0 + 48 * H, label="test")
    memo = MixedDays()
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        pieces = load_pieces(session, fleet, window.start, window.end)
        classes = price_classes(fleet, pieces)
        devices = {g.pk: g.instance.pk for g in fleet.gpus.values()}
        assert len(classes.mixed) == 2  # both days cut by a price change
        reads = window.rollup_reads()
        _usage, first = usage_and_money(session, devices, classes, reads, idle_util_pct=5, device_ids=None, memo=memo)
        assert len(memo) == 2
        _usage, again = usage_and_money(session, devices, classes, reads, idle_util_pct=5, device_ids=None, memo=memo)
    assert again == first
    (money,) = first.values()
    assert money.spot_s == pytest.approx(36 * 3600)
    assert money.spot_usd == pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 6 * 0.55)


def test_a_holder_pays_each_hour_of_a_cut_day_at_its_price(
    analyst: Analyst, feeder: Feeder, sessions: sessionmaker[Session]
) -> None:
    """Three days of ana's process holding the GPU idle: two cut by a price change, read hour by hour, and a third at
    one price, read from its daily row."""
    d0 = floor_day(feeder.t0) - 3 * timedelta(days=1)
    _feed(feeder, d0, 60, by_ana=True)
    _pool(sessions, d0)
    cost = 10 * 0.40 + 0.55 + 19 * 0.70 + 18 * 0.55 + 12 * 0.55
    for names in (["user"], ["instance_type", "user"]):
        a = analyst.waste(d0, d0 + 72 * H, by_holder=True, holder_groups=names)
        (ana,) = [r for r in a.group_by(names) if r.label.endswith("ana")]
        assert ana.figures.gpu_hours == pytest.approx(60)
        assert ana.figures.cost == pytest.approx(cost) and ana.figures.idle_held_cost == pytest.approx(cost)
        assert ana.source_shares == {"spot history": 1.0}


def test_a_gpu_whose_mig_mode_changed_pays_each_mode_its_hours_prices(
    analyst: Analyst, feeder: Feeder, sessions: sessionmaker[Session]
) -> None:
    """A spot p4d's GPU: an hour in passthrough at 80 % while its pool costs $8/h, then an hour in MIG mode with one
    3g slice busy while it costs $16/h: each part pays its own hour, per GPU (8 GPUs)."""
    t0, uid = feeder.t0, "GPU-switched"
    pool = {"instance_type": "p4d.24xlarge", "lifecycle": "spot", "availability_zone": "us-east-1b"}
    feeder.feed([gpu(0, uid=uid)], start=t0, hours=1, fn=busy(80), **pool)
    on = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    feeder.feed([on], start=t0 + H, hours=1, fn=busy(50), **pool)
    with session_scope(sessions) as s:
        for at, usd in ((t0 - 24 * H, 8.0), (t0 + H, 16.0)):
            s.execute(
                insert(spot_prices).values(
                    instance_type="p4d.24xlarge", availability_zone="us-east-1b", ts=at, usd_per_hour=usd
                )
            )
    a = analyst.waste(t0, t0 + 2 * H)
    cost = {u.kind: u.figures().cost for u in a.units}
    assert cost[GPU] == pytest.approx(1.0)
    assert cost[SLICE] == pytest.approx(3 / 7 * 2.0) and cost[UNPARTITIONED] == pytest.approx(4 / 7 * 2.0)
    assert a.totals.unpartitioned_cost == pytest.approx(4 / 7 * 2.0)
    assert a.totals.active_h == pytest.approx(1 + 3 / 7)
