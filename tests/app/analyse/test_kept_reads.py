"""What a window's rollup rows before today sum to (app/analyse/kept_reads.py): read once, kept while those rows and
their prices stay the same, read again after a late write or a new price; today's rows read on every view."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.kept_reads import KeptReads, kept_usage_and_money, split_reads
from app.analyse.price_classes import price_classes
from app.analyse.priced import pieces_in_use, priced_devices
from app.analyse.series_prices import load_pieces
from app.analyse.timeline import window_totals
from app.analyse.window import DAILY, HOURLY, RollupRead, Window, floor_day
from app.db import session_scope
from tests.app.analyse.conftest import Analyst, Feeder
from tests.app.analyse.test_device_money import _feed, _pool, _price

H = timedelta(hours=1)
D0 = datetime(2026, 11, 20, tzinfo=UTC)


def test_reads_are_cut_at_midnight() -> None:
    today = D0 + 2 * 24 * H
    reads = [
        RollupRead(DAILY, D0, today + 24 * H, 1),
        RollupRead(HOURLY, D0, D0 + 6 * H, -1),
        RollupRead(HOURLY, today + 20 * H, today + 24 * H, -1),
    ]
    before, after = split_reads(reads, today)
    assert before == [RollupRead(DAILY, D0, today, 1), RollupRead(HOURLY, D0, D0 + 6 * H, -1)]
    assert after == [
        RollupRead(DAILY, today, today + 24 * H, 1),
        RollupRead(HOURLY, today + 20 * H, today + 24 * H, -1),
    ]
    assert split_reads(reads[1:2], today) == (reads[1:2], [])


@pytest.fixture
def d0(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """A spot g5.xlarge idle from midnight d0 for 36 hours, its pool's price changing on both days; today is the
    third day."""
    d0 = floor_day(feeder.t0) - 2 * timedelta(days=1)
    _feed(feeder, d0, 36)
    _pool(sessions, d0)
    return d0


class Sums(NamedTuple):
    hours: float
    """Hours with data, h."""
    spot_usd: float
    devices: int


def _read(analyst: Analyst, sessions: sessionmaker[Session], d0: datetime, kept: KeptReads) -> Sums:
    window = Window(start=d0, end=d0 + 72 * H, now=d0 + 51 * H, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        pieces = pieces_in_use(fleet, load_pieces(session, fleet, window.start, window.end))
        classes = price_classes(fleet, pieces)
        usage, money = kept_usage_and_money(
            session,
            priced_devices(fleet, pieces),
            classes,
            window.rollup_reads(),
            idle_util_pct=5,
            device_ids=None,
            now=window.now,
            kept=kept,
        )
    return Sums(sum(u.covered_s for u in usage.values()) / 3600, sum(m.spot_usd for m in money.values()), len(usage))


def _touch(sessions: sessionmaker[Session], day: datetime) -> None:
    """A new version of the day's daily rows, their figures unchanged: as a write to them would leave them."""
    with session_scope(sessions) as s:
        s.execute(text("UPDATE rollups_daily SET secs = secs WHERE day = :day"), {"day": day})


def test_days_before_today_are_read_once_while_their_rows_and_prices_stay(
    analyst: Analyst, feeder: Feeder, sessions: sessionmaker[Session], d0: datetime
) -> None:
    kept = KeptReads()
    first = _read(analyst, sessions, d0, kept)
    assert first == (pytest.approx(36), pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 6 * 0.55), 1)
    assert len(kept) == 1
    assert _read(analyst, sessions, d0, kept) == first
    assert len(kept) == 1  # the same days, kept

    _touch(sessions, d0 + 24 * H)  # yesterday's row written again
    assert _read(analyst, sessions, d0, kept) == first
    assert len(kept) == 2  # read again

    _price(sessions, d0 + 32 * H, 1.0)  # a price read later, from yesterday afternoon on
    assert _read(analyst, sessions, d0, kept).spot_usd == pytest.approx(first.spot_usd + 4 * (1.0 - 0.55))
    assert len(kept) == 3

    _feed(feeder, d0 + 40 * H, 10)  # a late batch: yesterday evening and today's first two hours
    later = _read(analyst, sessions, d0, kept)
    assert later.hours == pytest.approx(46) and later.spot_usd == pytest.approx(first.spot_usd + 4 * 0.45 + 10)
    n = len(kept)
    _touch(sessions, d0 + 48 * H)  # today's row: read on every view, the days before stay kept
    assert _read(analyst, sessions, d0, kept) == later
    assert len(kept) == n


def test_window_totals_follow_a_late_write_to_a_day_before_today(
    analyst: Analyst, feeder: Feeder, sessions: sessionmaker[Session], d0: datetime
) -> None:
    window = Window(start=d0, end=d0 + 72 * H, now=d0 + 50 * H, label="test")

    def totals() -> tuple[float, float]:
        with sessions() as session:
            found = window_totals(session, analyst.fleet(session, window), window, thresholds=analyst.thresholds)
        return found.gpu_hours, found.cost

    first = totals()
    assert first == (pytest.approx(36), pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 6 * 0.55))
    assert totals() == first
    _feed(feeder, d0 + 40 * H, 2)
    assert totals() == (pytest.approx(38), pytest.approx(10 * 0.40 + 0.55 + 19 * 0.70 + 8 * 0.55))


def test_the_least_recently_used_go_first_past_either_bound() -> None:
    kept = KeptReads(limit=3, rows=100)
    kept.put("a", 1, 40)
    kept.put("b", 2, 40)
    assert kept.get("a") == 1  # now the most recent
    kept.put("c", 3, 40)  # 120 rows: the least recently used, b, goes
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (1, None, 3)
    kept.put("d", 4, 1)
    kept.put("e", 5, 1)  # four results: a, the least recently used now, goes
    assert [kept.get(k) for k in "acde"] == [None, 3, 4, 5]
    kept.put("f", 6, 101)  # larger than the whole bound: not kept, nothing dropped
    assert kept.get("f") is None and len(kept) == 3
