"""Chart series: the source follows the window, and missing data stays missing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.series import device_series, series_step
from app.analyse.window import Window
from app.models import Gpu
from tests.app.analyse.conftest import Feeder, busy
from tests.factories import gpu

H = timedelta(hours=1)


def window(start: datetime, hours: float) -> Window:
    return Window(start=start, end=start + timedelta(hours=hours), now=start + timedelta(hours=hours), label="t")


def test_step_follows_the_window(feeder: Feeder) -> None:
    t0 = feeder.t0
    assert series_step(window(t0, 1), 10.0) == 10
    assert series_step(window(t0, 1), 30.0) == 30
    assert series_step(window(t0, 6), 10.0) == 300
    assert series_step(window(t0, 24), 10.0) == 300
    assert series_step(window(t0, 24 * 7), 10.0) == 3600


def test_points_and_gaps_from_each_source(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    g = [gpu(0)]

    def util(uid: str, t: datetime) -> dict[str, object] | None:
        # 40% for the first hour, nothing for 30 minutes, then 80%.
        if t0 + H <= t < t0 + 1.5 * H:
            return None
        return busy(40 if t < t0 + H else 80)(uid, t)

    feeder.feed(g, start=t0, hours=2, step_s=60, fn=util)
    with sessions() as s:
        gpu_id = s.execute(select(Gpu.id)).scalar_one()
        raw = device_series(s, [gpu_id], window(t0, 1), step_s=60)[gpu_id]
        assert len(raw) == 60 and set(raw.util) == {40.0}
        five = device_series(s, [gpu_id], window(t0, 2), step_s=300)[gpu_id]
        # 12 buckets in the first hour, none in the gap, 6 after it.
        assert len(five) == 18
        assert all(u == pytest.approx(40.0) for u in five.util[:12])
        assert five.ts[12] == t0 + 1.5 * H and five.util[12] == pytest.approx(80.0)
        hourly = device_series(s, [gpu_id], window(t0, 2), step_s=3600)[gpu_id]
        assert [round(u or 0, 3) for u in hourly.util] == [40.0, 80.0]
        assert hourly.mem_used_mib[1] == pytest.approx(20000)
