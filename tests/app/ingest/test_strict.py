"""The ingest body is held to exactly what the schema publishes: wrong types, characters PostgreSQL cannot
store, numbers out of range, unbounded details and unsafe ids are a 4xx naming the field, never a 500, and
leave no row behind."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import make_token
from tests.factories import batch, gpu, mig_slice, now_floor

URL = "/api/v1/ingest"
TABLES = ("instances", "gpus", "mig_slices", "ingest_batches", "samples", "rollups_hourly", "events")
Edit = Callable[[dict[str, Any]], None]


def base() -> dict[str, Any]:
    """A valid batch with one plain GPU, one MIG GPU with a slice and a permission gap, an error count, a tag and
    an event, so that every string field has somewhere to go wrong."""
    b = batch([gpu(0), gpu(1, mig=True, slices=[mig_slice(1)], unpartitioned=4)], intervals=2)
    b["gpus"][1]["permission_denied"] = [
        {"figure": "mem_used_mib", "call": "nvmlDeviceGetMemoryInfo", "grant": "mig-monitor"}
    ]
    b["agent"]["errors"] = {"nvmlDeviceGetPowerUsage:not_supported": 2}
    b["events"] = [{"ts": now_floor().isoformat(), "kind": "agent_start", "details": {"version": "0.1.0"}}]
    return b


def post_raw(client: TestClient, token: str, raw: bytes, **headers: str) -> Any:
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {token}", **headers}
    return client.post(URL, content=raw, headers=h)


def rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES}


def assert_refused(r: Any, engine: Engine, field: str | None, status: int = 422) -> dict[str, Any]:
    """A clear 4xx naming `field` (None: no single field is at fault), and nothing written."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "detail"} and body["error"]
    if field is not None:
        assert field in [d["field"] for d in body["detail"]], body
    assert all(d["message"] for d in body["detail"])
    assert rows(engine) == dict.fromkeys(TABLES, 0)
    return body


def check(client: TestClient, engine: Engine, token: str, edit: Edit, field: str) -> None:
    """The base batch with `edit` applied is refused with 422 naming `field`."""
    b = base()
    edit(b)
    assert_refused(post_raw(client, token, json.dumps(b).encode()), engine, field)


def test_the_base_batch_is_stored(client: TestClient, engine: Engine, ingest_token: str) -> None:
    """Every refusal below comes from its one edit: without it the batch is valid."""
    assert post_raw(client, ingest_token, json.dumps(base()).encode()).status_code == 200
    assert rows(engine)["events"] == 1


def _walk(b: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The container and the last key of a dotted path with [i] indexes (`gpus[1].slices[0].profile`)."""
    parts: list[Any] = []
    for part in path.split("."):
        name, *idx = part.replace("]", "").split("[")
        parts += [name, *(int(i) for i in idx)]
    node: Any = b
    for p in parts[:-1]:
        node = node[p]
    return node, parts[-1]


def put(path: str, value: Any) -> Edit:
    def edit(b: dict[str, Any]) -> None:
        node, last = _walk(b, path)
        node[last] = value

    return edit


def rename_key(path: str, old: str, new: str) -> Edit:
    def edit(b: dict[str, Any]) -> None:
        node, last = _walk(b, path)
        node[last][new] = node[last].pop(old)

    return edit


NUL = "a\x00b"
NUL_CASES = [
    ("instance.instance_id", put("instance.instance_id", "i-0123\x00")),
    ("instance.hostname", put("instance.hostname", NUL)),
    ("instance.instance_type", put("instance.instance_type", NUL)),
    ("instance.region", put("instance.region", NUL)),
    ("instance.availability_zone", put("instance.availability_zone", NUL)),
    ("instance.ami_id", put("instance.ami_id", NUL)),
    ("instance.tags.team", put("instance.tags.team", NUL)),
    ("instance.tags.te\\u0000am", rename_key("instance.tags", "team", "te\x00am")),
    ("agent.version", put("agent.version", NUL)),
    (
        "agent.errors.nvmlDeviceGetPowerUsage\\u0000",
        rename_key("agent.errors", "nvmlDeviceGetPowerUsage:not_supported", "nvmlDeviceGetPowerUsage\x00"),
    ),
    ("gpus[0].name", put("gpus[0].name", NUL)),
    ("gpus[0].util_unavailable_reason", put("gpus[0].util_unavailable_reason", NUL)),
    ("gpus[1].slices[0].profile", put("gpus[1].slices[0].profile", NUL)),
    ("gpus[1].slices[0].util_unavailable_reason", put("gpus[1].slices[0].util_unavailable_reason", NUL)),
    ("gpus[1].permission_denied[0].figure", put("gpus[1].permission_denied[0].figure", NUL)),
    ("gpus[1].permission_denied[0].call", put("gpus[1].permission_denied[0].call", NUL)),
    ("gpus[1].permission_denied[0].grant", put("gpus[1].permission_denied[0].grant", NUL)),
    ("events[0].details.version", put("events[0].details.version", NUL)),
    ("events[0].details.ver\\u0000sion", rename_key("events[0].details", "version", "ver\x00sion")),
]


@pytest.mark.parametrize(("field", "edit"), NUL_CASES, ids=[c[0] for c in NUL_CASES])
def test_nul_in_a_string_is_refused(
    client: TestClient, engine: Engine, ingest_token: str, field: str, edit: Edit
) -> None:
    check(client, engine, ingest_token, edit, field)


LABEL_CASES = [
    ("instance.tags.team", "research\nteam"),
    ("instance.hostname", "host\r"),
    ("gpus[1].slices[0].profile", "3g\x7f"),
    ("gpus[1].permission_denied[0].call", "nvmlDeviceGetMemoryInfo\x1b[31m"),
    ("gpus[0].name", "NVIDIA\tA10G"),
    ("gpus[0].name", " NVIDIA A10G"),
    ("gpus[0].name", "NVIDIA A10G\n"),
    ("gpus[0].name", "   "),
]


@pytest.mark.parametrize(("field", "value"), LABEL_CASES, ids=[f"{f}={v!r}" for f, v in LABEL_CASES])
def test_labels_are_one_line_and_names_are_not_trimmed(
    client: TestClient, engine: Engine, ingest_token: str, field: str, value: str
) -> None:
    check(client, engine, ingest_token, put(field, value), field)


def test_free_text_keeps_line_breaks_and_tabs(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = base()
    b["gpus"][0]["util_unavailable_reason"] = "first line\nsecond line\tand a tab"
    b["events"][0]["details"]["version"] = "0.1.0\n(dev)"
    b["gpus"][0]["name"] = "NVIDIA A10G (\u00e9dition sp\u00e9ciale)"
    assert post_raw(client, ingest_token, json.dumps(b).encode()).status_code == 200
    with engine.connect() as conn:
        reasons = conn.execute(text("SELECT util_reason FROM gpus")).scalars().all()
    assert "first line\nsecond line\tand a tab" in reasons


NONFINITE_CASES = [
    ("events[0].details.x", "NaN"),
    ("events[0].details.x", "Infinity"),
    ("events[0].details.x", "-Infinity"),
    ("events[0].details.x", "1e309"),
    ("instance.price_usd_per_hour", "NaN"),
    ("agent.interval_s", "Infinity"),
    ("intervals[0].duration_s", "NaN"),
    ("intervals[0].samples[0].util", "NaN"),
    ("intervals[0].samples[0].power_w", "1e309"),
    ("intervals[0].samples[0].temp_c", "-Infinity"),
]


@pytest.mark.parametrize(("field", "literal"), NONFINITE_CASES, ids=[f"{f}={v}" for f, v in NONFINITE_CASES])
def test_non_finite_numbers_are_refused(
    client: TestClient, engine: Engine, ingest_token: str, field: str, literal: str
) -> None:
    b = base()
    marker = "__number__"
    put(field, marker)(b)
    raw = json.dumps(b).replace(json.dumps(marker), literal).encode()
    assert_refused(post_raw(client, ingest_token, raw), engine, field)


HUGE = "1" + "0" * 5000  # more digits than Python turns into a string by default
RANGE_CASES = [
    ("agent.dropped_batches", str(2**31)),
    ("agent.dropped_batches", str(10**30)),
    ("gpus[0].memory_total_mib", str(2**31)),
    ("gpus[1].slices[0].memory_total_mib", str(2**31)),
    ("events[0].details.x", str(2**53 + 1)),
    ("events[0].details.x", str(-(2**60))),
    ("events[0].details.x", "1e300"),
]


@pytest.mark.parametrize(("field", "literal"), RANGE_CASES, ids=[f"{f}={v[:12]}" for f, v in RANGE_CASES])
def test_numbers_beyond_their_column_are_refused(
    client: TestClient, engine: Engine, ingest_token: str, field: str, literal: str
) -> None:
    b = base()
    put(field, "__number__")(b)
    raw = json.dumps(b).replace('"__number__"', literal).encode()
    assert_refused(post_raw(client, ingest_token, raw), engine, field)


@pytest.mark.parametrize("field", ["events[0].details.x", "agent.dropped_batches", "schema_version"])
def test_numbers_no_parser_can_hold_are_a_400(
    client: TestClient, engine: Engine, ingest_token: str, field: str
) -> None:
    b = base()
    put(field, "__number__")(b)
    raw = json.dumps(b).replace('"__number__"', HUGE).encode()
    assert "not valid JSON" in assert_refused(post_raw(client, ingest_token, raw), engine, None, 400)["error"]


UNIX_NOW = -1
"""Stands for the Unix seconds of a minute ago: a time inside the range, in the wrong type. A string with
`{t:...}` is formatted with that time, for the same reason."""
TYPE_CASES = [
    ("intervals[0].start", UNIX_NOW),
    ("intervals[0].start", str(UNIX_NOW)),
    ("intervals[0].start", "{t:%Y-%m-%dT%H:%MZ}"),
    ("intervals[0].start", "{t:%Y-%m-%d %H:%M:%S+00:00}"),
    ("events[0].ts", 0),
    ("events[0].ts", "0"),
    ("gpus[0].index", False),
    ("gpus[0].index", 0.5),
    ("gpus[0].mig_mode", 0),
    ("gpus[0].mig_mode", "false"),
    ("gpus[0].memory_total_mib", False),
    ("gpus[1].slices[0].gpu_instance_id", True),
    ("gpus[1].slices[0].compute_slices", "3"),
    ("gpus[1].layout_complete", 1),
    ("instance.price_usd_per_hour", False),
    ("instance.price_usd_per_hour", "1.5"),
    ("agent.dropped_batches", False),
    ("agent.interval_s", True),
    ("agent.errors.nvmlDeviceGetPowerUsage:not_supported", True),
    ("intervals[0].duration_s", "10"),
    ("intervals[0].samples[0].util", "50"),
    ("intervals[0].samples[0].procs", True),
    ("intervals[0].samples[0].mem_used_mib", 1024.5),
    ("schema_version", True),
    ("schema_version", "1"),
    ("batch_id", "0b7f2c9e5d414a8e9c3b2f6d8e1a7b40"),
    ("batch_id", "urn:uuid:0b7f2c9e-5d41-4a8e-9c3b-2f6d8e1a7b40"),
    ("batch_id", "{0b7f2c9e-5d41-4a8e-9c3b-2f6d8e1a7b40}"),
]


@pytest.mark.parametrize(("field", "value"), TYPE_CASES, ids=[f"{f}={v!r}" for f, v in TYPE_CASES])
def test_types_the_schema_does_not_publish_are_refused(
    client: TestClient, engine: Engine, ingest_token: str, field: str, value: Any
) -> None:
    minute_ago = datetime.now(UTC) - timedelta(minutes=1)
    if value in (UNIX_NOW, str(UNIX_NOW)):
        value = int(minute_ago.timestamp()) if value == UNIX_NOW else str(int(minute_ago.timestamp()))
    elif isinstance(value, str) and value.startswith("{t:"):
        value = value.format(t=minute_ago)
    check(client, engine, ingest_token, put(field, value), field)


def test_a_whole_number_with_a_fraction_part_is_an_integer(
    client: TestClient, engine: Engine, ingest_token: str
) -> None:
    """JSON Schema's `integer`, which the OpenAPI schema publishes, counts 1.0 as 1; so does the server."""
    b = base()
    b["schema_version"] = 1.0
    b["gpus"][0]["index"] = 0.0
    b["intervals"][0]["samples"][0]["mem_used_mib"] = 1e3
    assert post_raw(client, ingest_token, json.dumps(b).encode()).status_code == 200
    with engine.connect() as conn:
        assert 1000 in conn.execute(text("SELECT mem_used_mib FROM samples")).scalars().all()


def test_event_times_are_checked_like_interval_starts(client: TestClient, engine: Engine, ingest_token: str) -> None:
    now = datetime.now(UTC)
    for ts in ["1999-12-31T23:59:59Z", "1970-01-01T00:00:00Z", (now + timedelta(hours=1)).isoformat()]:
        b = base()
        b["events"][0]["ts"] = ts
        assert_refused(post_raw(client, ingest_token, json.dumps(b).encode()), engine, "events[0].ts")
    # Far outside what a datetime can hold once moved to UTC: still a 422, not an overflow.
    for ts in ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]:
        b = base()
        b["events"][0]["ts"] = ts
        assert_refused(post_raw(client, ingest_token, json.dumps(b).encode()), engine, "events[0].ts")
        b = base()
        b["intervals"][0]["start"] = ts
        assert_refused(post_raw(client, ingest_token, json.dumps(b).encode()), engine, "intervals[0].start")
    # Old events stay acceptable (events are kept for good, unlike raw samples), and so do RFC 3339 variants.
    b = base()
    b["events"][0]["ts"] = "2001-02-03T04:05:06.789+01:00"
    b["events"].append({"ts": (now - timedelta(days=400)).isoformat().replace("+00:00", "z"), "kind": "agent_start"})
    assert post_raw(client, ingest_token, json.dumps(b).encode()).status_code == 200


def test_gzip_bytes_after_the_first_member_are_refused(client: TestClient, engine: Engine, ingest_token: str) -> None:
    raw = json.dumps(base()).encode()
    for body in [gzip.compress(raw) + b"trailing", gzip.compress(raw) + gzip.compress(raw), gzip.compress(raw) + b"\0"]:
        r = post_raw(client, ingest_token, body, **{"Content-Encoding": "gzip"})
        body_json = assert_refused(r, engine, None, 400)
        assert "gzip" in body_json["error"]
    assert post_raw(client, ingest_token, gzip.compress(raw), **{"Content-Encoding": "gzip"}).status_code == 200


def agent_events(now: datetime) -> list[dict[str, Any]]:
    """Every event the agent sends (agent/run.py, agent/send.py, agent/identify/identity.py) at its largest."""
    ts = now.isoformat().replace("+00:00", "Z")
    mig = {"gpu_index": 7, "gpu_uuid": "GPU-5f3c1a2b-7d8e-4f90-a1b2-c3d4e5f60718", "current": "disabled"}
    return [
        {"ts": ts, "kind": "agent_start", "details": {"version": "0.1.0"}},
        {"ts": ts, "kind": "spot_interruption", "details": {"action": "terminate", "time": ts}},
        {"ts": ts, "kind": "spot_interruption", "details": {"raw": "x" * 500}},
        {"ts": ts, "kind": "rebalance_recommendation", "details": {"notice_time": ts}},
        {"ts": ts, "kind": "mig_mode_change_pending", "details": {**mig, "pending": "enabled"}},
        {"ts": ts, "kind": "mig_mode_change_done", "details": {**mig, "pending": "enabled", "now": "enabled"}},
        {
            "ts": ts,
            "kind": "batch_set_aside",
            "details": {
                "batch_id": "0b7f2c9e-5d41-4a8e-9c3b-2f6d8e1a7b40",
                "sealed_at": ts,
                "tries": 5,
                "status": 500,
                "error": "e" * 200,
                "set_aside_now": 1,
            },
        },
        {"ts": ts, "kind": "batch_set_aside_delivered", "details": {"batch_id": "0b7f2c9e", "sealed_at": ts}},
    ]


DETAIL_CASES: list[tuple[str, Edit]] = [
    ("events[0].details", put("events[0].details", {f"k{i}": i for i in range(17)})),
    ("events[0].details." + "k" * 64 + "...", put("events[0].details." + "k" * 65, 1)),
    ("events[0].details.raw", put("events[0].details.raw", "x" * 501)),
    ("events[0].details.nested", put("events[0].details.nested", {"a": 1})),
    ("events[0].details.list", put("events[0].details.list", [1, 2])),
    ("events[0].details.", put("events[0].details.", 1)),
]


@pytest.mark.parametrize(("field", "edit"), DETAIL_CASES, ids=[c[0][:40] for c in DETAIL_CASES])
def test_event_details_are_bounded(
    client: TestClient, engine: Engine, ingest_token: str, field: str, edit: Edit
) -> None:
    check(client, engine, ingest_token, edit, field)


def test_every_event_the_agent_sends_fits(client: TestClient, engine: Engine, ingest_token: str) -> None:
    b = base()
    b["events"] = agent_events(datetime.now(UTC))
    assert post_raw(client, ingest_token, json.dumps(b).encode()).status_code == 200
    assert rows(engine)["events"] == len(b["events"])


BAD_INSTANCE_IDS = [
    " i-01234567",
    "i-01234567 ",
    "a/b",
    "../etc",
    "..",
    ".hidden",
    "-x",
    "i-abc?x=1",
    "i-abc#x",
    "host name",
    "i-%2F",
    "höst",
    "i" * 129,
]
GOOD_INSTANCE_IDS = ["i-0123456789abcdef0", "i-01234567", "rack4-node17", "ip-10-0-12-34.ec2.internal", "Node_7", "x"]


@pytest.mark.parametrize("instance_id", BAD_INSTANCE_IDS)
def test_instance_ids_outside_the_rule_are_refused(
    client: TestClient, engine: Engine, ingest_token: str, instance_id: str
) -> None:
    check(client, engine, ingest_token, put("instance.instance_id", instance_id), "instance.instance_id")


def test_instance_ids_inside_the_rule_have_a_page(
    client: TestClient, sessions: sessionmaker[Session], ingest_token: str
) -> None:
    reader = {"Authorization": f"Bearer {make_token(sessions, 'read', name='reader')}"}
    for instance_id in GOOD_INSTANCE_IDS:
        b = base()
        b["instance"]["instance_id"] = instance_id
        r = post_raw(client, ingest_token, json.dumps(b).encode())
        assert r.status_code == 200, (instance_id, r.text)
        listing = client.get("/instances", headers=reader)
        assert f'href="/instances/{instance_id}"' in listing.text
        page = client.get(f"/instances/{instance_id}", headers=reader)
        assert page.status_code == 200 and "No such instance" not in page.text


BAD_DEVICE_UUIDS = [" GPU-a", "GPU-a\n", "GPU-a b", "GPU-<b>", "GPU-\u00e9", "-GPU", "GPU-\nx", "G" * 97]


@pytest.mark.parametrize("uid", BAD_DEVICE_UUIDS, ids=[repr(u)[:20] for u in BAD_DEVICE_UUIDS])
def test_device_uuids_outside_the_rule_are_refused(
    client: TestClient, engine: Engine, ingest_token: str, uid: str
) -> None:
    def gpu_uuid(b: dict[str, Any]) -> None:
        old = b["gpus"][0]["uuid"]
        b["gpus"][0]["uuid"] = uid
        for iv in b["intervals"]:
            for s in iv["samples"]:
                if s["uuid"] == old:
                    s["uuid"] = uid

    check(client, engine, ingest_token, gpu_uuid, "gpus[0].uuid")


def test_older_drivers_mig_uuids_are_accepted(client: TestClient, ingest_token: str) -> None:
    parent = "GPU-5f3c1a2b-7d8e-4f90-a1b2-c3d4e5f60718"
    b = batch([gpu(0, uid=parent, mig=True, slices=[mig_slice(1, uid=f"MIG-{parent}/1/0")], unpartitioned=4)])
    assert post_raw(client, ingest_token, json.dumps(b).encode()).status_code == 200


def test_openapi_publishes_the_rules(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    instance = schemas["InstanceIn"]["properties"]
    assert instance["instance_id"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]*$"
    assert instance["hostname"]["anyOf"][0]["pattern"] == "^[^\\x00-\\x1f\\x7f]*$"
    tags = instance["tags"]
    assert "patternProperties" not in tags
    assert tags["propertyNames"]["pattern"] == "^[^\\x00-\\x1f\\x7f]*$"
    assert tags["additionalProperties"]["pattern"] == "^[^\\x00-\\x1f\\x7f]*$"
    details = schemas["EventIn"]["properties"]["details"]
    assert details["maxProperties"] == 16
    assert details["propertyNames"] == {"minLength": 1, "maxLength": 64, "pattern": "^[^\\x00-\\x1f\\x7f]*$"}
    kinds = {v["type"]: v for v in details["additionalProperties"]["anyOf"]}
    assert kinds["string"]["maxLength"] == 500 and kinds["number"]["maximum"] == 2**53
    assert schemas["AgentIn"]["properties"]["dropped_batches"]["maximum"] == 2**31 - 1
    assert schemas["GpuIn"]["properties"]["uuid"]["maxLength"] == 96
    assert schemas["EventIn"]["properties"]["ts"]["format"] == "date-time"
