"""Windows and filters from query-string values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.analyse.window import DAILY, DAY, HOUR, HOURLY, RollupRead, WindowError, parse_filters, parse_window

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


@pytest.mark.parametrize(
    ("window", "start", "end", "param"),
    [
        ("2w", None, None, "window"),
        (None, "yesterday", None, "start"),
        (None, "2026-11-20T00:00:00Z", "2026-11-19T00:00:00Z", "end"),
        (None, None, "2026-11-19T00:00:00Z", "start"),
        ("24h", "2026-11-20T00:00:00Z", None, "window"),
        (None, "2024-01-01T00:00:00Z", None, "end"),
        # Times at the ends of the calendar, which rounding to whole hours would push past it.
        (None, "0001-01-01T00:30:00+01:00", None, "start"),
        (None, "9999-12-31T22:00:00Z", "9999-12-31T23:30:00Z", "start"),
        (None, "9999-12-29T00:00:00Z", "9999-12-31T23:30:00Z", "end"),
    ],
)
def test_bad_windows_name_the_parameter(window: str | None, start: str | None, end: str | None, param: str) -> None:
    with pytest.raises(WindowError) as err:
        parse_window(window, start, end, now=NOW)
    assert err.value.param == param


def test_naive_times_are_utc() -> None:
    w = parse_window(None, "2026-11-20T10:00", None, now=NOW)
    assert w.start == datetime(2026, 11, 20, 10, tzinfo=UTC)
    assert w.end == datetime(2026, 11, 21, 15, tzinfo=UTC)


def test_filters() -> None:
    f = parse_filters(region=["us-east-1", "", "us-east-1"], lifecycle=["spot"], tag=["team:ml", "env=prod"])
    assert f.regions == ("us-east-1",)
    assert f.tags == (("team", "ml"), ("env", "prod"))
    assert f.match(region="us-east-1", instance_type="x", lifecycle="spot", tags={"team": "ml", "env": "prod"})
    assert not f.match(region="us-east-1", instance_type="x", lifecycle="spot", tags={"team": "ml"})
    with pytest.raises(WindowError, match="lifecycle"):
        parse_filters(lifecycle=["reserved"])
    with pytest.raises(WindowError, match="tag"):
        parse_filters(tag=["novalue"])
    assert parse_window("24h", None, None, now=NOW).now - NOW == timedelta(0)
