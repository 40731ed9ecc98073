"""The optional figures wire format v1 gained (graphics activity, SM clock, ECC, process memory, host price,
NVML error counts): stored when sent, NULL or empty when not, range-checked by field."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from app.migrate import upgrade
from tests.app.ingest.test_routes import _set, mixed_batch, post, written
from tests.factories import batch, gpu, mig_slice, now_floor, sample

FIGURES = ("gr_active", "sm_clock_mhz", "ecc_uncorrected", "procs_mem_mib")


def sample_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT s.ts, g.uuid, s.util, s.gr_active, s.sm_clock_mhz, s.ecc_uncorrected, s.procs_mem_mib "
                    "FROM samples s LEFT JOIN gpus g ON g.id = s.device_id ORDER BY s.ts, s.device_id"
                )
            )
        )


def instance_row(engine: Engine, instance_id: str = "i-0123456789abcdef0") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT price_usd_per_hour, agent_errors FROM instances WHERE instance_id = :i"), {"i": instance_id}
        ).one()


def test_figures_are_stored(client: TestClient, engine: Engine, ingest_token: str) -> None:
    g = gpu(0, name="NVIDIA H100 80GB HBM3")

    def values(uid: str, i: int) -> dict[str, Any]:
        return sample(
            uid,
            40.0 + i,
            util_source="nvml.gpm",
            sm_active=30.0 + i,
            gr_active=35.5 + i,
            sm_clock_mhz=1980 - i,
            ecc_uncorrected=i,
            procs_mem_mib=70000 + i,
        )

    b = batch([g], intervals=3, sample_fn=values, lifecycle="on-prem", price_usd_per_hour=2.75)
    b["agent"]["errors"] = {"nvmlDeviceGetPowerUsage:not_supported": 3, "nvmlGpmSampleGet:timeout": 1}
    r = post(client, b, ingest_token)
    assert r.status_code == 200, r.text
    rows = sample_rows(engine)
    assert [(r.gr_active, r.sm_clock_mhz, r.ecc_uncorrected, r.procs_mem_mib) for r in rows] == [
        (35.5, 1980, 0, 70000),
        (36.5, 1979, 1, 70001),
        (37.5, 1978, 2, 70002),
    ]
    inst = instance_row(engine)
    assert inst.price_usd_per_hour == 2.75
    assert inst.agent_errors == {"nvmlDeviceGetPowerUsage:not_supported": 3, "nvmlGpmSampleGet:timeout": 1}


def test_old_style_batch_leaves_them_null(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    assert not any(k in s for iv in b["intervals"] for s in iv["samples"] for k in FIGURES)
    assert "price_usd_per_hour" not in b["instance"] and "errors" not in b["agent"]
    r = post(client, b, ingest_token)
    assert r.status_code == 200, r.text
    assert r.json()["samples"] == 12
    rows = sample_rows(engine)
    assert len(rows) == 12
    assert {(r.gr_active, r.sm_clock_mhz, r.ecc_uncorrected, r.procs_mem_mib) for r in rows} == {(None,) * 4}
    inst = instance_row(engine)
    assert (inst.price_usd_per_hour, inst.agent_errors) == (None, {})


def test_zero_is_stored_as_zero_and_null_as_null(client: TestClient, engine: Engine, ingest_token: str) -> None:
    g = gpu(0)

    def values(uid: str, i: int) -> dict[str, Any]:
        figures: dict[str, Any] = dict.fromkeys(FIGURES, 0) if i == 0 else dict.fromkeys(FIGURES)
        return sample(uid, **figures)

    assert (
        post(client, batch([g], intervals=2, sample_fn=values, price_usd_per_hour=0), ingest_token).status_code == 200
    )
    rows = sample_rows(engine)
    assert [(r.gr_active, r.sm_clock_mhz, r.ecc_uncorrected, r.procs_mem_mib) for r in rows] == [
        (0, 0, 0, 0),
        (None, None, None, None),
    ]
    assert instance_row(engine).price_usd_per_hour == 0


def test_mig_slice_figures(client: TestClient, engine: Engine, ingest_token: str) -> None:
    sl = mig_slice(1, "3g.40gb")
    parent = gpu(0, mig=True, slices=[sl], name="NVIDIA H100 80GB HBM3")

    def values(uid: str, i: int) -> dict[str, Any]:
        if uid == sl["uuid"]:
            return sample(uid, 12.0, util_source="nvml.gpm", power_w=None, temp_c=None, gr_active=12.0, procs_mem_mib=9)
        return sample(uid, None, sm_clock_mhz=1755, ecc_uncorrected=0)

    assert post(client, batch([parent], intervals=1, sample_fn=values), ingest_token).status_code == 200
    with engine.connect() as conn:
        got = conn.execute(
            text(
                "SELECT m.profile, s.gr_active, s.sm_clock_mhz, s.ecc_uncorrected, s.procs_mem_mib "
                "FROM samples s JOIN mig_slices m ON m.id = s.device_id"
            )
        ).one()
    assert tuple(got) == ("3g.40gb", 12.0, None, None, 9)
    rows = [r for r in sample_rows(engine) if r.uuid is not None]
    assert [(r.sm_clock_mhz, r.ecc_uncorrected, r.gr_active) for r in rows] == [(1755, 0, None)]


BAD = [
    ("intervals[0].samples[0].gr_active", 100.5),
    ("intervals[0].samples[0].gr_active", -0.1),
    ("intervals[0].samples[0].gr_active", "busy"),
    ("intervals[0].samples[0].sm_clock_mhz", 10001),
    ("intervals[0].samples[0].sm_clock_mhz", -1),
    ("intervals[0].samples[0].sm_clock_mhz", 1500.5),
    ("intervals[0].samples[0].ecc_uncorrected", -1),
    ("intervals[0].samples[0].ecc_uncorrected", 2**31),
    ("intervals[0].samples[0].procs_mem_mib", -1),
    ("intervals[0].samples[0].procs_mem_mib", 2**31),
    ("instance.price_usd_per_hour", -0.01),
    ("instance.price_usd_per_hour", 10000.5),
    ("instance.price_usd_per_hour", "cheap"),
    ("agent.errors", {"nvmlDeviceGetPowerUsage:not_supported": -1}),
    ("agent.errors", {"nvmlDeviceGetPowerUsage:not_supported": 2**31}),
    ("agent.errors", {"nvmlDeviceGetPowerUsage:not_supported": "many"}),
    ("agent.errors", {"": 1}),
    ("agent.errors", {"x" * 97: 1}),
    ("agent.errors", {f"call{i}:reason": 1 for i in range(65)}),
    ("agent.errors", ["nvmlDeviceGetPowerUsage:not_supported"]),
]


@pytest.mark.parametrize(("path", "value"), BAD)
def test_out_of_range_is_422_naming_the_field(
    client: TestClient, engine: Engine, ingest_token: str, path: str, value: Any
) -> None:
    b = mixed_batch()
    _set(path, value)(b)
    r = post(client, b, ingest_token)
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["detail"]]
    assert fields and all(f.startswith(path) for f in fields), fields
    assert sum(written(engine).values()) == 0


def test_limits_are_inclusive(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = batch(
        [gpu(0)],
        intervals=1,
        sample_fn=lambda uid, i: sample(
            uid, gr_active=100, sm_clock_mhz=10000, ecc_uncorrected=2**31 - 1, procs_mem_mib=2**31 - 1
        ),
        price_usd_per_hour=10000,
    )
    b["agent"]["errors"] = {f"{'c' * 90}:{i:05d}": 2**31 - 1 for i in range(64)}
    assert len(next(iter(b["agent"]["errors"]))) == 96
    r = post(client, b, ingest_token)
    assert r.status_code == 200, r.text
    row = sample_rows(engine)[0]
    assert (row.gr_active, row.sm_clock_mhz, row.ecc_uncorrected, row.procs_mem_mib) == (
        100,
        10000,
        2**31 - 1,
        2**31 - 1,
    )
    inst = instance_row(engine)
    assert inst.price_usd_per_hour == 10000 and len(inst.agent_errors) == 64


def test_newest_batch_sets_price_and_errors_and_replays_do_not(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    g = gpu(0)
    t0 = now_floor() - timedelta(minutes=10)

    def send(start_min: int, errors: dict[str, int] | None, **instance: Any) -> None:
        b = batch([g], start=t0 + timedelta(minutes=start_min), lifecycle="on-prem", **instance)
        if errors is not None:
            b["agent"]["errors"] = errors
        r = post(client, b, ingest_token)
        assert r.status_code == 200, r.text

    send(5, {"nvmlDeviceGetPowerUsage:not_supported": 3}, price_usd_per_hour=1.5)
    assert tuple(instance_row(engine)) == (1.5, {"nvmlDeviceGetPowerUsage:not_supported": 3})
    # Same inventory: the server's inventory cache skips the upsert, and the counts must still land.
    send(6, {"nvmlDeviceGetTemperature:gpu_is_lost": 1}, price_usd_per_hour=1.5)
    assert tuple(instance_row(engine)) == (1.5, {"nvmlDeviceGetTemperature:gpu_is_lost": 1})
    # Older replays, with and without a cache hit, change neither.
    send(0, {"nvmlDeviceGetClockInfo:unknown": 7}, price_usd_per_hour=1.5)
    send(1, {"nvmlDeviceGetClockInfo:unknown": 7}, price_usd_per_hour=9.0)
    assert tuple(instance_row(engine)) == (1.5, {"nvmlDeviceGetTemperature:gpu_is_lost": 1})
    # A newer batch without errors clears them; a new price is an instance_changed event. Its inventory
    # equals the last replay's, which must not have been taken for the stored one.
    send(7, None, price_usd_per_hour=9.0)
    assert tuple(instance_row(engine)) == (9.0, {})
    with engine.connect() as conn:
        changes = [
            r.details
            for r in conn.execute(text("SELECT details FROM events WHERE kind = 'instance_changed' ORDER BY id"))
        ]
    assert changes == [{"field": "price_usd_per_hour", "old": 1.5, "new": 9.0}]


def test_migration_adds_columns_to_existing_partitions(database_url: str) -> None:
    """A samples partition made before 0002 gets the new columns from the ALTER on its parent, its rows
    read NULL, and a downgrade drops them again."""
    from alembic import command

    from app.migrate import alembic_config

    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = f"gpufleet_migrate_0002_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.set(database=name).render_as_string(hide_password=False)
    new_columns = ("gr_active", "ecc_uncorrected", "procs_mem_mib", "sm_clock_mhz")

    def columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
        return [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (table,),
            )
        ]

    try:
        upgrade(url, "0001")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE samples_p20260101 PARTITION OF samples "
                "FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-01-02 00:00+00')"
            )
            conn.execute("INSERT INTO samples (ts, device_id, util_source) VALUES ('2026-01-01 01:00+00', 1, 0)")
            conn.execute("INSERT INTO instances (instance_id, first_seen, last_seen) VALUES ('h1', now(), now())")
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert columns(conn, "samples") == columns(conn, "samples_p20260101")
            assert tuple(columns(conn, "samples")[-4:]) == new_columns
            old = conn.execute(f"SELECT {', '.join(new_columns)} FROM samples").fetchall()
            assert old == [(None, None, None, None)]
            assert conn.execute("SELECT price_usd_per_hour, agent_errors FROM instances").fetchall() == [(None, {})]
            conn.execute(
                f"INSERT INTO samples (ts, device_id, util_source, {', '.join(new_columns)}) "
                "VALUES ('2026-01-01 02:00+00', 1, 0, 50, 1, 2, 1410)"
            )
            assert conn.execute("SELECT count(*) FROM samples_p20260101 WHERE gr_active = 50").fetchone() == (1,)
        command.downgrade(alembic_config(url), "0001")
        with psycopg.connect(url, autocommit=True) as conn:
            assert not set(new_columns) & set(columns(conn, "samples_p20260101"))
            assert not {"price_usd_per_hour", "agent_errors"} & set(columns(conn, "instances"))
            assert conn.execute("SELECT count(*) FROM samples").fetchone() == (2,)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
