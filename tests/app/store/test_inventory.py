"""Inventory upserts through the ingest API: moves and reconfigurations are recorded, not overwritten."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.app.ingest.test_routes import post
from tests.factories import batch, gpu, mig_slice, now_floor, unsized_slice


def events(engine: Engine) -> list[tuple[str, dict[str, Any]]]:
    with engine.connect() as conn:
        return [(r.kind, r.details) for r in conn.execute(text("SELECT kind, details FROM events ORDER BY id"))]


def test_gpu_moving_to_another_instance_is_recorded(client: TestClient, engine: Engine, ingest_token: str) -> None:
    g = gpu(0)
    assert post(client, batch([g], instance_id="i-aaaa"), ingest_token).status_code == 200
    assert post(client, batch([g], instance_id="i-bbbb"), ingest_token).status_code == 200
    with engine.connect() as conn:
        owner = conn.execute(
            text("SELECT i.instance_id FROM gpus g JOIN instances i ON i.id = g.instance_pk")
        ).scalar_one()
        old_pk = conn.execute(text("SELECT id FROM instances WHERE instance_id = 'i-aaaa'")).scalar_one()
        device_ids = conn.execute(text("SELECT DISTINCT device_id FROM samples")).scalars().all()
    assert owner == "i-bbbb"
    assert len(device_ids) == 1  # same device, its history continues
    assert events(engine) == [("gpu_moved", {"uuid": g["uuid"], "from_instance_pk": old_pk})]


def test_mig_reconfiguration_retires_old_slice(client: TestClient, engine: Engine, ingest_token: str) -> None:
    t0 = now_floor() - timedelta(minutes=10)
    parent = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), mig_slice(2, "3g.20gb")], unpartitioned=1)
    assert post(client, batch([parent], start=t0), ingest_token).status_code == 200
    old_uuid = parent["slices"][1]["uuid"]
    # Same GPU instance id 2, new profile and new UUID; slot 1 untouched.
    parent2 = dict(parent, slices=[parent["slices"][0], mig_slice(2, "2g.10gb")], unpartitioned_slices=2)
    t1 = t0 + timedelta(minutes=5)
    assert post(client, batch([parent2], start=t1), ingest_token).status_code == 200
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT uuid, profile, compute_slices, retired_at FROM mig_slices WHERE gpu_instance_id = 2 ORDER BY id"
            )
        ).all()
        free = conn.execute(text("SELECT unpartitioned_slices FROM gpus")).scalar_one()
        per_slice = dict(
            conn.execute(
                text(
                    "SELECT m.profile, count(*) FROM samples s JOIN mig_slices m ON m.id = s.device_id "
                    "WHERE m.gpu_instance_id = 2 GROUP BY 1"
                )
            ).all()
        )
    assert [(r.uuid, r.profile, r.compute_slices) for r in rows] == [
        (old_uuid, "3g.20gb", 3),
        (parent2["slices"][1]["uuid"], "2g.10gb", 2),
    ]
    assert rows[0].retired_at == t1 and rows[1].retired_at is None
    assert free == 2
    assert per_slice == {"3g.20gb": 3, "2g.10gb": 3}  # old samples stay with the old profile
    kinds = events(engine)
    assert [k for k, _ in kinds] == ["mig_reconfigured"]
    assert kinds[0][1]["old_profile"] == "3g.20gb" and kinds[0][1]["new_profile"] == "2g.10gb"


def test_same_uuid_new_profile_is_a_new_row(client: TestClient, engine: Engine, ingest_token: str) -> None:
    sl = mig_slice(1, "3g.20gb")
    parent = gpu(0, mig=True, slices=[sl])
    assert post(client, batch([parent]), ingest_token).status_code == 200
    changed = dict(sl, profile="4g.20gb", compute_slices=4)
    assert post(client, batch([dict(parent, slices=[changed])]), ingest_token).status_code == 200
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT profile, retired_at IS NULL AS live FROM mig_slices ORDER BY id")).all()
    assert [(r.profile, r.live) for r in rows] == [("3g.20gb", False), ("4g.20gb", True)]


def test_removed_slice_is_retired(client: TestClient, engine: Engine, ingest_token: str) -> None:
    parent = gpu(0, mig=True, slices=[mig_slice(1), mig_slice(2)])
    assert post(client, batch([parent]), ingest_token).status_code == 200
    assert post(client, batch([dict(parent, slices=parent["slices"][:1])]), ingest_token).status_code == 200
    with engine.connect() as conn:
        live = conn.execute(text("SELECT count(*) FROM mig_slices WHERE retired_at IS NULL")).scalar_one()
    assert live == 1
    assert [k for k, _ in events(engine)] == ["mig_slice_removed"]


def test_unchanged_inventory_writes_no_events(client: TestClient, engine: Engine, ingest_token: str) -> None:
    parent = gpu(0, mig=True, slices=[mig_slice(1), mig_slice(2)])
    for _ in range(3):
        assert post(client, batch([parent, gpu(1)]), ingest_token).status_code == 200
    assert events(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM mig_slices")).scalar_one() == 2


def test_instance_type_change_is_an_event(client: TestClient, engine: Engine, ingest_token: str) -> None:
    t0 = now_floor() - timedelta(minutes=30)
    assert post(client, batch([gpu(0)], start=t0, instance_type="g5.xlarge"), ingest_token).status_code == 200
    later = batch([gpu(0)], start=t0 + timedelta(minutes=10), instance_type="g5.2xlarge", lifecycle="spot")
    assert post(client, later, ingest_token).status_code == 200
    fields = sorted(d["field"] for k, d in events(engine) if k == "instance_changed")
    assert fields == ["instance_type", "lifecycle"]


def test_replayed_old_batch_keeps_newer_identity(client: TestClient, engine: Engine, ingest_token: str) -> None:
    t0 = now_floor() - timedelta(hours=2)
    new = batch([gpu(0)], start=t0 + timedelta(hours=1), tags={"team": "new"})
    old = batch([gpu(0)], start=t0, tags={"team": "old"})
    assert post(client, new, ingest_token).status_code == 200
    assert post(client, old, ingest_token).status_code == 200
    with engine.connect() as conn:
        row = conn.execute(text("SELECT tags, first_seen, last_seen FROM instances")).one()
    assert row.tags == {"team": "new"}
    assert row.first_seen == t0
    assert row.last_seen == t0 + timedelta(hours=1, seconds=30)


def test_replayed_old_batch_does_not_undo_reconfiguration(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    t0 = now_floor() - timedelta(hours=1)
    old_layout = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), mig_slice(2, "3g.20gb")])
    new_layout = dict(old_layout, slices=[mig_slice(1, "7g.40gb")])
    unseen_old = dict(old_layout, slices=[mig_slice(1, "4g.20gb")])
    assert post(client, batch([old_layout], start=t0), ingest_token).status_code == 200
    assert post(client, batch([new_layout], start=t0 + timedelta(minutes=30)), ingest_token).status_code == 200
    before = events(engine)
    # Spool replay: batches taken before the reconfiguration arrive after it.
    assert post(client, batch([old_layout], start=t0 + timedelta(minutes=1)), ingest_token).status_code == 200
    assert post(client, batch([unseen_old], start=t0 + timedelta(minutes=2)), ingest_token).status_code == 200
    assert events(engine) == before
    with engine.connect() as conn:
        live = conn.execute(text("SELECT profile FROM mig_slices WHERE retired_at IS NULL")).scalars().all()
        per_profile = {
            profile: n
            for profile, n in conn.execute(
                text("SELECT m.profile, count(*) FROM samples s JOIN mig_slices m ON m.id = s.device_id GROUP BY 1")
            )
        }
    assert live == ["7g.40gb"]
    assert per_profile == {"3g.20gb": 12, "7g.40gb": 3, "4g.20gb": 3}


def test_layout_and_permission_gaps_follow_the_newest_batch(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    t0 = now_floor() - timedelta(minutes=30)
    refused = [{"figure": "mem_used_mib", "call": "nvmlDeviceGetMemoryInfo", "grant": "mig-monitor"}]
    plain = gpu(0, mig=True, slices=[mig_slice(1)], unpartitioned=4)
    gaps = dict(plain, layout_complete=False, permission_denied=refused)

    def stored() -> tuple[bool, list[dict[str, str]], Any]:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT layout_complete, permission_denied, updated_at FROM gpus")).one()
        return row.layout_complete, row.permission_denied, row.updated_at

    assert post(client, batch([plain], start=t0), ingest_token).status_code == 200
    assert stored() == (True, [], t0)
    # Same hardware otherwise: the per-process inventory cache must not skip the change.
    assert post(client, batch([gaps], start=t0 + timedelta(minutes=5)), ingest_token).status_code == 200
    assert stored() == (False, refused, t0 + timedelta(minutes=5))
    assert post(client, batch([gaps], start=t0 + timedelta(minutes=6)), ingest_token).status_code == 200
    assert stored()[2] == t0 + timedelta(minutes=5)  # unchanged: not written again
    # An older replay does not bring the old state back; a newer batch without them clears them.
    assert post(client, batch([plain], start=t0 + timedelta(minutes=1)), ingest_token).status_code == 200
    assert stored()[:2] == (False, refused)
    assert post(client, batch([plain], start=t0 + timedelta(minutes=10)), ingest_token).status_code == 200
    assert stored() == (True, [], t0 + timedelta(minutes=10))
    assert events(engine) == []


def test_a_slice_of_unknown_size_is_one_live_row_until_it_gets_a_size(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    t0 = now_floor() - timedelta(minutes=30)
    unsized = unsized_slice(2)
    parent = gpu(0, mig=True, slices=[mig_slice(1), unsized], unpartitioned=None)
    for minutes in (0, 5):
        assert post(client, batch([parent], start=t0 + timedelta(minutes=minutes)), ingest_token).status_code == 200

    def rows() -> list[tuple[str, int | None, bool]]:
        with engine.connect() as conn:
            return [
                (r.profile, r.compute_slices, r.retired_at is None)
                for r in conn.execute(
                    text(
                        "SELECT profile, compute_slices, retired_at FROM mig_slices "
                        "WHERE gpu_instance_id = 2 ORDER BY id"
                    )
                )
            ]

    assert rows() == [("unknown", None, True)]
    assert events(engine) == []
    # Read at last: samples taken while its size was unknown stay with the unsized row.
    sized = dict(unsized, profile="2g.10gb", compute_slices=2)
    later = batch([dict(parent, slices=[parent["slices"][0], sized])], start=t0 + timedelta(minutes=10))
    assert post(client, later, ingest_token).status_code == 200
    assert rows() == [("unknown", None, False), ("2g.10gb", 2, True)]
    [(kind, details)] = events(engine)
    assert kind == "mig_reconfigured" and (details["old_profile"], details["new_profile"]) == ("unknown", "2g.10gb")
