"""What a holder held on the days a price change cuts (app/analyse/held_days.py): read hour by hour once, kept, and
read again when the day's rows or its prices change; the grouping by user pays each hour at its price either way."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.held_days import HeldDays, held_days
from app.analyse.price_classes import price_classes
from app.analyse.series_prices import load_pieces
from app.analyse.window import Window, floor_day
from app.db import session_scope
from tests.app.analyse.conftest import Analyst, Feeder
from tests.app.analyse.test_device_money import _feed, _pool, _price

H = timedelta(hours=1)


@pytest.fixture
def d0(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """ana's process holds a spot g5.xlarge's GPU idle for 60 hours from midnight d0; its pool's price changes on
    the first two days, not on the third."""
    d0 = floor_day(feeder.t0) - 3 * timedelta(days=1)
    _feed(feeder, d0, 60, by_ana=True)
    _pool(sessions, d0)
    return d0


def _ana_cost(analyst: Analyst, d0: datetime) -> float:
    a = analyst.waste(d0, d0 + 72 * H, by_holder=True, holder_groups=["user"])
    (ana,) = [r for r in a.group_by(["user"]) if r.label.endswith("ana")]
    assert ana.figures.gpu_hours == pytest.approx(60)
    return ana.figures.cost


def test_a_price_change_inside_a_kept_day_is_paid_from_then(
    analyst: Analyst, sessions: sessionmaker[Session], d0: datetime
) -> None:
    first = 10 * 0.40 + 0.55 + 19 * 0.70 + 18 * 0.55 + 12 * 0.55
    assert _ana_cost(analyst, d0) == pytest.approx(first)
    assert _ana_cost(analyst, d0) == pytest.approx(first)  # the cut days as kept
    _price(sessions, d0 + 42 * H, 1.0)  # the second day now has three prices, the third a new one
    assert _ana_cost(analyst, d0) == pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 12 * 0.55 + 6 * 1.0 + 12 * 1.0)


def test_a_cut_day_is_read_once_and_again_when_its_rows_change(
    analyst: Analyst, sessions: sessionmaker[Session], d0: datetime
) -> None:
    window = Window(start=d0, end=d0 + 72 * H, now=d0 + 72 * H, label="test")
    memo = HeldDays()

    def read() -> dict[tuple[int, int], float]:
        with sessions() as session:
            fleet = analyst.fleet(session, window)
            classes = price_classes(fleet, load_pieces(session, fleet, window.start, window.end))
            days = sorted(classes.mixed)
            assert len(days) == 2  # the first two days
            found = held_days(session, "user", days, classes, idle_util_pct=5, memo=memo)
        return {day: sum(h.secs_w for h in hours) / 3600 for day, hours in found.items()}

    assert list(read().values()) == [pytest.approx(24), pytest.approx(24)]
    assert len(memo) == 2
    with session_scope(sessions) as s:
        s.execute(text("DELETE FROM holder_groups_hourly"))
    assert list(read().values()) == [pytest.approx(24), pytest.approx(24)]  # kept: the hours are not read again
    with session_scope(sessions) as s:
        # A new version of the first day's daily rows, as a late batch would write.
        s.execute(text("UPDATE holder_groups_daily SET secs_w = secs_w WHERE day = :d"), {"d": d0})
    assert list(read().values()) == [pytest.approx(24)]  # the first day read again: its hours are gone


def test_a_late_batch_for_a_day_before_today_is_counted(analyst: Analyst, feeder: Feeder, d0: datetime) -> None:
    def held_h() -> float:
        a = analyst.waste(d0, d0 + 72 * H, now=d0 + 80 * H, by_holder=True, holder_groups=["user"])
        (ana,) = [r for r in a.group_by(["user"]) if r.label.endswith("ana")]
        return ana.figures.gpu_hours

    assert held_h() == pytest.approx(60)
    assert held_h() == pytest.approx(60)  # the days before today, kept
    _feed(feeder, d0 + 60 * H, 2, by_ana=True)
    assert held_h() == pytest.approx(62)
