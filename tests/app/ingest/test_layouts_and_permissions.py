"""What wire format v1 gained for what the agent could not read: `layout_complete` and `permission_denied` per
GPU, and a slice whose `compute_slices` is null. Stored as sent, defaulted for older agents, checked by field."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.app.ingest.test_routes import _set, mixed_batch, post, written
from tests.factories import batch, gpu, mig_slice, unsized_slice

REFUSED = [
    {"figure": "mem_used_mib", "call": "nvmlDeviceGetMemoryInfo", "grant": "mig-monitor"},
    {"figure": "gr_active", "call": "nvmlGpmSampleGet", "grant": "cap-sys-admin"},
    {"figure": "fan_speed", "call": "nvmlDeviceGetFanSpeed_v2", "grant": "root-of-all"},  # keys newer than us
]


def gpu_rows(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            r.uuid: r for r in conn.execute(text("SELECT uuid, mig_mode, layout_complete, permission_denied FROM gpus"))
        }


def slice_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT uuid, profile, compute_slices, memory_total_mib, retired_at FROM mig_slices ORDER BY id")
            )
        )


def test_new_fields_are_stored_as_sent(client: TestClient, engine: Engine, ingest_token: str) -> None:
    mig = gpu(1, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=None)
    mig.update(layout_complete=False, permission_denied=REFUSED)
    r = post(client, batch([gpu(0), mig]), ingest_token)
    assert r.status_code == 200, r.text
    rows = gpu_rows(engine)
    assert rows[mig["uuid"]].layout_complete is False
    assert rows[mig["uuid"]].permission_denied == REFUSED  # unknown keys too, in the order sent
    slices = {s.uuid: s for s in slice_rows(engine)}
    unsized = slices[mig["slices"][1]["uuid"]]
    assert (unsized.profile, unsized.compute_slices, unsized.memory_total_mib) == ("unknown", None, None)
    assert slices[mig["slices"][0]["uuid"]].compute_slices == 3
    # The unsized slice is a device like any other: its samples are stored.
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM samples s JOIN mig_slices m ON m.id = s.device_id WHERE m.compute_slices IS NULL"
            )
        ).scalar_one()
    assert n == 3


def test_an_older_agent_gets_the_defaults(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    for g in b["gpus"]:
        assert "layout_complete" not in g and "permission_denied" not in g
    assert post(client, b, ingest_token).status_code == 200
    assert {(r.layout_complete, tuple(r.permission_denied)) for r in gpu_rows(engine).values()} == {(True, ())}
    assert all(s.compute_slices is not None for s in slice_rows(engine))


def test_compute_slices_may_be_left_out_and_any_profile_kept(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    unsized = mig_slice(1, "3g.20gb")
    del unsized["compute_slices"]
    assert post(client, batch([gpu(0, mig=True, slices=[unsized])]), ingest_token).status_code == 200
    assert [(s.profile, s.compute_slices) for s in slice_rows(engine)] == [("3g.20gb", None)]


def test_limits_are_inclusive(client: TestClient, engine: Engine, ingest_token: str) -> None:
    g = gpu(0)
    g["permission_denied"] = [
        {"figure": "f" * 64, "call": "c" * 96, "grant": "g" * 32},
        *[{"figure": f"x{i}", "call": "nvmlX", "grant": "device-access"} for i in range(31)],
    ]
    assert post(client, batch([g]), ingest_token).status_code == 200
    assert len(gpu_rows(engine)[g["uuid"]].permission_denied) == 32


GOOD_ITEM = {"figure": "procs", "call": "nvmlDeviceGetComputeRunningProcesses_v3", "grant": "mig-monitor"}
BAD = [
    ("gpus[1].permission_denied[0].grant", "g" * 33),
    ("gpus[1].permission_denied[0].grant", ""),
    ("gpus[1].permission_denied[0].figure", "f" * 65),
    ("gpus[1].permission_denied[0].figure", None),
    ("gpus[1].permission_denied[0].call", "c" * 97),
    ("gpus[1].permission_denied[0].call", 7),
    ("gpus[1].permission_denied", [GOOD_ITEM] * 33),
    ("gpus[1].permission_denied", {"procs": "mig-monitor"}),
    ("gpus[1].layout_complete", "perhaps"),
    ("gpus[1].slices[0].compute_slices", 0),
    ("gpus[1].slices[0].compute_slices", 8),
]


@pytest.mark.parametrize(("path", "value"), BAD)
def test_a_bad_value_is_422_naming_the_field(
    client: TestClient, engine: Engine, ingest_token: str, path: str, value: Any
) -> None:
    b = mixed_batch()
    b["gpus"][1]["permission_denied"] = [dict(GOOD_ITEM)]
    _set(path, value)(b)
    r = post(client, b, ingest_token)
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["detail"]]
    assert fields and all(f.startswith(path) for f in fields), fields
    assert sum(written(engine).values()) == 0


def test_a_missing_key_in_an_item_is_named(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = mixed_batch()
    b["gpus"][0]["permission_denied"] = [{"figure": "procs", "call": "nvmlDeviceGetComputeRunningProcesses_v3"}]
    r = post(client, b, ingest_token)
    assert r.status_code == 422
    assert [d["field"] for d in r.json()["detail"]] == ["gpus[0].permission_denied[0].grant"]


def test_openapi_describes_the_new_fields(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    gpu_props = schemas["GpuIn"]["properties"]
    assert gpu_props["layout_complete"]["default"] is True and gpu_props["layout_complete"]["description"]
    assert gpu_props["permission_denied"]["maxItems"] == 32
    item = schemas["PermissionDeniedIn"]["properties"]
    assert (item["figure"]["maxLength"], item["call"]["maxLength"], item["grant"]["maxLength"]) == (64, 96, 32)
    assert set(schemas["PermissionDeniedIn"]["required"]) == {"figure", "call", "grant"}
    assert "compute_slices" not in schemas["SliceIn"].get("required", [])
    assert "unknown" in schemas["SliceIn"]["properties"]["compute_slices"]["description"]
