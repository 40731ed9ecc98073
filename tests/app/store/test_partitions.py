"""Partition upkeep: days made ahead and behind, expired days and months dropped whole. The daily tables
(samples and the 5-minute rollups) have the same days, the monthly tables (device and holder hourly rollups) the same
months."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine, text

from app.store.partitions import DAILY_TABLES, create_day, existing, upkeep


def _days(engine: Engine, table: str) -> set[date]:
    """Days with a partition of `table`, read from the catalog by name."""
    with engine.connect() as conn:
        names = conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:t AS regclass)"
            ),
            {"t": table},
        ).scalars()
        return {datetime.strptime(n.removeprefix(f"{table}_p"), "%Y%m%d").date() for n in names}


def _upkeep(engine: Engine, now: datetime) -> tuple[list[date], list[str]]:
    with engine.begin() as conn:
        r = upkeep(conn, now=now, raw_retention_days=14, rollup_retention_days=400, ahead_days=3)
    return r.created_days, r.dropped


def test_every_day_in_retention_and_ahead_has_a_partition(engine: Engine) -> None:
    now = datetime.now(UTC)
    _upkeep(engine, now)
    with engine.connect() as conn:
        days, months = existing(conn)
    today = now.date()
    wanted = {today + timedelta(days=d) for d in range(-14, 4)}
    assert wanted <= days
    assert {d.replace(day=1) for d in wanted} <= months
    assert _days(engine, "samples") == _days(engine, "rollups_5m") == days


def test_expired_partitions_are_dropped(engine: Engine) -> None:
    now = datetime.now(UTC)
    old_day = (now - timedelta(days=20)).date()
    old_month = (now - timedelta(days=430)).date()
    with engine.begin() as conn:
        create_day(conn, old_day)
        create_day(conn, old_month)
        conn.execute(
            text("INSERT INTO samples (ts, device_id, util_source) VALUES (:t, 1, 0)"),
            {"t": datetime.combine(old_day, datetime.min.time(), UTC)},
        )
    _created, dropped = _upkeep(engine, now)
    assert f"samples_p{old_day:%Y%m%d}" in dropped
    assert f"rollups_5m_p{old_day:%Y%m%d}" in dropped
    assert f"rollups_hourly_p{old_month:%Y%m}" in dropped
    assert f"holder_rollups_hourly_p{old_month:%Y%m}" in dropped
    with engine.connect() as conn:
        days, months = existing(conn)
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 0
    assert old_day not in days and old_month.replace(day=1) not in months
    assert old_day not in _days(engine, "rollups_5m")
    # The day at the retention horizon stays: it still holds samples inside the window.
    assert (now - timedelta(days=14)).date() in days


def test_upkeep_is_idempotent(engine: Engine) -> None:
    now = datetime.now(UTC)
    _upkeep(engine, now)
    created, dropped = _upkeep(engine, now)
    assert created == [] and dropped == []


def test_a_month_missing_one_monthly_table_gets_it(engine: Engine) -> None:
    """As a day: a month counts as made only when every monthly table has it, so a table newer than the month's
    partitions gets them at the next pass."""
    now = datetime.now(UTC)
    _upkeep(engine, now)
    month = now.date().replace(day=1)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE holder_rollups_hourly_p{month:%Y%m}"))
        _days, months = existing(conn)
    assert month not in months
    created, _dropped = _upkeep(engine, now)
    assert created and all(d.replace(day=1) == month for d in created)
    with engine.connect() as conn:
        _days, months = existing(conn)
    assert month in months


def test_a_day_missing_one_daily_table_gets_it(engine: Engine) -> None:
    """A day counts as made only when every daily table has it: upkeep makes the missing partition."""
    now = datetime.now(UTC)
    _upkeep(engine, now)
    day = now.date() - timedelta(days=2)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE rollups_5m_p{day:%Y%m%d}"))
        days, _months = existing(conn)
    assert day not in days and day in _days(engine, "samples")
    created, dropped = _upkeep(engine, now)
    assert created == [day] and dropped == []
    assert all(day in _days(engine, table) for table in DAILY_TABLES)
