"""What the agent sends is what the server accepts: every scenario, through the real batcher and ingest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from agent import fake_nvml
from agent.batch import Batcher
from agent.identify import Identity
from agent.spool import Journal, Spool
from app.ingest.schemas import IngestBatchIn

from .collect.conftest import Host

SCENARIOS = sorted(set(fake_nvml.SCENARIOS) - {"no-driver"})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_agent_batches_validate_and_are_stored(
    scenario: str, client: TestClient, engine: Engine, ingest_token: str, tmp_path: Path
) -> None:
    host = Host(scenario, simulated_holders=True)
    identity = Identity(
        instance_id=f"i-{scenario}",
        instance_type="p4d.24xlarge",
        region="us-east-1",
        lifecycle="spot",
        tags={"team": "ml"},
        source="imds",
    )
    batcher = Batcher(Spool(tmp_path / "spool"), Journal(tmp_path / "open.jsonl"), batch_intervals=3, interval_s=10)
    readings = 0
    for _ in range(3):
        interval = host.interval()
        readings += len(interval.readings)
        batcher.add(interval, identity.to_wire(), host.nvml.take_errors())
    [spooled] = batcher.spool.pending()
    body = batcher.spool.read(spooled)
    assert body is not None
    document = json.loads(gzip.decompress(body))
    IngestBatchIn.model_validate(document)
    table = document.get("holders", [])
    refs = {h["ref"] for iv in document["intervals"] for s in iv["samples"] for h in s.get("holders", ())}
    assert refs == set(range(len(table))), "every holder described is referred to, and only those"

    answer = client.post(
        "/api/v1/ingest",
        content=body,
        headers={
            "Authorization": f"Bearer {ingest_token}",
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "stored", "batch_id": document["batch_id"], "samples": readings}
    # One holders row per process: its pid and start, or its pid and executable when the start is unknown.
    processes = {(h["pid"], h.get("started_at") or h.get("executable")) for h in table}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM holders")).scalar_one() == len(processes)
