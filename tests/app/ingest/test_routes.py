"""POST /api/v1/ingest over HTTP against a real PostgreSQL."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.auth import revoke_token
from app.db import session_scope
from tests.conftest import make_token
from tests.factories import batch, gpu, mig_slice, now_floor, sample

URL = "/api/v1/ingest"


def post(client: TestClient, body: Any, token: str | None, **headers: str) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **headers}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    return client.post(URL, content=data, headers=h)


def count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def written(engine: Engine) -> dict[str, int]:
    return {
        t: count(engine, t)
        for t in ("instances", "gpus", "mig_slices", "ingest_batches", "samples", "rollups_hourly", "events")
    }


def mixed_batch(**kw: Any) -> dict[str, Any]:
    return batch([gpu(0), gpu(1, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)], **kw)


def test_stores_batch_and_rows(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch(intervals=3)
    r = post(client, b, ingest_token)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "stored", "batch_id": b["batch_id"], "samples": 12}
    counts = written(engine)
    assert counts["rollups_hourly"] in (4, 8)  # 4 devices, in one hour or across an hour boundary
    del counts["rollups_hourly"]
    assert counts == {"instances": 1, "gpus": 2, "mig_slices": 2, "ingest_batches": 1, "samples": 12, "events": 0}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT util, util_source, power_w, temp_c, procs, mem_used_mib FROM samples s "
                "JOIN mig_slices m ON m.id = s.device_id"
            )
        ).all()
        assert {(r.util, r.util_source, r.power_w, r.temp_c) for r in rows} == {(None, 0, None, None)}
        inst = conn.execute(text("SELECT instance_type, lifecycle, tags FROM instances")).one()
        assert inst.instance_type == "p4d.24xlarge" and inst.tags == {"team": "research"}
        reason = conn.execute(text("SELECT DISTINCT util_reason FROM mig_slices")).scalar_one()
        assert reason.startswith("A100 MIG")


def test_same_batch_twice_is_stored_once(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    first = post(client, b, ingest_token)
    second = post(client, b, ingest_token)
    assert first.status_code == second.status_code == 200
    assert second.json()["status"] == "duplicate"
    assert count(engine, "samples") == 12
    assert count(engine, "ingest_batches") == 1
    with engine.connect() as conn:
        secs = conn.execute(text("SELECT sum(secs) FROM rollups_hourly")).scalar_one()
    assert secs == pytest.approx(12 * 10.0)


def test_gzip_body(client: TestClient, engine: Engine, ingest_token: str) -> None:
    body = gzip.compress(json.dumps(mixed_batch()).encode())
    r = post(client, body, ingest_token, **{"Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert count(engine, "samples") == 12


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_bad_token_is_401_and_writes_nothing(client: TestClient, engine: Engine, header: str | None) -> None:
    h = {"Content-Type": "application/json"}
    if header is not None:
        h["Authorization"] = header
    r = client.post(URL, content=json.dumps(mixed_batch()).encode(), headers=h)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "error" in r.json()
    assert sum(written(engine).values()) == 0


def test_revoked_token_is_401(client: TestClient, engine: Engine, sessions: sessionmaker[Session]) -> None:
    secret = make_token(sessions, "ingest", name="to-revoke")
    assert post(client, mixed_batch(), secret).status_code == 200
    with session_scope(sessions) as s:
        from datetime import UTC, datetime

        assert revoke_token(s, "to-revoke", now=datetime.now(UTC)) is not None
    r = post(client, mixed_batch(), secret)
    assert r.status_code == 401 and r.json()["error"] == "token revoked"


def test_read_token_cannot_ingest_but_admin_can(
    client: TestClient, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    assert post(client, mixed_batch(), make_token(sessions, "read")).status_code == 403
    assert count(engine, "samples") == 0
    assert post(client, mixed_batch(), make_token(sessions, "admin")).status_code == 200


def _set(path: str, value: Any) -> Any:
    """A mutation of a valid batch: set the dotted/indexed `path` to `value`."""

    def mutate(b: dict[str, Any]) -> None:
        node: Any = b
        parts = path.replace("]", "").replace("[", ".").split(".")
        for p in parts[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        last = parts[-1]
        node[int(last) if last.isdigit() else last] = value

    return mutate


BAD = [
    ("intervals[0].samples[0].util", 101.5, 422),
    ("intervals[0].samples[0].util", -1, 422),
    ("intervals[0].samples[0].util", "busy", 422),
    ("intervals[0].samples[0].mem_used_mib", -5, 422),
    ("intervals[0].samples[0].procs", 1.5, 422),
    ("intervals[0].samples[0].util_source", "magic", 422),
    ("intervals[0].samples[0].uuid", "GPU-unknown", 422),
    ("intervals[0].duration_s", 0, 422),
    ("intervals[0].start", "yesterday", 422),
    ("intervals[0].start", "2026-01-01T00:00:00", 422),  # no offset: ambiguous
    ("instance.lifecycle", "reserved", 422),
    ("instance.instance_id", "", 422),
    ("gpus[1].slices[0].compute_slices", 8, 422),
    ("batch_id", "not-a-uuid", 422),
    ("gpus", "all of them", 422),
]


@pytest.mark.parametrize(("path", "value", "status"), BAD)
def test_invalid_field_is_named_and_nothing_written(
    client: TestClient, engine: Engine, ingest_token: str, path: str, value: Any, status: int
) -> None:
    b = mixed_batch()
    _set(path, value)(b)
    r = post(client, b, ingest_token)
    assert r.status_code == status, r.text
    body = r.json()
    fields = [d["field"] for d in body["detail"]]
    assert any(f.startswith(path.split("[")[0]) for f in fields), body
    assert sum(written(engine).values()) == 0


def test_util_without_source_is_rejected(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    b["intervals"][0]["samples"][0]["util_source"] = "none"
    r = post(client, b, ingest_token)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "intervals[0].samples[0]"
    assert "util_source" in r.json()["detail"][0]["message"]


def test_future_timestamp_beyond_skew(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch(start=now_floor() + timedelta(minutes=10))
    r = post(client, b, ingest_token)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "intervals[0].start"
    assert "ahead of the server clock" in r.json()["detail"][0]["message"]
    assert sum(written(engine).values()) == 0


def test_small_future_skew_is_accepted(client: TestClient, engine: Engine, ingest_token: str) -> None:
    assert post(client, mixed_batch(start=now_floor() + timedelta(seconds=60)), ingest_token).status_code == 200


def test_older_than_retention_is_rejected(client: TestClient, engine: Engine, ingest_token: str) -> None:
    r = post(client, mixed_batch(start=now_floor() - timedelta(days=15)), ingest_token)
    assert r.status_code == 422
    assert "retention" in r.json()["detail"][0]["message"]


def test_unknown_schema_version(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    b["schema_version"] = 2
    r = post(client, b, ingest_token)
    assert r.status_code == 422
    assert "schema_version" in r.json()["error"]
    assert r.json()["detail"][0]["field"] == "schema_version"


def test_bad_json(client: TestClient, engine: Engine, ingest_token: str) -> None:
    r = post(client, b'{"schema_version": 1,', ingest_token)
    assert r.status_code == 400
    assert r.json()["error"].startswith("body is not valid JSON")


def test_bad_gzip(client: TestClient, engine: Engine, ingest_token: str) -> None:
    r = post(client, b"definitely not gzip", ingest_token, **{"Content-Encoding": "gzip"})
    assert r.status_code == 400


def test_unsupported_encoding_and_type(client: TestClient, engine: Engine, ingest_token: str) -> None:
    assert post(client, mixed_batch(), ingest_token, **{"Content-Encoding": "br"}).status_code == 415
    assert post(client, mixed_batch(), ingest_token, **{"Content-Type": "text/csv"}).status_code == 415


def test_oversize_body_is_413(client: TestClient, engine: Engine, ingest_token: str) -> None:
    limit = client.app.state.gpufleet.settings.max_body_bytes  # type: ignore[attr-defined]
    r = post(client, b" " * (limit + 1), ingest_token)
    assert r.status_code == 413
    assert "limit" in r.json()["error"]


def test_gzip_bomb_is_413(client: TestClient, engine: Engine, ingest_token: str) -> None:
    limit = client.app.state.gpufleet.settings.max_body_bytes  # type: ignore[attr-defined]
    bomb = gzip.compress(b" " * (limit * 2))
    assert len(bomb) < limit
    r = post(client, bomb, ingest_token, **{"Content-Encoding": "gzip"})
    assert r.status_code == 413


def test_failure_midway_leaves_no_rows(client: TestClient, engine: Engine, ingest_token: str) -> None:
    """A batch whose samples cannot be stored (no partition for their day) rolls back its inventory too."""
    start = now_floor() - timedelta(days=2)
    day = start.date()
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE samples_p{day:%Y%m%d}"))
    client.app.state.gpufleet.partitions.forget()  # type: ignore[attr-defined]
    # The ingest path recreates missing partitions itself: this batch succeeds.
    assert post(client, mixed_batch(start=start), ingest_token).status_code == 200
    # Now break the COPY for real: a smallint overflow on power after validation allowed it.
    b = mixed_batch(instance_id="i-0fffffffffffffff0")
    b["intervals"][1]["samples"][0]["power_w"] = 29999.0
    b["intervals"][2]["samples"][0]["temp_c"] = 250
    before = written(engine)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE samples ADD CONSTRAINT ck_test_power CHECK (power_w < 20000) NOT VALID"))
    try:
        r = post(client, b, ingest_token)
        # A server error, in the error shape, without the traceback.
        assert r.status_code == 500 and r.json() == {"error": "internal server error", "detail": []}
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE samples DROP CONSTRAINT ck_test_power"))
    assert written(engine) == before


def test_samples_and_rollups_values(client: TestClient, engine: Engine, ingest_token: str) -> None:
    g = gpu(0)
    utils = [0.0, 0.5, 3.0, 20.0, 80.0, 100.0]

    def values(uid: str, i: int) -> dict[str, Any]:
        # procs 0 and little memory in the first three intervals: those are "free" seconds.
        return sample(
            uid,
            utils[i],
            procs=0 if i < 3 else 2,
            mem_used_mib=10 if i < 3 else 5000,
            power_w=100.0 + i,
            temp_c=40 + i,
            sm_active=utils[i] / 2,
        )

    start = now_floor().replace(minute=0, second=0) - timedelta(hours=1)
    r = post(client, batch([g], start=start, intervals=6, sample_fn=values), ingest_token)
    assert r.status_code == 200, r.text
    with engine.connect() as conn:
        roll = conn.execute(text("SELECT * FROM rollups_hourly")).mappings().one()
    assert roll["hour"] == start
    assert roll["secs"] == pytest.approx(60)
    assert roll["util_known_s"] == pytest.approx(60)
    assert roll["util_sum"] == pytest.approx(sum(utils) * 10)
    assert roll["util_max"] == pytest.approx(100)
    assert roll["sm_sum"] == pytest.approx(sum(utils) / 2 * 10)
    assert roll["mem_sum"] == pytest.approx((3 * 10 + 3 * 5000) * 10)
    assert roll["mem_max"] == 5000
    assert roll["power_sum"] == pytest.approx(sum(100 + i for i in range(6)) * 10)
    assert roll["temp_max"] == 45
    assert roll["no_proc_s"] == pytest.approx(30)
    assert roll["mem_held_s"] == pytest.approx(30)
    assert roll["util_lt1_s"] == pytest.approx(20)
    assert roll["util_lt5_s"] == pytest.approx(30)
    assert roll["util_lt25_s"] == pytest.approx(40)
    assert roll["util_lt50_s"] == pytest.approx(40)
    assert roll["free_lt1_s"] == pytest.approx(20)
    assert roll["free_lt25_s"] == pytest.approx(30)
    # A second batch for the same hour adds to the same rollup row.
    r = post(client, batch([g], start=start + timedelta(minutes=1), intervals=6, sample_fn=values), ingest_token)
    assert r.status_code == 200
    with engine.connect() as conn:
        roll = conn.execute(text("SELECT secs, util_max, free_lt1_s FROM rollups_hourly")).one()
    assert (roll.secs, roll.util_max, roll.free_lt1_s) == (pytest.approx(120), pytest.approx(100), pytest.approx(40))


def test_interval_straddling_hour_is_split_between_hours(client: TestClient, engine: Engine, ingest_token: str) -> None:
    hour = now_floor().replace(minute=0, second=0)
    # Two 10 s intervals: [hour - 5 s, hour + 5 s) and [hour + 5 s, hour + 15 s): each hour gets its own seconds.
    b = batch([gpu(0)], start=hour - timedelta(seconds=5), intervals=2)
    assert post(client, b, ingest_token).status_code == 200
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT hour, secs FROM rollups_hourly ORDER BY hour")).all()
    assert [(r.hour, r.secs) for r in rows] == [(hour - timedelta(hours=1), 5.0), (hour, 15.0)]


def test_agent_events_and_dropped_count(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    b["agent"]["dropped_batches"] = 3
    b["events"] = [
        {
            "ts": now_floor().isoformat(),
            "kind": "spot_interruption",
            "details": {"action": "terminate", "time": "2026-11-21T10:00:00Z"},
        }
    ]
    assert post(client, b, ingest_token).status_code == 200
    with engine.connect() as conn:
        kinds = sorted(conn.execute(text("SELECT kind FROM events")).scalars())
        dropped = conn.execute(text("SELECT dropped_batches FROM ingest_batches")).scalar_one()
    assert kinds == ["agent_dropped_batches", "spot_interruption"]
    assert dropped == 3


def test_openapi_describes_ingest_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/IngestBatchIn"}
    schemas = spec["components"]["schemas"]
    assert {"IngestBatchIn", "SampleIn", "GpuIn", "SliceIn", "InstanceIn", "IntervalIn"} <= set(schemas)
    assert schemas["SampleIn"]["properties"]["util"]["anyOf"][0]["maximum"] == 100
