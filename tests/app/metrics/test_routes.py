"""GET /metrics over HTTP: the official parser reads it, counters follow ingest, gauges agree with the overview,
only readers get in, labels stay bounded, and a database failure gives `gpufleet_database_up 0`."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.states import STATES, UNPARTITIONED
from app.db import make_engine, make_sessionmaker
from app.metrics.fleet import AGE_BUCKETS, INSTANCE_STATUSES, MAX_INSTANCE_TYPES, OLDER, WASTE_STATES
from app.metrics.server import ACCEPTED, DB_ERROR_DURING, FAILED, REJECT_REASONS, SHED
from app.web.charts import state_label
from app.web.templating import num
from tests.app.metrics.conftest import parse, scrape
from tests.conftest import make_token
from tests.factories import batch, gpu, mig_slice, now_floor
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, held, idle

URL = "/metrics"
H = timedelta(hours=1)

FLEET_FAMILIES = {
    "gpufleet_agents",
    "gpufleet_instances",
    "gpufleet_gpus",
    "gpufleet_passthrough_gpus",
    "gpufleet_mig_gpus",
    "gpufleet_mig_slices",
    "gpufleet_gpu_equivalents",
    "gpufleet_idle_gpus",
    "gpufleet_idle_gpus_usd_per_hour",
    "gpufleet_waste_usd_per_hour",
    "gpufleet_unpriced_idle_gpu_equivalents",
}
SERVER_FAMILIES = {
    "gpufleet_ingest_batches_accepted",
    "gpufleet_ingest_batches_rejected",
    "gpufleet_ingest_samples_accepted",
    "gpufleet_ingest_samples_rejected",
    "gpufleet_ingest_duration_seconds",
    "gpufleet_database_errors",
    "gpufleet_database_up",
    "gpufleet_fleet_read_seconds",
}


def post(client: TestClient, body: dict[str, Any], token: str | None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post("/api/v1/ingest", content=json.dumps(body).encode(), headers=headers)


def test_parses_with_the_official_parser(client: TestClient, read_token: str) -> None:
    r = client.get(URL, headers={"Authorization": f"Bearer {read_token}"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    got = parse(r.text)
    assert set(got.families) >= FLEET_FAMILIES | SERVER_FAMILIES
    for name in FLEET_FAMILIES | SERVER_FAMILIES:
        assert got.families[name].documentation, f"{name} has no HELP"
    assert got.families["gpufleet_ingest_batches_accepted"].type == "counter"
    assert got.families["gpufleet_ingest_duration_seconds"].type == "histogram"
    assert got.families["gpufleet_waste_usd_per_hour"].type == "gauge"
    assert got.value("gpufleet_database_up") == 1
    # Process metrics of the server itself come along (one process: not multiprocess mode).
    assert "process_cpu_seconds" in got.families


def test_ingest_counters_move(client: TestClient, ingest_token: str, read_token: str) -> None:
    before = scrape(client, read_token)
    good = batch([gpu(0), gpu(1)], intervals=3)
    assert post(client, good, ingest_token).json()["status"] == "stored"
    assert post(client, good, ingest_token).json()["status"] == "duplicate"
    # Parses, but starts an hour ahead of the server clock: refused with its 2 samples.
    ahead = batch([gpu(0)], start=now_floor() + H, intervals=2)
    assert post(client, ahead, ingest_token).status_code == 422
    assert post(client, good, None).status_code == 401
    after = scrape(client, read_token)

    def moved(sample: str, **labels: str) -> float:
        return (after.value(sample, **labels) or 0.0) - (before.value(sample, **labels) or 0.0)

    assert moved("gpufleet_ingest_batches_accepted_total", status="stored") == 1
    assert moved("gpufleet_ingest_batches_accepted_total", status="duplicate") == 1
    assert moved("gpufleet_ingest_batches_rejected_total", reason="invalid") == 1
    assert moved("gpufleet_ingest_batches_rejected_total", reason="unauthorized") == 1
    assert moved("gpufleet_ingest_batches_rejected_total", reason="forbidden") == 0
    assert moved("gpufleet_ingest_samples_accepted_total") == 6
    # The 422 batch's 2 samples; the unauthorized one is refused before its body is read, so it counts none.
    assert moved("gpufleet_ingest_samples_rejected_total") == 2
    assert moved("gpufleet_ingest_duration_seconds_count") == 4
    assert moved("gpufleet_ingest_duration_seconds_bucket", le="+Inf") == 4
    assert moved("gpufleet_database_errors_total", during="request") == 0


def test_no_token_is_401_and_an_ingest_token_403(client: TestClient, ingest_token: str, read_token: str) -> None:
    r = client.get(URL)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization" in r.json()["error"]
    r = client.get(URL, headers={"Authorization": "Bearer gpf_not-a-token"})
    assert r.status_code == 401 and r.json()["error"] == "unknown token"
    r = client.get(URL, headers={"Authorization": f"Bearer {ingest_token}"})
    assert r.status_code == 403 and "read" in r.json()["error"]


def test_an_admin_token_may_scrape(client: TestClient, sessions: sessionmaker[Session]) -> None:
    assert scrape(client, make_token(sessions, "admin")).value("gpufleet_database_up") == 1


def _live(feeder: Feeder, gpus: list[dict[str, Any]], fn: Any, **instance: Any) -> None:
    """Two hours of one-minute intervals up to now."""
    end = now_floor(60)
    feeder.feed(gpus, start=end - 2 * H, hours=2, fn=fn, **instance)


def _overview(client: TestClient, token: str) -> dict[str, str]:
    r = client.get("/", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    doc = BeautifulSoup(r.text, "html.parser")
    shown = {str(el["data-figure"]): el.get_text(strip=True) for el in doc.select("[data-figure]")}
    for tr in doc.select("table.states tbody tr"):
        cells = [td.get_text(strip=True) for td in tr.select("td")]
        shown["now:" + cells[0]] = cells[3]
    return shown


def test_fleet_gauges_agree_with_the_overview(client: TestClient, feeder: Feeder, read_token: str) -> None:
    _live(feeder, [gpu(0), gpu(1)], idle, instance_id="i-idle")
    _live(feeder, [gpu(0)], busy(70), instance_id="i-busy", instance_type="g5.xlarge")
    mig = gpu(0, mig=True, slices=[mig_slice(1), mig_slice(2, "2g.10gb")], unpartitioned=2)
    _live(feeder, [mig], {mig["uuid"]: idle, mig["slices"][0]["uuid"]: held, mig["slices"][1]["uuid"]: busy(50)})
    # Its last sample ended 10 minutes ago: offline.
    feeder.feed([gpu(0)], start=now_floor(60) - 2 * H, hours=1.8, fn=idle, instance_id="i-stopped")
    got = scrape(client, read_token)
    shown = _overview(client, read_token)

    assert int(shown["gpus"]) == sum(got.labelled("gpufleet_gpus").values()) == 5
    assert int(shown["idle-now"]) == got.value("gpufleet_idle_gpus") == 2
    equivalents = got.labelled("gpufleet_gpu_equivalents")
    compared = 0
    for state in (*STATES, UNPARTITIONED):
        if "now:" + state_label(state) in shown:
            assert shown["now:" + state_label(state)] == num(equivalents[(state,)], 1), state
            compared += 1
    assert compared >= 5
    assert equivalents[("idle",)] == 2
    assert equivalents[("offline",)] == 1
    assert equivalents[("idle-held",)] == pytest.approx(3 / 7)
    assert equivalents[(UNPARTITIONED,)] == pytest.approx(2 / 7)
    assert got.value("gpufleet_instances", status="online") == 3
    assert got.value("gpufleet_instances", status="offline") == 1
    # The live ones sent their last interval within the last minute or so.
    recent = (got.value("gpufleet_agents", last_seen="under_1m") or 0) + (
        got.value("gpufleet_agents", last_seen="under_5m") or 0
    )
    assert recent == 3
    assert got.value("gpufleet_agents", last_seen="under_1h") == 1


def test_every_label_value_is_from_a_bounded_set(client: TestClient, feeder: Feeder, read_token: str) -> None:
    _live(feeder, [gpu(0)], idle, instance_id="i-a")
    _live(feeder, [gpu(0)], held, instance_id="i-b", instance_type=None, lifecycle="on-prem")
    got = scrape(client, read_token)
    allowed = {
        "gpufleet_agents": {"last_seen": {b for b, _ in AGE_BUCKETS} | {OLDER}},
        "gpufleet_instances": {"status": set(INSTANCE_STATUSES)},
        "gpufleet_passthrough_gpus": {"state": set(STATES)},
        "gpufleet_mig_slices": {"state": set(STATES)},
        "gpufleet_gpu_equivalents": {"state": {*STATES, UNPARTITIONED}},
        "gpufleet_waste_usd_per_hour": {"state": set(WASTE_STATES)},
        "gpufleet_gpus": {"status": set(INSTANCE_STATUSES)},
        "gpufleet_ingest_batches_accepted": {"status": set(ACCEPTED)},
        "gpufleet_ingest_batches_rejected": {"reason": {*REJECT_REASONS.values(), SHED, FAILED}},
        "gpufleet_database_errors": {"during": set(DB_ERROR_DURING)},
    }
    for family, labels in allowed.items():
        for s in got.families[family].samples:
            for name, value in s.labels.items():
                if name in labels:
                    assert value in labels[name], (family, name, value)
    for family in ("gpufleet_gpus", "gpufleet_waste_usd_per_hour"):
        types = {s.labels["instance_type"] for s in got.families[family].samples}
        assert len(types) <= MAX_INSTANCE_TYPES + 1
    assert {s.labels["instance_type"] for s in got.families["gpufleet_gpus"].samples} == {"p4d.24xlarge", "none"}
    names = {s.name for f in got.families.values() for s in f.samples if s.name.startswith("gpufleet_")}
    assert all(not n.endswith("_created") for n in names)


def test_a_database_failure_still_answers(client: TestClient, sessions: sessionmaker[Session]) -> None:
    token, never_checked, ingest = (make_token(sessions, scope) for scope in ("read", "read", "ingest"))
    before = scrape(client, token)
    assert before.value("gpufleet_database_up") == 1
    state = client.app.state.gpufleet  # type: ignore[attr-defined]
    alive = state.sessions
    # The database goes away: nothing listens on port 1.
    dead = make_engine("postgresql://postgres@127.0.0.1:1/gone", pool_size=1)
    state.sessions = make_sessionmaker(dead)
    # The same app, without re-running its startup; a failing request answers 500 rather than raising here.
    c = TestClient(client.app, raise_server_exceptions=False)
    try:
        r = c.get(URL, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        got = parse(r.text)
        assert got.value("gpufleet_database_up") == 0
        # The failed token check and the failed fleet read.
        assert (
            got.value("gpufleet_database_errors_total", during="scrape")
            == (before.value("gpufleet_database_errors_total", during="scrape") or 0) + 2
        )
        assert "process_cpu_seconds" in got.families
        assert "gpufleet_gpus" not in got.families
        assert "Traceback" not in r.text

        r = c.get(URL, headers={"Authorization": f"Bearer {never_checked}"})
        assert r.status_code == 503
        assert r.json()["error"] == "database unavailable: the token cannot be checked"

        r = post(c, batch([gpu(0)]), ingest)
        assert r.status_code == 503 and r.json()["error"] == "database unavailable" and "Traceback" not in r.text
    finally:
        state.sessions = alive
        dead.dispose()
    after = scrape(client, token)
    for sample, labels in [
        ("gpufleet_database_errors_total", {"during": "request"}),
        ("gpufleet_ingest_batches_rejected_total", {"reason": FAILED}),
    ]:
        assert (after.value(sample, **labels) or 0) - (before.value(sample, **labels) or 0) == 1, sample


def test_an_idle_story_in_dollars(client: TestClient, feeder: Feeder, read_token: str) -> None:
    """Two idle p4d GPUs and a held 3g slice cost their share of the p4d's price per hour, now."""
    _live(feeder, [gpu(0), gpu(1)], idle, instance_id="i-idle")
    mig = gpu(0, mig=True, slices=[mig_slice(1)], unpartitioned=4)
    _live(feeder, [mig], {mig["uuid"]: idle, mig["slices"][0]["uuid"]: held}, instance_id="i-mig")
    got = scrape(client, read_token)
    waste = got.labelled("gpufleet_waste_usd_per_hour")
    assert waste[("p4d.24xlarge", "idle")] == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert waste[("p4d.24xlarge", "idle-held")] == pytest.approx(3 / 7 * P4D_PER_GPU_HOUR)
    assert waste[("p4d.24xlarge", UNPARTITIONED)] == pytest.approx(4 / 7 * P4D_PER_GPU_HOUR)
    assert got.value("gpufleet_idle_gpus_usd_per_hour") == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert got.value("gpufleet_unpriced_idle_gpu_equivalents") == 0


def test_with_auth_off_this_host_scrapes_without_a_token(client: TestClient) -> None:
    state = client.app.state.gpufleet  # type: ignore[attr-defined]
    saved = state.settings
    state.settings = saved.model_copy(update={"auth": "off"})
    try:
        r = TestClient(client.app, client=("127.0.0.1", 50000)).get(URL)
        assert r.status_code == 200
        assert parse(r.text).value("gpufleet_database_up") == 1
        assert TestClient(client.app, client=("10.1.2.3", 50000)).get(URL).status_code == 403
    finally:
        state.settings = saved
