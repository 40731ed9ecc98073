"""Daily rollups: what the ingest route folds into them, what upkeep deletes, and what migration 0003 back-fills.

A day's row must be what its hours' rows add up to (sums add, maxima take the greatest), so each test compares
the daily table with the hourly one, aggregated by UTC day.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from app.db import make_engine
from app.migrate import upgrade
from app.models import rollups_daily
from app.store.partitions import create_day, upkeep
from tests.app.ingest.test_routes import post
from tests.factories import batch, gpu, mig_slice, sample

# Every rollup column but the time bucket and the device, in table order.
VALUES = [c.name for c in rollups_daily.c if c.name not in ("day", "device_id")]
MAXES = {n for n in VALUES if n.endswith("_max")}
SECS = 2 + VALUES.index("secs")  # its place in a row of DAILY_SQL

DAILY_SQL = f"SELECT day, device_id, {', '.join(VALUES)} FROM rollups_daily ORDER BY device_id, day"
HOURLY_BY_DAY_SQL = (
    "SELECT date_trunc('day', hour) AS day, device_id, "
    + ", ".join(f"max({n})" if n in MAXES else f"sum({n})" for n in VALUES)
    + " FROM rollups_hourly GROUP BY 1, 2 ORDER BY device_id, day"
)


def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, UTC)


def fleet() -> list[dict[str, Any]]:
    """A plain GPU and a MIG GPU with two slices: four devices, the slices without utilization or power."""
    return [gpu(0), gpu(1, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)]


def varied(seed: int) -> Any:
    """A sample_fn whose figures change with the device and the interval and cross every rollup bound."""
    rng = random.Random(seed)

    def make(uid: str, _i: int) -> dict[str, Any]:
        if uid.startswith("MIG-"):
            return sample(uid, None, power_w=None, temp_c=None, mem_used_mib=rng.choice((0, 100, 3000)))
        return sample(
            uid,
            rng.choice((None, 0.0, 0.5, 3.0, 7.5, 20.0, 40.0, 99.0)),
            sm_active=rng.choice((None, 12.5, 60.0)),
            mem_used_mib=rng.choice((0, 200, 256, 30000)),
            power_w=rng.uniform(60.0, 400.0),
            temp_c=rng.randint(30, 80),
            procs=rng.choice((0, 0, 1, 3)),
        )

    return make


def rows(conn: Connection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(text(sql))]


def assert_same(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]]) -> None:
    """Row by row; floats compared loosely, as the same seconds summed in another order may differ in the last bit."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:2] == w[:2]
        for name, a, b in zip(VALUES, g[2:], w[2:], strict=True):
            assert (a is None) == (b is None), (g[:2], name, a, b)
            if a is not None:
                assert a == pytest.approx(b, rel=1e-9), (g[:2], name)


def daily_matches_hourly(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        daily = rows(conn, DAILY_SQL)
        assert_same(daily, rows(conn, HOURLY_BY_DAY_SQL))
    return daily


def test_daily_rows_are_the_sums_of_their_hours(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = fleet()
    day = datetime.now(UTC).date() - timedelta(days=3)
    # Several batches into several hours of one day, one across an hour boundary, two into the same hour: the
    # daily rows are inserted once and then updated.
    starts = [timedelta(hours=h, minutes=m) for h, m in ((1, 0), (1, 30), (4, 59), (13, 7), (23, 50))]
    for n, offset in enumerate(starts):
        b = batch(gpus, start=midnight(day) + offset, intervals=12, sample_fn=varied(n))
        r = post(client, b, ingest_token)
        assert r.status_code == 200 and r.json()["status"] == "stored", r.text
    daily = daily_matches_hourly(engine)
    assert len(daily) == 4  # four devices, one day
    assert {r[0] for r in daily} == {midnight(day)}
    assert [r[SECS] for r in daily] == [pytest.approx(len(starts) * 12 * 10.0)] * 4
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(DISTINCT hour) FROM rollups_hourly")).scalar_one() == 5


def test_samples_across_midnight_split_into_two_days(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = fleet()
    day = datetime.now(UTC).date() - timedelta(days=2)
    # Six 10 s intervals, three before midnight and three after: each counts in the day it starts in.
    b = batch(gpus, start=midnight(day) - timedelta(seconds=30), intervals=6, sample_fn=varied(7))
    assert post(client, b, ingest_token).status_code == 200
    daily = daily_matches_hourly(engine)
    assert {r[0] for r in daily} == {midnight(day) - timedelta(days=1), midnight(day)}
    assert len(daily) == 8
    assert [r[SECS] for r in daily] == [pytest.approx(30.0)] * 8


def test_a_resent_batch_is_not_counted_twice(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = batch(fleet(), intervals=6, sample_fn=varied(3))
    assert post(client, b, ingest_token).json()["status"] == "stored"
    before = daily_matches_hourly(engine)
    assert post(client, b, ingest_token).json()["status"] == "duplicate"
    assert daily_matches_hourly(engine) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT sum(secs) FROM rollups_daily")).scalar_one() == pytest.approx(4 * 6 * 10.0)


def test_upkeep_deletes_days_wholly_before_the_rollup_horizon(engine: Engine) -> None:
    now = datetime.now(UTC)
    horizon_day = (now - timedelta(days=400)).date()
    days = {
        horizon_day - timedelta(days=30): False,
        horizon_day - timedelta(days=1): False,  # ends at or before the horizon
        horizon_day: True,  # the horizon falls inside it: still partly inside retention
        now.date(): True,
    }
    with engine.begin() as conn:
        for n, d in enumerate(days):
            conn.execute(
                text("INSERT INTO rollups_daily (day, device_id, secs) VALUES (:d, :id, 60)"),
                {"d": midnight(d), "id": n + 1},
            )
    with engine.begin() as conn:
        result = upkeep(conn, now=now, raw_retention_days=14, rollup_retention_days=400, ahead_days=3)
    assert result.daily_deleted == 2
    with engine.connect() as conn:
        left = set(conn.execute(text("SELECT day FROM rollups_daily")).scalars())
    assert left == {midnight(d) for d, kept in days.items() if kept}


def test_table_keeps_free_space_for_hot_updates(engine: Engine) -> None:
    with engine.connect() as conn:
        options = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'rollups_daily'")).scalar_one()
    assert "fillfactor=70" in options


def test_migration_backfills_from_the_hourly_rollups(database_url: str) -> None:
    """Migrate a database to 0002, fill rollups_hourly, migrate to head: the new daily rows add up the hours.

    The database's own time zone is set off UTC by a non-whole hour, so a day cut in the session's zone
    instead of UTC would show.
    """
    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = f"gpufleet_backfill_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f"ALTER DATABASE \"{name}\" SET timezone = 'Asia/Kolkata'")
    url = server.set(database=name).render_as_string(hide_password=False)
    eng = make_engine(url, pool_size=1)  # its sessions speak UTC; Alembic's do not
    try:
        upgrade(url, "0002")
        rng = random.Random(11)
        # Two days either side of a month boundary, so the hours come from two monthly partitions.
        first = datetime.now(UTC).date().replace(day=1) - timedelta(days=1)
        hours = [midnight(first) + timedelta(hours=h) for h in range(0, 48, 3)]
        insert = text(
            f"INSERT INTO rollups_hourly (hour, device_id, {', '.join(VALUES)}) "
            f"VALUES (:hour, :device_id, {', '.join(f':{n}' for n in VALUES)})"
        )
        with eng.begin() as conn:
            create_day(conn, first)
            create_day(conn, first + timedelta(days=1))
            for device_id in (1, 2, 3):
                for hour in hours:
                    values: dict[str, Any] = {
                        n: None if n in MAXES and rng.random() < 0.2 else rng.randint(0, 3600) for n in VALUES
                    }
                    values["secs"] = 3600.0 - rng.random()
                    conn.execute(insert, {"hour": hour, "device_id": device_id, **values})
        upgrade(url)
        with eng.connect() as conn:
            daily = rows(conn, DAILY_SQL)
            assert_same(daily, rows(conn, HOURLY_BY_DAY_SQL))
        assert {r[0] for r in daily} == {midnight(first), midnight(first + timedelta(days=1))}
        assert len(daily) == 6
    finally:
        eng.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
