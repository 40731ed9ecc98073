"""Holders through the real ingest route: one row per process, each interval's seconds shared among the device's
holders, idle-held seconds where the device was under a bound, memory per holder, counted once however often a
batch comes, each device's holders now, and retention with the rollups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from app.models import UTIL_BOUNDS
from app.store.holders import SUMS, holders_now
from app.store.partitions import create_day, upkeep
from tests.app.ingest.test_routes import post
from tests.factories import batch, gpu, sample

PYTHON = {
    "id": 0,
    "pid": 4242,
    "executable": "python3",
    "uid": 1000,
    "user": "ana",
    "started_at": "2026-11-20T08:00:00Z",
}
VLLM = {"id": 1, "pid": 977, "executable": "vllm", "namespace": "inference"}
ROLLUP = (
    "SELECT h.pid, r.device_id, r.mem_max_mib, {sums} FROM {table} r JOIN holders h ON h.id = r.holder_id "
    "ORDER BY h.pid, r.device_id"
)


@pytest.fixture
def t0() -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)


def story(start: datetime, held: list[tuple[float | None, list[dict[str, Any]]]], holders: list[dict[str, Any]]) -> Any:
    """A batch of 10 s intervals from `start` for GPU-a and GPU-b: per interval GPU-a's utilization and its holder
    references; GPU-b runs at 80% with no holders."""

    def fn(uid: str, i: int) -> dict[str, Any]:
        if uid == "GPU-b":
            return sample(uid, 80.0)
        util, refs = held[i]
        s = sample(uid, util, util_source="nvml.samples" if util is not None else "none")
        if refs:
            s["holders"] = refs
        return s

    b = batch([gpu(0, uid="GPU-a"), gpu(1, uid="GPU-b")], start=start, intervals=len(held), sample_fn=fn)
    if holders:
        b["holders"] = holders
    return b


def stored(client: TestClient, token: str, b: dict[str, Any], status: str = "stored") -> int:
    r = post(client, b, token)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == status
    samples: int = r.json()["samples"]
    return samples


def rollups(engine: Engine, table: str) -> list[dict[str, Any]]:
    sql = ROLLUP.format(sums=", ".join(f"r.{n}" for n in SUMS), table=table)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql))]


def one(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def device(engine: Engine, uuid: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM gpus WHERE uuid = :u"), {"u": uuid}).scalar_one())


def counts(engine: Engine) -> dict[str, int]:
    tables = ("samples", "holders", "holder_rollups_hourly", "holder_rollups_daily", "device_holders_now")
    return {t: int(one(engine, f"SELECT count(*) FROM {t}")) for t in tables}


def lt(idle: float, rest: float = 0.0) -> dict[str, float]:
    """lt{b}_s columns: `idle` seconds under every bound, `rest` more under the highest (50%) only."""
    return {f"lt{b}_s": idle + (rest if b == 50 else 0.0) for b in UTIL_BOUNDS}


SPLIT = [
    (0.0, [{"ref": 0, "used_mib": 1000}, {"ref": 1, "used_mib": 3000}]),  # idle, two holders: 5 s each
    (30.0, [{"ref": 0, "used_mib": 1000}]),  # 30%: under the 50% bound only, all 10 s python's
    (None, [{"ref": 0}, {"ref": 1, "used_mib": 3000}]),  # utilization unknown: no lt; python's memory unknown
]


def test_two_holders_share_the_device_and_its_idle_time(
    client: TestClient, engine: Engine, ingest_token: str, t0: datetime
) -> None:
    assert stored(client, ingest_token, story(t0, SPLIT, [PYTHON, VLLM])) == 6
    a = device(engine, "GPU-a")
    python = {"pid": 4242, "device_id": a, "mem_max_mib": 1000, "secs": 20.0, "mem_known_s": 20.0}
    # Utilization over its share: 0% for 5 s, 30% for 10 s, unknown for 5 s.
    python |= {"mem_mib_s": 20_000.0, **lt(5.0, 10.0), "util_known_s": 15.0, "util_sum": 300.0}
    vllm = {"pid": 977, "device_id": a, "mem_max_mib": 3000, "secs": 10.0, "mem_known_s": 20.0}
    vllm |= {"mem_mib_s": 60_000.0, **lt(5.0), "util_known_s": 5.0, "util_sum": 0.0}
    assert rollups(engine, "holder_rollups_hourly") == [pytest.approx(vllm), pytest.approx(python)]
    assert rollups(engine, "holder_rollups_daily") == rollups(engine, "holder_rollups_hourly")
    # The device's seconds with holders (30) are its holders' seconds, shared out.
    assert one(engine, "SELECT sum(secs) FROM holder_rollups_hourly") == pytest.approx(30.0)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT pid, identity, started_at, uid, user_name, namespace, first_seen, last_seen FROM holders")
        ).all()
    by_pid = {r.pid: r for r in rows}
    assert by_pid[4242].identity == f"start:{int(datetime(2026, 11, 20, 8, tzinfo=UTC).timestamp()) * 1_000_000}"
    assert (by_pid[4242].uid, by_pid[4242].user_name) == (1000, "ana")
    assert by_pid[977].identity == "exe:vllm" and by_pid[977].started_at is None
    assert by_pid[977].namespace == "inference"
    assert all(r.first_seen == t0 and r.last_seen == t0 + timedelta(seconds=30) for r in rows)


def test_a_batch_counts_once(client: TestClient, engine: Engine, ingest_token: str, t0: datetime) -> None:
    b = story(t0, SPLIT, [PYTHON, VLLM])
    stored(client, ingest_token, b)
    before, hourly = counts(engine), rollups(engine, "holder_rollups_hourly")
    assert stored(client, ingest_token, b, "duplicate") == 0
    # The same time under another batch id: its samples are counted already, so are its holders' seconds.
    again = story(t0, SPLIT, [PYTHON, VLLM])
    assert stored(client, ingest_token, again) == 0
    assert counts(engine) == before
    assert rollups(engine, "holder_rollups_hourly") == hourly


def test_the_same_process_in_two_batches_is_one_holder(
    client: TestClient, engine: Engine, ingest_token: str, t0: datetime
) -> None:
    first = [(50.0, [{"ref": 0, "used_mib": 500}, {"ref": 1}])] * 3
    stored(client, ingest_token, story(t0, first, [PYTHON, VLLM]))
    # The pod name turned up later; the next batch numbers its holders afresh; a new process reuses pid 4242.
    named = dict(PYTHON, id=1, namespace="ml", pod="train-0")
    reused = dict(PYTHON, id=0, started_at="2026-11-21T08:00:00Z")
    second = [(50.0, [{"ref": 1, "used_mib": 600}, {"ref": 2}, {"ref": 0}])] * 3
    stored(client, ingest_token, story(t0 + timedelta(seconds=30), second, [reused, named, dict(VLLM, id=2)]))
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT pid, started_at, namespace, pod, first_seen, last_seen FROM holders ORDER BY pid, started_at")
        ).all()
    assert [(r.pid, r.namespace, r.pod) for r in rows] == [
        (977, "inference", None),
        (4242, "ml", "train-0"),
        (4242, None, None),
    ]
    vllm, python, newcomer = rows
    assert (python.first_seen, python.last_seen) == (t0, t0 + timedelta(seconds=60))
    assert (vllm.first_seen, vllm.last_seen) == (t0, t0 + timedelta(seconds=60))
    assert (newcomer.first_seen, newcomer.last_seen) == (t0 + timedelta(seconds=30), t0 + timedelta(seconds=60))
    by_pid_start = {(r["pid"], r["mem_max_mib"]): r["secs"] for r in rollups(engine, "holder_rollups_hourly")}
    assert by_pid_start == pytest.approx({(977, None): 25.0, (4242, 600): 25.0, (4242, None): 10.0})


def test_who_holds_each_device_now(
    client: TestClient, engine: Engine, session: Session, ingest_token: str, t0: datetime
) -> None:
    stored(client, ingest_token, story(t0, SPLIT[:1] * 3, [PYTHON, VLLM]))
    a, b = device(engine, "GPU-a"), device(engine, "GPU-b")
    now = holders_now(session, [a, b])
    assert list(now) == [a]
    assert [(h.pid, h.used_mib, h.since, h.executable) for h in now[a]] == [
        (977, 3000, t0, "vllm"),
        (4242, 1000, t0, "python3"),
    ]
    # A newer batch in which the GPU has no holder (and no batch has any): nobody holds it now.
    stored(client, ingest_token, story(t0 + timedelta(seconds=30), [(0.0, [])] * 3, []))
    session.rollback()
    assert holders_now(session, [a, b]) == {}
    # Then vllm alone: the device's rows are replaced; vllm's row kept its start on the device.
    stored(client, ingest_token, story(t0 + timedelta(seconds=60), [(0.0, [{"ref": 1, "used_mib": 2900}])] * 3, [VLLM]))
    session.rollback()
    assert [(h.pid, h.used_mib, h.since) for h in holders_now(session, [a])[a]] == [(977, 2900, t0)]
    assert one(engine, "SELECT count(*) FROM device_holders_now") == 1
    # A replayed older batch changes nothing of now.
    stored(client, ingest_token, story(t0 - timedelta(seconds=60), SPLIT[:1] * 3, [PYTHON, VLLM]))
    session.rollback()
    assert [(h.pid, h.used_mib) for h in holders_now(session, [a])[a]] == [(977, 2900)]


def test_strings_are_stored_verbatim(client: TestClient, engine: Engine, ingest_token: str, t0: datetime) -> None:
    script = "<script>alert('x')</script>"
    holder = dict(PYTHON, executable=script, user="o'brien", command='sh -c "echo <b>&amp;</b>"')
    stored(client, ingest_token, story(t0, SPLIT[:1], [holder, VLLM]))
    with engine.connect() as conn:
        row = conn.execute(text("SELECT executable, user_name, command FROM holders WHERE pid = 4242")).one()
    assert tuple(row) == (script, "o'brien", 'sh -c "echo <b>&amp;</b>"')


def test_a_batch_without_holders_is_as_before(
    client: TestClient, engine: Engine, ingest_token: str, t0: datetime
) -> None:
    b = story(t0, [(10.0, [])] * 3, [])
    assert "holders" not in b and not any("holders" in s for iv in b["intervals"] for s in iv["samples"])
    assert stored(client, ingest_token, b) == 6
    assert counts(engine) == {
        "samples": 6,
        "holders": 0,
        "holder_rollups_hourly": 0,
        "holder_rollups_daily": 0,
        "device_holders_now": 0,
    }


def test_holders_go_with_the_rollups(client: TestClient, engine: Engine, ingest_token: str, t0: datetime) -> None:
    stored(client, ingest_token, story(t0, SPLIT, [PYTHON, VLLM]))
    assert counts(engine)["device_holders_now"] == counts(engine)["holder_rollups_daily"] == 2
    vllm = "(SELECT id FROM holders WHERE pid = 977)"
    with engine.begin() as conn:
        # vllm as if last seen 500 days ago, past the 400 days the rollups are kept.
        conn.execute(text("UPDATE holders SET last_seen = now() - interval '500 days' WHERE pid = 977"))
        conn.execute(text(f"UPDATE device_holders_now SET ts = now() - interval '500 days' WHERE holder_id = {vllm}"))
        conn.execute(text(f"UPDATE holder_rollups_daily SET day = day - interval '500 days' WHERE holder_id = {vllm}"))
        # Holders are looked at when a month of rollups goes: one 430 days back does.
        create_day(conn, (datetime.now(UTC) - timedelta(days=430)).date())
        upkeep(conn, now=datetime.now(UTC), raw_retention_days=14, rollup_retention_days=400, ahead_days=3)
    assert one(engine, "SELECT array_agg(pid) FROM holders") == [4242]
    python = "(SELECT id FROM holders WHERE pid = 4242)"
    assert one(engine, f"SELECT count(*) FILTER (WHERE holder_id <> {python}) FROM device_holders_now") == 0
    assert one(engine, f"SELECT count(*) FILTER (WHERE holder_id <> {python}) FROM holder_rollups_daily") == 0
    assert counts(engine)["device_holders_now"] == counts(engine)["holder_rollups_daily"] == 1
