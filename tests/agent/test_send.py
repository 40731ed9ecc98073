from __future__ import annotations

import gzip
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from agent.send import Poster, Sender, classify
from agent.spool import Spool, gzip_json
from tests import factories

from .live_server import LiveServer


def body(**overrides: Any) -> bytes:
    doc = factories.batch([factories.gpu(0)], intervals=2)
    doc.update(overrides)
    return gzip_json(doc)


def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/api/v1/ingest"


def test_delivered_batches_leave_the_spool_and_a_resend_is_a_duplicate(
    live_server: LiveServer, ingest_token: str, engine: Engine, tmp_path: Path
) -> None:
    poster = Poster(live_server.url + "/api/v1/ingest", ingest_token)
    spool = Spool(tmp_path)
    payload = body()
    spool.put(payload)
    spool.put(payload)  # e.g. sealed twice around a crash: same batch id
    sender = Sender(spool, poster)
    assert sender.send_pending() is True
    assert spool.pending() == []
    assert sender.last_outcome is not None and sender.last_outcome.kind == "duplicate"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingest_batches")).scalar() == 1


def test_a_bad_batch_is_moved_aside_once_and_the_queue_goes_on(
    live_server: LiveServer, ingest_token: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.put(body(schema_version=99))
    spool.put(body())
    sender = Sender(spool, Poster(live_server.url + "/api/v1/ingest", ingest_token))
    assert sender.send_pending() is True
    assert sender.rejected == 1 and sender.delivered == 1
    [reason] = (tmp_path / "rejected").glob("*.reason.txt")
    assert "HTTP 422" in reason.read_text() and "schema_version" in reason.read_text()
    assert sum("refused batch" in r.message for r in caplog.records) == 1


def test_a_refused_token_keeps_the_batch(live_server: LiveServer, tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(body())
    sender = Sender(spool, Poster(live_server.url + "/api/v1/ingest", "gpf_not-a-token"))
    assert sender.send_pending() is False
    assert sender.last_outcome is not None and sender.last_outcome.kind == "auth"
    assert sender.last_outcome.status == 401 and len(spool.pending()) == 1


def test_server_down_keeps_the_batch_for_later(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(body())
    sender = Sender(spool, Poster(closed_port(), "gpf_x", timeout_s=2))
    assert sender.send_pending() is False
    assert sender.last_outcome is not None and sender.last_outcome.kind == "retry"
    assert "cannot reach" in sender.last_outcome.message
    assert len(spool.pending()) == 1 and sender.failures == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "rejected"),
        (413, "rejected"),
        (422, "rejected"),
        (401, "auth"),
        (403, "auth"),
        (404, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
    ],
)
def test_answers_are_classified(status: int, kind: str) -> None:
    assert classify(status, "x").kind == kind


def test_backoff_doubles_with_jitter_up_to_the_cap(tmp_path: Path) -> None:
    draws = iter([0.0, 1.0] * 20)
    sender = Sender(Spool(tmp_path), Poster("http://127.0.0.1:9/", None), backoff_max_s=60, rng=lambda: next(draws))
    delays = []
    for failures in range(1, 10):
        sender.failures = failures
        delays.append((sender.backoff_s(), sender.backoff_s()))
    assert delays[0] == (0.5, 1.0)
    assert delays[3] == (4.0, 8.0)
    assert delays[-1] == (30.0, 60.0)


def test_the_body_is_sent_gzipped_as_spooled(live_server: LiveServer, ingest_token: str, engine: Engine) -> None:
    doc = factories.batch([factories.gpu(0)], intervals=1)
    outcome = Poster(live_server.url + "/api/v1/ingest", ingest_token).post(gzip_json(doc))
    assert outcome.kind == "stored"
    assert json.loads(gzip.decompress(gzip_json(doc)))["batch_id"] == doc["batch_id"]
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT batch_id FROM ingest_batches")).scalar()
    assert stored == uuid.UUID(doc["batch_id"])
