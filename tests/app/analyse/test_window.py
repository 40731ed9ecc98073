"""Windows: presets, and the rollup rows that make them up."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.analyse.window import DAILY, DAY, HOUR, HOURLY, RollupRead
from app.params import parse_window

NOW = datetime(2026, 11, 21, 14, 25, 10, tzinfo=UTC)


def test_hour_presets_end_after_the_current_hour() -> None:
    w = parse_window("24h", None, None, now=NOW)
    assert w.end == datetime(2026, 11, 21, 15, tzinfo=UTC)
    assert w.start == w.end - DAY
    assert w.is_live
    assert w.hours == pytest.approx(24 - (35 * 60 - 10) / 3600 + 0)  # up to now, not to the hour's end


def test_day_presets_start_at_midnight_and_read_daily_rows_only() -> None:
    for name, days in (("7d", 7), ("30d", 30)):
        w = parse_window(name, None, None, now=NOW)
        assert w.start == datetime(2026, 11, 21, tzinfo=UTC) - (days - 1) * DAY
        assert w.rollup_reads() == [RollupRead(DAILY, w.start, datetime(2026, 11, 22, tzinfo=UTC), 1)]


def test_a_day_read_as_two_daily_rows_less_the_early_hours() -> None:
    # 15:00 yesterday to 15:00 today: yesterday's last 9 hours, and today's row (the data so far).
    w = parse_window("24h", None, None, now=NOW)
    yesterday = datetime(2026, 11, 20, tzinfo=UTC)
    assert w.rollup_reads() == [
        RollupRead(DAILY, yesterday + DAY, yesterday + 2 * DAY, 1),
        RollupRead(HOURLY, yesterday + 15 * HOUR, yesterday + DAY, 1),
    ]
    late = parse_window("24h", None, None, now=NOW.replace(hour=2))
    # 03:00 yesterday onwards: 21 hours of yesterday inside, so its row minus 3 hours.
    assert late.rollup_reads() == [
        RollupRead(DAILY, yesterday, yesterday + 2 * DAY, 1),
        RollupRead(HOURLY, yesterday, yesterday + 3 * HOUR, -1),
    ]
    early = parse_window("24h", None, None, now=NOW.replace(hour=20))
    # 21:00 yesterday onwards: only 3 hours of yesterday, read as hours.
    assert early.rollup_reads() == [
        RollupRead(DAILY, datetime(2026, 11, 21, tzinfo=UTC), datetime(2026, 11, 22, tzinfo=UTC), 1),
        RollupRead(HOURLY, yesterday + 21 * HOUR, datetime(2026, 11, 21, tzinfo=UTC), 1),
    ]


def test_a_closed_window_in_the_past_uses_hours_at_its_edges() -> None:
    w = parse_window(None, "2026-11-10T06:30:00Z", "2026-11-13T03:00:00+00:00", now=NOW)
    assert w.start == datetime(2026, 11, 10, 6, tzinfo=UTC)
    assert w.rollup_reads() == [
        RollupRead(DAILY, datetime(2026, 11, 10, tzinfo=UTC), datetime(2026, 11, 13, tzinfo=UTC), 1),
        RollupRead(HOURLY, datetime(2026, 11, 13, tzinfo=UTC), datetime(2026, 11, 13, 3, tzinfo=UTC), 1),
        RollupRead(HOURLY, datetime(2026, 11, 10, tzinfo=UTC), datetime(2026, 11, 10, 6, tzinfo=UTC), -1),
    ]


def test_short_window_inside_one_day() -> None:
    w = parse_window("6h", None, None, now=NOW)
    assert w.rollup_reads() == [RollupRead(HOURLY, w.start, w.end, 1)]
    assert w.end - w.start == 6 * HOUR


def test_previous_window_has_the_same_length_and_ends_at_the_start() -> None:
    w = parse_window("7d", None, None, now=NOW)
    prev = w.previous()
    assert prev.end == w.start and prev.end - prev.start == w.end - w.start
    assert prev.now == NOW and not prev.is_live
