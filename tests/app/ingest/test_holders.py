"""Holders on the wire: the bounds docs/ingest-protocol.md states ("Holders") are checked, a batch that breaks one
gets 422 naming the field and writes nothing (not even its samples), and a batch without holders is as before."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from tests.app.ingest.test_strict import assert_refused, base, post_raw

HOLDER_TABLES = (
    "holders",
    "holder_rollups_hourly",
    "holder_rollups_daily",
    "holder_groups_hourly",
    "holder_groups_daily",
    "device_holders_now",
)
Edit = Callable[[dict[str, Any]], None]


def with_holders(b: dict[str, Any]) -> dict[str, Any]:
    """`b` with two holders, both on the first device in every interval."""
    b["holders"] = [
        {
            "id": 0,
            "pid": 4242,
            "executable": "python3",
            "uid": 1000,
            "user": "ana",
            "started_at": "2026-11-20T08:00:00Z",
        },
        {"id": 1, "pid": 977, "executable": "vllm", "namespace": "inference", "pod": "vllm-0"},
    ]
    for iv in b["intervals"]:
        iv["samples"][0]["holders"] = [{"ref": 0, "used_mib": 1024}, {"ref": 1}]
    return b


def holder_rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in HOLDER_TABLES}


def _set(path: list[str | int], value: Any) -> Edit:
    def edit(b: dict[str, Any]) -> None:
        with_holders(b)
        node: Any = b
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _too_many_refs(b: dict[str, Any]) -> None:
    with_holders(b)
    b["holders"] = [{"id": i, "pid": 100 + i} for i in range(65)]
    b["intervals"][0]["samples"][0]["holders"] = [{"ref": i} for i in range(65)]


def _too_many_holders(b: dict[str, Any]) -> None:
    with_holders(b)
    b["holders"] = [{"id": i % 4096, "pid": 100 + i} for i in range(4097)]


SAMPLE_REF = ["intervals", 0, "samples", 0, "holders"]
CASES: list[tuple[str, Edit]] = [
    ("holders[0].executable", _set(["holders", 0, "executable"], "x" * 254)),
    ("holders[1].user", _set(["holders", 1, "user"], "a\nb")),
    ("holders[1].pod", _set(["holders", 1, "pod"], "")),
    ("holders[0].command", _set(["holders", 0, "command"], "c" * 1025)),
    ("holders[0].container_id", _set(["holders", 0, "container_id"], "f" * 129)),
    ("holders[0].pid", _set(["holders", 0, "pid"], 0)),
    ("holders[0].pid", _set(["holders", 0, "pid"], 2**22 + 1)),
    ("holders[0].uid", _set(["holders", 0, "uid"], 2**32 - 1)),
    ("holders[0].uid", _set(["holders", 0, "uid"], -1)),
    ("holders[0].started_at", _set(["holders", 0, "started_at"], "1700000000")),
    ("holders[0].started_at", _set(["holders", 0, "started_at"], "1999-12-31T23:59:59Z")),
    ("holders[0].id", _set(["holders", 0, "id"], 4096)),
    ("holders[1].id", _set(["holders", 1, "id"], 0)),
    ("intervals[0].samples[0].holders[1].ref", _set([*SAMPLE_REF, 1, "ref"], 7)),
    ("intervals[0].samples[0].holders[1].ref", _set([*SAMPLE_REF, 1], {"ref": 0})),
    ("intervals[0].samples[0].holders[0].used_mib", _set([*SAMPLE_REF, 0, "used_mib"], 2**31)),
    ("intervals[0].samples[0].holders", _too_many_refs),
    ("holders", _too_many_holders),
]


@pytest.mark.parametrize(("field", "edit"), CASES, ids=[f"{f}-{i}" for i, (f, _e) in enumerate(CASES)])
def test_a_bad_holder_is_refused_and_nothing_is_written(
    client: TestClient, engine: Engine, ingest_token: str, field: str, edit: Edit
) -> None:
    b = base()
    edit(b)
    assert_refused(post_raw(client, ingest_token, json.dumps(b).encode()), engine, field)
    assert holder_rows(engine) == dict.fromkeys(HOLDER_TABLES, 0)


def test_a_reference_without_a_holders_table_is_dangling(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = base()
    b["intervals"][1]["samples"][2]["holders"] = [{"ref": 0}]
    body = assert_refused(post_raw(client, ingest_token, json.dumps(b).encode()), engine, None)
    assert body["detail"] == [
        {"field": "intervals[1].samples[2].holders[0].ref", "message": "0 is not the id of a holder in this batch"}
    ]


def test_the_bounds_themselves_are_accepted(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = with_holders(base())
    b["holders"][0].update(
        pid=2**22,
        uid=2**32 - 2,
        executable="e" * 253,
        user="u" * 253,
        namespace="n" * 253,
        pod="p" * 253,
        container_id="c" * 128,
        pod_uid="d" * 128,
        job_id="j" * 128,
        job_step="s" * 128,
        command="x " * 512,
        started_at="2026-11-20T09:00:00.250+01:00",
    )
    b["holders"][1]["id"] = 4095
    for iv in b["intervals"]:
        iv["samples"][0]["holders"] = [{"ref": 0, "used_mib": 2**31 - 1}, {"ref": 4095, "used_mib": 0}]
    r = post_raw(client, ingest_token, json.dumps(b).encode())
    assert r.status_code == 200, r.text
    assert holder_rows(engine)["holders"] == 2


def test_holders_described_but_never_named_are_not_stored(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    b = base()
    b["holders"] = [{"id": 3, "pid": 55}]
    r = post_raw(client, ingest_token, json.dumps(b).encode())
    assert r.status_code == 200, r.text
    assert holder_rows(engine) == dict.fromkeys(HOLDER_TABLES, 0)


def test_a_batch_without_holders_writes_none(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = base()
    r = post_raw(client, ingest_token, json.dumps(b).encode())
    assert r.status_code == 200, r.text
    assert r.json()["samples"] == 6
    assert holder_rows(engine) == dict.fromkeys(HOLDER_TABLES, 0)


def test_openapi_publishes_the_holder_bounds(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["IngestBatchIn"]["properties"]["holders"]["maxItems"] == 4096
    assert schemas["SampleIn"]["properties"]["holders"]["maxItems"] == 64
    holder = schemas["HolderIn"]["properties"]
    assert holder["pid"]["minimum"] == 1 and holder["pid"]["maximum"] == 2**22
    assert holder["uid"]["anyOf"][0]["maximum"] == 2**32 - 2
    label = "^[^\\x00-\\x1f\\x7f]*$"
    for field, most in [("executable", 253), ("user", 253), ("namespace", 253), ("pod", 253), ("job_id", 128)]:
        assert holder[field]["anyOf"][0] == {"type": "string", "minLength": 1, "maxLength": most, "pattern": label}
    assert holder["command"]["anyOf"][0]["maxLength"] == 1024
    assert holder["started_at"]["anyOf"][0]["format"] == "date-time"
    assert schemas["HolderRefIn"]["properties"]["ref"]["maximum"] == 4095
