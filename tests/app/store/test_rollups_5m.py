"""5-minute rollups: what the ingest route folds into them, where an interval counts, and that a chart's query
reads them through the primary key.

Batches go through the real ingest route; the expected rows are worked out in Python from the intervals posted.
Figures are chosen to survive storage exactly (float4 utilization, int2 power), so sums compare to the last bit
but for the order of floating-point additions.
"""

from __future__ import annotations

import random
import secrets
from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url

from app.db import make_engine
from app.migrate import upgrade
from app.models import Base, rollups_5m, samples
from app.store.partitions import create_day
from tests.app.ingest.test_routes import post
from tests.factories import batch, gpu, mig_slice, sample

BUCKET_S = 300
VALUES = [c.name for c in rollups_5m.c if c.name not in ("bucket", "device_id")]
SUMS = [n for n in VALUES if not n.endswith("_max")]
# Rows keyed by the device's uuid: the tests name devices as the agent does.
BY_UUID_SQL = (
    f"SELECT d.uuid, r.bucket, {', '.join(f'r.{n}' for n in VALUES)} FROM rollups_5m r "
    "JOIN (SELECT id, uuid FROM gpus UNION ALL SELECT id, uuid FROM mig_slices) d ON d.id = r.device_id"
)
Key = tuple[str, datetime]


def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, UTC)


def bucket_of(t: datetime) -> datetime:
    return datetime.fromtimestamp(t.timestamp() // BUCKET_S * BUCKET_S, UTC)


def fleet() -> list[dict[str, Any]]:
    """A plain GPU and a MIG GPU with two slices: four devices, the slices without utilization or power."""
    return [gpu(0), gpu(1, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)]


def varied(seed: int) -> Any:
    """A sample_fn whose figures change with the device and the interval, NULLs included."""
    rng = random.Random(seed)

    def make(uid: str, _i: int) -> dict[str, Any]:
        if uid.startswith("MIG-"):
            return sample(uid, None, power_w=None, temp_c=None, mem_used_mib=rng.choice((None, 0, 100, 3000)))
        return sample(
            uid,
            rng.choice((None, 0.0, 0.5, 7.5, 40.0, 99.0)),
            mem_used_mib=rng.choice((None, 0, 256, 30000)),
            power_w=rng.choice((None, 60, 250, 400)),
        )

    return make


def hour_pieces(start: datetime, dur: float) -> list[tuple[datetime, float]]:
    """An interval cut at UTC hour boundaries: (piece start, seconds)."""
    out = []
    end = start + timedelta(seconds=dur)
    while start < end:
        cut = min(end, start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
        out.append((start, (cut - start).total_seconds()))
        start = cut
    return out


def expected(batches: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Each (device, bucket)'s row from the posted intervals: every interval cut at the hour, each piece in the
    bucket its start falls in."""
    out: dict[Key, dict[str, Any]] = defaultdict(lambda: {n: 0.0 if n in SUMS else None for n in VALUES})
    for b in batches:
        for iv in b["intervals"]:
            for begin, dur in hour_pieces(datetime.fromisoformat(iv["start"]), iv["duration_s"]):
                for s in iv["samples"]:
                    add(out[(s["uuid"], bucket_of(begin))], s, dur)
    return dict(out)


def add(row: dict[str, Any], s: dict[str, Any], dur: float) -> None:
    """Fold `dur` seconds of sample `s` into a bucket's expected row."""
    row["secs"] += dur
    for figure, prefix in (("util", "util"), ("mem_used_mib", "mem"), ("power_w", "power")):
        value = s.get(figure)
        if value is None:
            continue
        row[f"{prefix}_known_s"] += dur
        row[f"{prefix}_sum"] += value * dur
        top = row[f"{prefix}_max"]
        row[f"{prefix}_max"] = value if top is None else max(top, value)


def stored_rows(engine: Engine) -> dict[Key, dict[str, Any]]:
    with engine.connect() as conn:
        return {(r[0], r[1]): dict(zip(VALUES, r[2:], strict=True)) for r in conn.execute(text(BY_UUID_SQL))}


def assert_rows(got: dict[Key, dict[str, Any]], want: dict[Key, dict[str, Any]]) -> None:
    assert got.keys() == want.keys()
    for key, row in want.items():
        for n in VALUES:
            a, b = got[key][n], row[n]
            assert (a is None) == (b is None), (key, n, a, b)
            if b is not None:
                assert a == pytest.approx(b, rel=1e-9), (key, n)


def stored(client: TestClient, token: str, body: dict[str, Any]) -> None:
    r = post(client, body, token)
    assert r.status_code == 200 and r.json()["status"] == "stored", r.text


def test_buckets_are_what_their_samples_add_up_to(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = fleet()
    # 7 s past a bucket's start, 10 s intervals: some intervals straddle a bucket boundary. Eight batches of
    # twelve into four buckets, so most rows are inserted once and then updated.
    t0 = midnight(datetime.now(UTC).date() - timedelta(days=3)) + timedelta(hours=5, minutes=55, seconds=7)
    batches = [batch(gpus, start=t0 + timedelta(seconds=120 * n), intervals=12, sample_fn=varied(n)) for n in range(8)]
    for b in batches:
        stored(client, ingest_token, b)
    want = expected(batches)
    assert {k[1] for k in want} == {t0 - timedelta(seconds=7) + timedelta(minutes=5 * k) for k in range(4)}
    assert_rows(stored_rows(engine), want)
    # The hour's row is what its 5-minute rows add up to, for the columns both have.
    shared = ", ".join(f"max({n})" if n.endswith("_max") else f"sum({n})" for n in VALUES)
    with engine.connect() as conn:
        by_hour = conn.execute(
            text(f"SELECT device_id, date_trunc('hour', bucket), {shared} FROM rollups_5m GROUP BY 1, 2 ORDER BY 1, 2")
        ).all()
        hourly = conn.execute(
            text(f"SELECT device_id, hour, {', '.join(VALUES)} FROM rollups_hourly ORDER BY 1, 2")
        ).all()
    assert len(by_hour) == len(hourly) == 8  # four devices, two hours
    for g, h in zip(by_hour, hourly, strict=True):
        assert g[:2] == h[:2]
        assert list(g[2:]) == [pytest.approx(v, rel=1e-9) if v is not None else None for v in h[2:]]


def test_an_interval_is_cut_at_the_hour(client: TestClient, engine: Engine, ingest_token: str) -> None:
    gpus = [gpu(0)]
    midnight_utc = midnight(datetime.now(UTC).date() - timedelta(days=2))
    # Two 60 s intervals: [23:59:30, 00:00:30) is cut at midnight, 30 s in the day before's last bucket and 30 s in
    # the new day's first, where [00:00:30, 00:01:30) counts whole. The two rows fall in two daily partitions.
    stored(client, ingest_token, batch(gpus, start=midnight_utc - timedelta(seconds=30), intervals=2, duration_s=60))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT bucket, secs, tableoid::regclass::text FROM rollups_5m ORDER BY bucket")).all()
    before = midnight_utc.date() - timedelta(days=1)
    assert [tuple(r) for r in rows] == [
        (midnight_utc - timedelta(minutes=5), 30.0, f"rollups_5m_p{before:%Y%m%d}"),
        (midnight_utc, 90.0, f"rollups_5m_p{midnight_utc:%Y%m%d}"),
    ]


def test_a_resent_batch_is_not_counted_twice(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = batch(fleet(), intervals=6, sample_fn=varied(3))
    stored(client, ingest_token, b)
    before = stored_rows(engine)
    assert_rows(before, expected([b]))
    assert post(client, b, ingest_token).json()["status"] == "duplicate"
    assert stored_rows(engine) == before


def test_partitions_keep_free_space_for_hot_updates(engine: Engine) -> None:
    with engine.connect() as conn:
        options = conn.execute(
            text(
                "SELECT DISTINCT array_to_string(c.reloptions, ',') FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'rollups_5m'::regclass"
            )
        ).scalars()
        assert list(options) == ["fillfactor=70"]


def test_a_chart_query_reads_the_primary_key(engine: Engine) -> None:
    """One instance's devices over a window: the primary key (device_id, bucket) answers it, and only the days
    of the window are read. Seq scans are switched off, so the plan shows whether the index can be used at all
    (it could not if the ids came as another type than the column's and no operator bridged them)."""
    day = datetime.now(UTC).date() - timedelta(days=1)
    start = midnight(day)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO rollups_5m (bucket, device_id, secs) "
                "SELECT :start + b * interval '5 minutes', d, 300 "
                "FROM generate_series(0, 287) b, generate_series(1, 200) d"
            ),
            {"start": start},
        )
        conn.execute(text("ANALYZE rollups_5m"))
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = conn.execute(
            text(
                "EXPLAIN (FORMAT JSON) SELECT bucket, device_id, secs, util_sum, util_known_s, util_max "
                "FROM rollups_5m WHERE device_id = ANY(CAST(:ids AS int4[])) AND bucket >= :a AND bucket < :b"
            ),
            {"ids": [3, 4, 5, 6], "a": start + timedelta(hours=6), "b": start + timedelta(hours=18)},
        ).scalar_one()
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    types = {n["Node Type"] for n in nodes}
    assert "Seq Scan" not in types, types
    scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")]
    assert {n["Index Name"] for n in scans} == {f"rollups_5m_p{day:%Y%m%d}_pkey"}


def test_migration_backfills_what_the_write_path_builds(
    client: TestClient, engine: Engine, ingest_token: str, database_url: str
) -> None:
    """Post batches through the route; copy their inventory and samples into a fresh database at 0004 and migrate
    it to head: the back-filled rows are the ones the write path built, in partitions of the samples' days.

    The fresh database's time zone is 7 minutes off UTC, so a bucket cut from an origin read in the session's zone
    would show. One instance collects every 10 s, the other every 30 s; the first loses its interval on record in
    the copy, so the back-fill falls back to 10 s for it. The stretch after midnight starts on it: the write path
    cuts an interval at the hour, the back-fill counts it in the bucket it starts in.
    """
    a, b = fleet(), [gpu(0), gpu(1)]
    start = midnight(datetime.now(UTC).date() - timedelta(days=1)) - timedelta(minutes=20, seconds=3)
    for n in range(4):
        at = start + timedelta(minutes=10 * n, seconds=3 if n >= 2 else 0)
        stored(
            client,
            ingest_token,
            batch(a, start=at, intervals=60, duration_s=10.0, sample_fn=varied(n), instance_id="i-aaaa"),
        )
        stored(
            client,
            ingest_token,
            batch(b, start=at, intervals=20, duration_s=30.0, sample_fn=varied(10 + n), instance_id="i-bbbb"),
        )
    want = stored_rows(engine)
    with engine.connect() as conn:
        copied = {
            t: [dict(r._mapping) for r in conn.execute(t.select())]
            for t in (Base.metadata.tables[n] for n in ("instances", "gpus", "mig_slices", "samples"))
        }
    days = {r["ts"].astimezone(UTC).date() for r in copied[samples]}
    assert len(days) == 2 and len(want) == 6 * 9  # six devices; 40 minutes starting 3 s before a bucket: nine

    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = f"gpufleet_5m_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f"ALTER DATABASE \"{name}\" SET timezone = '<+0007>-00:07'")
    url = server.set(database=name).render_as_string(hide_password=False)
    eng = make_engine(url, pool_size=1)  # its sessions speak UTC; Alembic's do not
    try:
        upgrade(url, "0004")
        with eng.begin() as conn:
            for day in days:
                create_day(conn, day)  # samples only: there is no rollups_5m yet
            for table, values in copied.items():
                # Only the columns the table has at 0004: later migrations add the rest.
                present = {c["name"] for c in inspect(conn).get_columns(table.name)}
                conn.execute(table.insert(), [{k: v for k, v in row.items() if k in present} for row in values])
            conn.execute(text("UPDATE instances SET interval_s = NULL WHERE instance_id = 'i-aaaa'"))
        upgrade(url)
        assert_rows(stored_rows(eng), want)
        with eng.connect() as conn:
            made = conn.execute(
                text(
                    "SELECT c.relname, array_to_string(c.reloptions, ',') FROM pg_inherits i "
                    "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'rollups_5m'::regclass"
                )
            ).all()
        assert sorted(made) == [(f"rollups_5m_p{d:%Y%m%d}", "fillfactor=70") for d in sorted(days)]
    finally:
        eng.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
