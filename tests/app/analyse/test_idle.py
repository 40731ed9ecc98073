"""The idle passthrough GPU list: since when, hours idle, dollars burned and per day."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.idle import IdleGpu, idle_gpus
from app.analyse.now import latest_samples
from app.analyse.window import Window
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, busy, held, idle
from tests.app.analyse.test_price_now import bill, spot_history
from tests.factories import gpu

H = timedelta(hours=1)


def idle_list(analyst: Analyst, sessions: sessionmaker[Session], now: datetime) -> list[IdleGpu]:
    window = Window(start=now - 24 * H, end=now, now=now, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        latest = latest_samples(session, now=now, thresholds=analyst.thresholds)
        return idle_gpus(session, fleet, latest, now=now, thresholds=analyst.thresholds)


def first_busy_then(rest: Any, t_switch: datetime) -> Any:
    def fn(uid: str, t: datetime) -> dict[str, Any]:
        return busy(70)(uid, t) if t < t_switch else rest(uid, t)

    return fn


def test_idle_since_the_last_busy_interval(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    # Busy until 20 minutes past the first hour (one-minute intervals), idle since.
    switch = t0 + H + timedelta(minutes=20)
    feeder.feed([gpu(0, uid="GPU-idle")], start=t0, hours=3, fn=first_busy_then(idle, switch))
    now = t0 + 3 * H
    [g] = idle_list(analyst, sessions, now)
    assert g.since == switch
    assert g.idle_hours == pytest.approx(100 / 60)
    assert g.burned_usd == pytest.approx(100 / 60 * P4D_PER_GPU_HOUR)
    assert g.usd_per_day == pytest.approx(24 * P4D_PER_GPU_HOUR)
    assert g.price_source == "catalog" and g.burned_sources == ("catalog",)
    assert g.state == "idle"


def test_idle_held_gpu_is_listed_as_held(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=held)
    [g] = idle_list(analyst, sessions, t0 + 2 * H)
    assert g.state == "idle-held"
    assert g.held_s == pytest.approx(2 * 3600)
    assert g.since == t0


def test_short_idle_spells_are_not_listed(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    # Busy until 30 minutes before now: idle for half an hour only.
    feeder.feed([gpu(0)], start=t0, hours=3, fn=first_busy_then(idle, t0 + 2.5 * H))
    assert idle_list(analyst, sessions, t0 + 3 * H) == []


def test_busy_gpus_and_mig_gpus_are_not_listed(
    feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]
) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=busy(90), instance_id="i-busy")
    feeder.feed([gpu(0, mig=True, unpartitioned=7)], start=t0, hours=2, fn=idle, instance_id="i-mig")
    assert idle_list(analyst, sessions, t0 + 2 * H) == []


def test_offline_instances_are_not_idle(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle)
    # Ten minutes after the last sample the instance is offline, not idle.
    assert idle_list(analyst, sessions, t0 + 2 * H + timedelta(minutes=10)) == []


def test_an_offline_gap_inside_a_stretch_is_not_counted(
    feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]
) -> None:
    t0 = feeder.t0
    g = [gpu(0)]
    feeder.feed(g, start=t0, hours=1, fn=idle)
    feeder.feed(g, start=t0 + 2 * H, hours=2, fn=idle)
    [found] = idle_list(analyst, sessions, t0 + 4 * H)
    assert found.since == t0  # never busy: idle since first seen
    assert found.idle_hours == pytest.approx(3.0)
    assert found.burned_usd == pytest.approx(3 * P4D_PER_GPU_HOUR)


def test_no_price_gives_no_dollars(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle, instance_type="p5e.48xlarge")
    [g] = idle_list(analyst, sessions, t0 + 2 * H)
    assert g.burned_usd is None and g.usd_per_day is None
    assert g.idle_hours == pytest.approx(2.0)


def test_burned_dollars_follow_the_bill_across_a_price_change(
    feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]
) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=4, fn=idle, instance_id="i-billed")
    # Two hours at the catalog price (not billed yet), then two billed at $16/h: $2 per GPU-hour.
    bill(sessions, "i-billed", [t0 + 2 * H, t0 + 3 * H], 16.0)
    [g] = idle_list(analyst, sessions, t0 + 4 * H)
    assert g.idle_hours == pytest.approx(4.0)
    assert g.burned_usd == pytest.approx(2 * P4D_PER_GPU_HOUR + 2 * 2.0)
    assert g.burned_sources == ("catalog", "billed")
    # Now is not billed yet: the newest billed hour stands for it.
    assert g.usd_per_hour == pytest.approx(2.0) and g.price_source == "billed"
    assert g.usd_per_day == pytest.approx(48.0)


def test_a_spot_gpu_is_priced_at_its_pool_hour_by_hour(
    feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]
) -> None:
    t0 = feeder.t0
    spot = {"instance_type": "g5.xlarge", "lifecycle": "spot", "availability_zone": "us-east-1b"}
    feeder.feed([gpu(0, name="NVIDIA A10G")], start=t0, hours=3, fn=idle, instance_id="i-spot", **spot)
    spot_history(sessions, [(t0 - 24 * H, 0.40), (t0 + 1.5 * H, 0.50)])
    [g] = idle_list(analyst, sessions, t0 + 3 * H)
    # $0.40, then an hour half at each price, then $0.50; the catalog's $1.006 nowhere.
    assert g.burned_usd == pytest.approx(0.40 + 0.45 + 0.50)
    assert g.burned_sources == ("spot history",)
    assert g.usd_per_hour == pytest.approx(0.50) and g.price_source == "spot history"
    assert g.usd_per_day == pytest.approx(24 * 0.50)
