"""Waste by hour of the week, on constructed data worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.analyse.hour_of_week import HourOfWeek, clock_hours, waste_by_hour_of_week
from app.analyse.states import Thresholds
from app.analyse.window import Window
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, busy, held, idle
from tests.factories import gpu, mig_slice

H = timedelta(hours=1)
RATE = P4D_PER_GPU_HOUR


def last_monday_2am(now: datetime) -> datetime:
    """The latest Monday 02:00 UTC with two whole hours after it before `now`."""
    t = now.replace(minute=0, second=0, microsecond=0, hour=2) - timedelta(days=now.weekday())
    return t if t + 2 * H <= now else t - timedelta(days=7)


def grid(analyst: Analyst, sessions: Any, start: datetime, end: datetime, now: datetime, **kw: Any) -> HourOfWeek:
    window = Window(start=start, end=end, now=now, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        t = kw.get("thresholds", analyst.thresholds)
        return waste_by_hour_of_week(session, fleet, start=start, end=end, now=now, thresholds=t)


def test_clock_hours_count_each_hour_of_the_week() -> None:
    monday = datetime(2026, 1, 5, tzinfo=UTC)
    hours = clock_hours(monday, monday + timedelta(days=8))
    assert hours[0] == [2] * 24
    assert all(hours[d] == [1] * 24 for d in range(1, 7))
    # A partial hour counts: it can hold data.
    hours = clock_hours(monday + timedelta(hours=5), monday + timedelta(hours=6, minutes=30))
    assert hours[0][5] == hours[0][6] == 1 and sum(map(sum, hours)) == 2


def test_waste_lands_in_its_hour_of_the_week(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    m = last_monday_2am(datetime.now(UTC))
    assert m.weekday() == 0 and m.hour == 2
    sliced = gpu(1, mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")], unpartitioned=4)
    # 02:00: one GPU idle, the other busy, and 4/7 of an A100 unpartitioned next to a busy 3g slice.
    feeder.feed(
        [gpu(0, uid="GPU-a"), gpu(2, uid="GPU-b"), sliced],
        start=m,
        hours=1,
        fn={"GPU-a": idle, "GPU-b": busy(80), sliced["uuid"]: idle, "MIG-3g": busy(60)},
        instance_id="i-a",
    )
    # 03:00: GPU-a busy, GPU-b held (idle-held counts as waste).
    feeder.feed(
        [gpu(0, uid="GPU-a"), gpu(2, uid="GPU-b")],
        start=m + H,
        hours=1,
        fn={"GPU-a": busy(80), "GPU-b": held},
        instance_id="i-a",
    )
    # No price: no dollars, whatever its state.
    feeder.feed([gpu(0)], start=m, hours=2, fn=idle, instance_type="p5e.48xlarge", instance_id="i-unpriced")
    g = grid(analyst, sessions, m - 2 * H, m + 4 * H, now=m + 2 * H)
    assert g.usd[0][2] == pytest.approx(RATE + 4 / 7 * RATE)
    assert g.usd[0][3] == pytest.approx(RATE)
    assert g.total == pytest.approx(2 * RATE + 4 / 7 * RATE)
    # Hours of the window up to now: Monday 00:00 to 04:00.
    assert g.hours[0][:6] == [1, 1, 1, 1, 0, 0] and sum(map(sum, g.hours)) == 4
    assert g.mean(0, 3) == pytest.approx(RATE) and g.mean(0, 4) is None


def test_a_threshold_with_no_rollup_bound_raises(analyst: Analyst, sessions: Any) -> None:
    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match="rollup bound"):
        grid(analyst, sessions, t0, t0 + H, now=t0 + H, thresholds=Thresholds(idle_util_pct=3))
