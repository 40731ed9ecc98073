"""device_status: what the ingest route keeps per device (the newest sample, and per utilization bound when the
device was last busy and how many sample seconds it has been quiet since), and what migration 0004 back-fills.

Batches go through the real ingest route, so the expected figures follow from the intervals posted.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url

from app.db import make_engine
from app.migrate import upgrade
from app.models import UTIL_BOUNDS, Base, device_status, samples
from app.store.partitions import create_day
from tests.app.ingest.test_routes import post
from tests.factories import batch, gpu, mig_slice, sample
from tests.feeding import Feeder, busy, held, idle, unknown

COLUMNS = [c.name for c in device_status.c]
STATUS_SQL = f"SELECT {', '.join(COLUMNS)} FROM device_status ORDER BY device_id"
# device_status rows keyed by the device's uuid: the tests name devices as the agent does.
BY_UUID_SQL = (
    f"SELECT d.uuid, {', '.join(f'ds.{c}' for c in COLUMNS)} FROM device_status ds "
    "JOIN (SELECT id, uuid FROM gpus UNION ALL SELECT id, uuid FROM mig_slices) d ON d.id = ds.device_id"
)

Status = dict[str, Any]
SampleFn = Callable[[str, int], dict[str, Any]]


def statuses(engine: Engine) -> dict[str, Status]:
    with engine.connect() as conn:
        return {r[0]: dict(zip(COLUMNS, r[1:], strict=True)) for r in conn.execute(text(BY_UUID_SQL))}


def stored(client: TestClient, token: str, body: dict[str, Any]) -> None:
    r = post(client, body, token)
    assert r.status_code == 200 and r.json()["status"] == "stored", r.text


def utils(values: dict[str, list[float | None]], **extra: Any) -> SampleFn:
    """A sample_fn giving each device the utilization of its list at each interval, the rest from `extra`."""

    def make(uid: str, i: int) -> dict[str, Any]:
        u = values[uid][i]
        return sample(uid, u, **{"mem_used_mib": 0, "procs": 0, **extra})

    return make


def start_of(when: datetime) -> datetime:
    return when.replace(microsecond=0)


def past(minutes: int) -> datetime:
    return start_of(datetime.now(UTC)) - timedelta(minutes=minutes)


def test_newest_sample_values(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = [gpu(0, mig=True, slices=[mig_slice(1)], unpartitioned=4)]
    g, sl = gpus[0]["uuid"], gpus[0]["slices"][0]["uuid"]
    start = past(30)

    def make(uid: str, i: int) -> dict[str, Any]:
        if uid == sl:
            return sample(uid, None, power_w=None, temp_c=None, mem_used_mib=100 + i, procs=i)
        return sample(uid, 10.0 * i, util_source="nvml.rate", mem_used_mib=1000 + i, power_w=200.6 + i, temp_c=40 + i)

    stored(client, ingest_token, batch(gpus, start=start, intervals=4, duration_s=7.5, sample_fn=make))
    got = statuses(engine)
    newest = start + timedelta(seconds=3 * 7.5)
    assert {
        k: got[g][k] for k in ("ts", "dur", "util", "util_source", "mem_used_mib", "procs", "power_w", "temp_c")
    } == {
        "ts": newest,
        "dur": 7.5,
        "util": 30.0,
        "util_source": 2,  # nvml.rate
        "mem_used_mib": 1003,
        "procs": 1,
        "power_w": 204,  # 203.6, rounded as samples store it
        "temp_c": 43,
    }
    assert {k: got[sl][k] for k in ("ts", "util", "util_source", "mem_used_mib", "procs", "power_w", "temp_c")} == {
        "ts": newest,
        "util": None,
        "util_source": 0,
        "mem_used_mib": 103,
        "procs": 3,
        "power_w": None,
        "temp_c": None,
    }


def test_busy_until_is_the_end_of_the_newest_interval_at_or_above_each_bound(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    gpus = [gpu(0), gpu(1)]
    falling, never = gpus[0]["uuid"], gpus[1]["uuid"]
    start = past(30)
    # 7.5 s intervals, so an end that is not start + duration to the microsecond would show.
    fn = utils({falling: [60.0, 30.0, 7.0, 3.0, 0.5, 0.0], never: [0.9, 0.0, 0.5, 0.0, 0.0, 0.99]})
    stored(client, ingest_token, batch(gpus, start=start, intervals=6, duration_s=7.5, sample_fn=fn))
    got = statuses(engine)

    def end(i: int) -> datetime:
        return start + timedelta(seconds=7.5 * (i + 1))

    # Per bound, the index of the last interval at or above it: busy_until is that interval's end, and the
    # intervals after it are the quiet ones.
    last_busy = {1: 3, 5: 2, 10: 1, 25: 1, 50: 0}
    for b, i in last_busy.items():
        assert got[falling][f"busy_until_{b}"] == end(i), b
        assert got[falling][f"quiet_s_{b}"] == pytest.approx(7.5 * (5 - i)), b
        assert got[falling][f"quiet_free_s_{b}"] == pytest.approx(7.5 * (5 - i)), b
    for b in UTIL_BOUNDS:
        assert got[never][f"busy_until_{b}"] is None
        assert got[never][f"quiet_s_{b}"] == pytest.approx(45.0)


def test_quiet_seconds_accumulate_restart_and_skip_offline_gaps(feeder: Feeder, engine: Engine) -> None:
    gpus = [gpu(0)]
    uid = gpus[0]["uuid"]
    t0 = feeder.t0
    # Busy for 20 minutes, then idle: the idle part arrives over several batches (the Feeder posts 120 steps per
    # batch), each adding to the stretch.
    feeder.feed(gpus, start=t0, hours=1 / 3, step_s=10.0, fn=busy(80.0))
    feeder.feed(gpus, start=t0 + timedelta(minutes=20), hours=1, step_s=10.0, fn=idle)
    got = statuses(engine)[uid]
    for b in UTIL_BOUNDS:
        assert got[f"busy_until_{b}"] == t0 + timedelta(minutes=20)
        assert got[f"quiet_s_{b}"] == pytest.approx(3600.0)
        assert got[f"quiet_free_s_{b}"] == pytest.approx(3600.0)

    # Offline for an hour (no samples), then 10 minutes idle: the gap is not counted, only sample seconds are.
    feeder.feed(gpus, start=t0 + timedelta(minutes=140), hours=1 / 6, step_s=10.0, fn=idle)
    got = statuses(engine)[uid]
    assert got["ts"] == t0 + timedelta(minutes=150) - timedelta(seconds=10)
    for b in UTIL_BOUNDS:
        assert got[f"busy_until_{b}"] == t0 + timedelta(minutes=20)
        assert got[f"quiet_s_{b}"] == pytest.approx(4200.0)

    # One batch: idle, then 30 % for one minute, then idle for two minutes. The stretch restarts inside the
    # batch for the bounds at or under 30 %; above it the device stayed quiet and the whole batch adds.
    at = t0 + timedelta(minutes=150)
    values = [0.0] * 6 + [30.0] * 6 + [0.0] * 12
    stored(
        feeder.client,
        feeder.token,
        batch(gpus, start=at, intervals=len(values), duration_s=10.0, sample_fn=utils({uid: values})),
    )
    got = statuses(engine)[uid]
    for b in UTIL_BOUNDS:
        if b <= 30:
            assert got[f"busy_until_{b}"] == at + timedelta(minutes=2), b
            assert got[f"quiet_s_{b}"] == pytest.approx(120.0), b
        else:
            assert got[f"busy_until_{b}"] == t0 + timedelta(minutes=20), b
            assert got[f"quiet_s_{b}"] == pytest.approx(4200.0 + 240.0), b


def test_unknown_utilization_counts_as_busy(feeder: Feeder, engine: Engine) -> None:
    gpus = [gpu(0, mig=True, slices=[mig_slice(1)], unpartitioned=4)]
    g, sl = gpus[0]["uuid"], gpus[0]["slices"][0]["uuid"]
    t0 = feeder.t0
    # Idle for 30 minutes, then utilization unknown for 10: an unmeasured device may be working, so it is not
    # counted idle.
    feeder.feed(gpus, start=t0, hours=0.5, step_s=60.0, fn=idle)
    feeder.feed(gpus, start=t0 + timedelta(minutes=30), hours=1 / 6, step_s=60.0, fn={g: unknown, sl: unknown})
    got = statuses(engine)
    for uid in (g, sl):
        assert got[uid]["util"] is None and got[uid]["util_source"] == 0
        for b in UTIL_BOUNDS:
            assert got[uid][f"busy_until_{b}"] == t0 + timedelta(minutes=40)
            assert got[uid][f"quiet_s_{b}"] == 0.0
            assert got[uid][f"quiet_free_s_{b}"] == 0.0


def test_quiet_free_leaves_out_seconds_with_a_process_or_held_memory(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    gpus = [gpu(0)]
    uid = gpus[0]["uuid"]
    # After one busy interval, idle intervals that are held (a process, or memory at or above 256 MiB) or free
    # (no process and under 256 MiB, unknown counting as none).
    kinds: list[dict[str, Any]] = [
        {"util": 90.0, "procs": 1, "mem_used_mib": 20000},
        {"procs": 1, "mem_used_mib": 0},  # held: a process
        {"procs": 0, "mem_used_mib": 256},  # held: memory at the bound
        {"procs": 0, "mem_used_mib": 255},  # free
        {"procs": None, "mem_used_mib": None},  # free: unknown counts as none
        {"procs": 0, "mem_used_mib": 30000},  # held
        {"procs": 0, "mem_used_mib": 0},  # free
    ]

    def make(u: str, i: int) -> dict[str, Any]:
        return sample(u, **{"util": 0.0, **kinds[i]})

    start = past(30)
    stored(client, ingest_token, batch(gpus, start=start, intervals=len(kinds), duration_s=10.0, sample_fn=make))
    got = statuses(engine)[uid]
    for b in UTIL_BOUNDS:
        assert got[f"busy_until_{b}"] == start + timedelta(seconds=10)
        assert got[f"quiet_s_{b}"] == pytest.approx(60.0)
        assert got[f"quiet_free_s_{b}"] == pytest.approx(30.0)
    assert (got["procs"], got["mem_used_mib"]) == (0, 0)


def test_held_idle_stretch_counts_in_quiet_but_not_in_quiet_free(feeder: Feeder, engine: Engine) -> None:
    gpus = [gpu(0)]
    uid = gpus[0]["uuid"]
    t0 = feeder.t0
    feeder.feed(gpus, start=t0, hours=0.5, step_s=60.0, fn=held)
    feeder.feed(gpus, start=t0 + timedelta(minutes=30), hours=0.5, step_s=60.0, fn=idle)
    got = statuses(engine)[uid]
    for b in UTIL_BOUNDS:
        assert got[f"busy_until_{b}"] is None
        assert got[f"quiet_s_{b}"] == pytest.approx(3600.0)
        assert got[f"quiet_free_s_{b}"] == pytest.approx(1800.0)


def test_a_replayed_older_batch_does_not_roll_back_the_newest_sample(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    gpus = [gpu(0)]
    uid = gpus[0]["uuid"]
    newer_start = past(20)
    older_start = newer_start - timedelta(minutes=10)
    newer = batch(gpus, start=newer_start, intervals=3, sample_fn=utils({uid: [0.0, 0.0, 0.0]}, mem_used_mib=7))
    # Posted after the newer one, as a late replay would be: busy at 60 %, then one interval at 2 %.
    older = batch(
        gpus, start=older_start, intervals=3, sample_fn=utils({uid: [60.0, 60.0, 2.0]}, mem_used_mib=99, procs=2)
    )
    stored(client, ingest_token, newer)
    stored(client, ingest_token, older)
    got = statuses(engine)[uid]
    assert (got["ts"], got["util"], got["mem_used_mib"], got["procs"]) == (
        newer_start + timedelta(seconds=20),
        0.0,
        7,
        0,
    )
    # busy_until takes the later end, whichever batch brought it.
    assert got["busy_until_50"] == older_start + timedelta(seconds=20)
    assert got["busy_until_1"] == older_start + timedelta(seconds=30)
    # The documented approximation: the older batch's busy interval is newer than the stored busy_until (none),
    # so the stretch restarts from the older batch's own quiet seconds and the newer batch's 30 s are lost. An
    # agent replays its spool in order, so the server does not pay for the exact answer on every batch.
    assert got["quiet_s_50"] == pytest.approx(10.0)
    assert got["quiet_s_1"] == pytest.approx(0.0)


def test_a_resent_batch_changes_nothing(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = [gpu(0)]
    b = batch(gpus, start=past(10), intervals=6)
    stored(client, ingest_token, b)
    before = statuses(engine)
    assert post(client, b, ingest_token).json()["status"] == "duplicate"
    assert statuses(engine) == before


def test_table_keeps_free_space_for_hot_updates(engine: Engine) -> None:
    with engine.connect() as conn:
        options = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'device_status'")).scalar_one()
    assert "fillfactor=70" in options


def varied(seed: int, slices: set[str], calm: set[str], falling: set[str]) -> SampleFn:
    """Figures that cross every bound, in idle, held, busy and unknown stretches of a few intervals. The `calm`
    devices are never busy, so all their seconds are quiet; the `falling` ones end each batch of 120 intervals
    at 40 %, then 7.5 %, then 0.5 %, so each bound's busy_until differs."""
    rng = random.Random(seed)
    mode: dict[str, str] = {}

    def make(uid: str, i: int) -> dict[str, Any]:
        if uid in falling and i >= 60:
            return sample(uid, 40.0 if i < 80 else 7.5 if i < 100 else 0.5, mem_used_mib=rng.choice((0, 300)), procs=0)
        if uid not in mode or rng.random() < 0.15:
            mode[uid] = rng.choice(("idle", "held") if uid in calm else ("idle", "idle", "held", "busy", "unknown"))
        m = mode[uid]
        if uid in slices:
            return sample(uid, None, power_w=None, temp_c=None, mem_used_mib=rng.choice((0, 100, 3000)))
        if m == "unknown":
            return sample(uid, None, mem_used_mib=0, procs=0)
        if m == "busy":
            return sample(uid, rng.choice((3.0, 7.5, 20.0, 40.0, 99.0)), mem_used_mib=20000, procs=1)
        return sample(
            uid,
            rng.choice((0.0, 0.5, 0.99)),
            mem_used_mib=rng.choice((0, 255)) if m == "idle" else 30000,
            procs=0 if m == "idle" else rng.choice((0, 1)),
            power_w=rng.uniform(60.0, 400.0),
            temp_c=rng.randint(30, 80),
        )

    return make


def assert_same_status(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    """Row by row; seconds compared loosely, as sums in another order may differ in the last bit."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(COLUMNS, g, w, strict=True):
            if isinstance(a, float) and isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-9), (g[0], name)
            else:
                assert a == b, (g[0], name, a, b)


def test_migration_backfills_what_the_write_path_builds(
    client: TestClient, engine: Engine, ingest_token: str, database_url: str
) -> None:
    """Post a story through the route; copy its inventory and samples into a fresh database at 0003 and migrate
    it to head: the back-filled rows are the ones the write path built.

    The fresh database's time zone is off UTC by a non-whole hour, so anything cut in the session's zone would
    show. One instance collects every 10 s, the other every 30 s; the first loses its interval on record in the
    copy, so the back-fill falls back to 10 s for it.
    """
    a = [gpu(0), gpu(1, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)]
    b = [gpu(0), gpu(1)]
    slices = {s["uuid"] for g in a for s in g["slices"]}
    calm, falling = {b[1]["uuid"]}, {a[0]["uuid"]}
    start = start_of(datetime.now(UTC)).replace(second=0) - timedelta(hours=3)
    for n in range(6):
        at = start + timedelta(minutes=20 * n)
        stored(
            client,
            ingest_token,
            batch(
                a,
                start=at,
                intervals=120,
                duration_s=10.0,
                sample_fn=varied(n, slices, calm, falling),
                instance_id="i-aaaa",
            ),
        )
        stored(
            client,
            ingest_token,
            batch(
                b,
                start=at,
                intervals=40,
                duration_s=30.0,
                sample_fn=varied(100 + n, slices, calm, falling),
                instance_id="i-bbbb",
            ),
        )
    with engine.connect() as conn:
        want = [tuple(r) for r in conn.execute(text(STATUS_SQL))]
        copied = {
            t: [dict(r._mapping) for r in conn.execute(t.select())]
            for t in (Base.metadata.tables[n] for n in ("instances", "gpus", "mig_slices", "samples"))
        }
    assert len(want) == 6
    assert any(r[COLUMNS.index("busy_until_1")] is None for r in want)  # a device never busy: all seconds quiet
    assert any(r[COLUMNS.index("busy_until_50")] != r[COLUMNS.index("busy_until_1")] for r in want)

    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = f"gpufleet_status_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f"ALTER DATABASE \"{name}\" SET timezone = 'Asia/Kolkata'")
    url = server.set(database=name).render_as_string(hide_password=False)
    eng = make_engine(url, pool_size=1)
    try:
        upgrade(url, "0003")
        with eng.begin() as conn:
            for day in {r["ts"].astimezone(UTC).date() for r in copied[samples]}:
                create_day(conn, day)
            for table, values in copied.items():
                # Only the columns the table has at 0003: later migrations add the rest.
                present = {c["name"] for c in inspect(conn).get_columns(table.name)}
                conn.execute(table.insert(), [{k: v for k, v in row.items() if k in present} for row in values])
            conn.execute(text("UPDATE instances SET interval_s = NULL WHERE instance_id = 'i-aaaa'"))
        upgrade(url)
        with eng.connect() as conn:
            got = [tuple(r) for r in conn.execute(text(STATUS_SQL))]
        # Migration 0008 leaves the coverage stretch unknown (NULL); the device's next batch records it.
        unknown_stretch = {COLUMNS.index("covered_from"), COLUMNS.index("covered_until")}
        want = [tuple(None if i in unknown_stretch else v for i, v in enumerate(r)) for r in want]
        assert_same_status(got, want)
    finally:
        eng.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
