from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from agent.send import RETRY_AFTER_MAX_S, Poster, Sender, classify
from agent.spool import Spool, gzip_json
from tests import factories

from .live_server import LiveServer
from .receiver import Answer, Receiver


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


# -- a batch the server keeps failing on; Retry-After --------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def spool_batches(spool: Spool, count: int) -> list[str]:
    """Spool `count` batches; their ids, oldest first."""
    ids = []
    for _ in range(count):
        doc = factories.batch([factories.gpu(0)], intervals=1)
        spool.put(gzip_json(doc))
        ids.append(doc["batch_id"])
    return ids


def test_a_batch_the_server_keeps_failing_on_is_set_aside_and_the_newer_ones_go(
    receiver: Receiver, tmp_path: Path
) -> None:
    spool = Spool(tmp_path)
    poison, newer, newest = spool_batches(spool, 3)
    [poison_file, *_] = spool.pending()
    kept = poison_file.path.read_bytes()
    receiver.poison.add(poison)
    sender = Sender(spool, Poster(receiver.url, "gpf_x"), set_aside_after=3)
    assert [sender.send_pending() for _ in range(3)] == [False, False, True]
    assert receiver.ids() == [poison] * 3 + [newer, newest]
    assert spool.pending() == [] and sender.set_aside == 1 and sender.delivered == 2
    [aside] = spool.aside()
    assert aside.path == tmp_path / "aside" / poison_file.path.name and aside.path.read_bytes() == kept, "kept"
    assert [b.path.name for b in Spool(tmp_path).aside()] == [poison_file.path.name], "and after a restart"
    [event] = spool.events()
    assert event["kind"] == "batch_set_aside"
    assert event["details"] == {
        "batch_id": poison,
        "sealed_at": event["details"]["sealed_at"],
        "tries": 3,
        "status": 500,
        "error": "scripted answer 500",
        "set_aside_now": 1,
    }


def test_answers_that_say_the_server_is_busy_or_down_do_not_count_toward_setting_aside(
    receiver: Receiver, tmp_path: Path
) -> None:
    spool = Spool(tmp_path)
    [poison, newer] = spool_batches(spool, 2)
    receiver.poison.add(poison)
    poster = Poster(receiver.url, "gpf_x", timeout_s=0.5)
    sender = Sender(spool, poster, set_aside_after=2)
    receiver.script = [
        Answer(500),
        Answer(503, {"Retry-After": "0"}),
        Answer(429, {"Retry-After": "0"}),
        Answer(502),
        Answer(504),
        Answer(200, stall_s=1.0),  # no answer within the timeout
    ]
    for _ in receiver.script[:]:
        assert sender.send_pending() is False
        assert spool.aside() == [], "one answer that may blame the batch, and five that do not"
    poster.url = closed_port()
    assert sender.send_pending() is False and spool.aside() == [], "connection refused does not count either"
    poster.url = receiver.url
    assert sender.send_pending() is True, "the second 500 sets it aside"
    assert [b.seq for b in spool.aside()] == [1] and receiver.ids()[-2:] == [poison, newer]
    assert [e["details"]["tries"] for e in spool.events()] == [2]


def test_a_set_aside_batch_is_tried_hourly_and_delivered_once_the_server_takes_it(
    receiver: Receiver, tmp_path: Path
) -> None:
    spool = Spool(tmp_path)
    first, second, third = spool_batches(spool, 3)
    receiver.poison.update({first, second})
    clock = Clock()
    sender = Sender(spool, Poster(receiver.url, "gpf_x"), set_aside_after=1, aside_retry_s=3600, clock=clock)
    assert sender.send_pending() is True
    assert receiver.ids() == [first, second, third] and len(spool.aside()) == 2
    clock.t += 3599
    assert sender.send_pending() is True and len(receiver.posts) == 3, "not due yet"
    clock.t += 2
    assert sender.send_pending() is True
    assert receiver.ids()[3:] == [first, second] and len(spool.aside()) == 2, "one try each, an hour later"
    receiver.poison.discard(first)
    spool_batches(spool, 1)
    clock.t += 1800
    assert sender.send_pending() is True and len(receiver.posts) == 6, "the new batch goes at once"
    clock.t += 1801
    receiver.poison.clear()
    assert sender.send_pending() is True
    assert receiver.ids()[6:] == [first, second], "once one is taken, the others are tried at once"
    assert spool.aside() == [] and not list((tmp_path / "aside").glob("*.gz"))
    assert set(receiver.stored) == {first, second, third, receiver.ids()[5]}
    kinds = [(e["kind"], e["details"]["batch_id"]) for e in spool.events()]
    assert kinds == [
        ("batch_set_aside", first),
        ("batch_set_aside", second),
        ("batch_set_aside_delivered", first),
        ("batch_set_aside_delivered", second),
    ]


def test_the_sender_waits_as_long_as_retry_after_asks(receiver: Receiver, tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    [batch_id] = spool_batches(spool, 1)
    receiver.script = [Answer(503, {"Retry-After": "2"})]
    sender = Sender(spool, Poster(receiver.url, "gpf_x"), backoff_base_s=0.01)
    stop = threading.Event()
    worker = threading.Thread(target=sender.run, args=(stop,))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while len(receiver.posts) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        worker.join(10)
    first, second = receiver.posts[:2]
    # Its own back-off would have tried again after 5-10 ms; 2 s plus up to 1 s of jitter, and some slack.
    assert 2.0 <= second.at - first.at < 3.5
    assert [p.status for p in receiver.posts] == [503, 200] and batch_id in receiver.stored


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        ("2", 2.0, 3.0),  # at least 1 s of jitter
        ("120", 120.0, 150.0),  # up to a quarter more
        ("in a while", 0.5, 1.0),  # unreadable: the sender's own back-off after one failure
        ("86400", RETRY_AFTER_MAX_S, RETRY_AFTER_MAX_S),
        ("date+60", 58.0, 76.0),
        ("date-60", 0.0, 1.0),
    ],
)
def test_retry_after_in_seconds_or_as_a_date_is_honoured_with_jitter_and_a_cap(
    receiver: Receiver, tmp_path: Path, header: str, low: float, high: float
) -> None:
    if header.startswith("date"):
        header = formatdate(time.time() + float(header[4:]), usegmt=True)
    spool = Spool(tmp_path)
    spool_batches(spool, 1)
    for draw in (0.0, 1.0):
        sender = Sender(spool, Poster(receiver.url, "gpf_x"), rng=lambda draw=draw: draw)
        receiver.script = [Answer(429, {"Retry-After": header})]
        assert sender.send_pending() is False
        assert low <= sender.backoff_s() <= high


def test_the_reports_about_a_set_aside_batch_fit_the_servers_schema(
    receiver: Receiver, live_server: LiveServer, ingest_token: str, engine: Engine, tmp_path: Path
) -> None:
    spool = Spool(tmp_path)
    [poison] = spool_batches(spool, 1)
    receiver.script = [Answer(500, error="database said: " + "x" * 2000)]
    clock = Clock()
    sender = Sender(spool, Poster(receiver.url, "gpf_x"), set_aside_after=1, clock=clock)
    assert sender.send_pending() is True
    clock.t += 3600
    assert sender.send_pending() is True and poison in receiver.stored
    doc = factories.batch([factories.gpu(0)], intervals=1)
    doc["events"] = spool.events()
    assert len(doc["events"][0]["details"]["error"]) == 200
    assert Poster(live_server.url + "/api/v1/ingest", ingest_token).post(gzip_json(doc)).kind == "stored"
    with engine.connect() as conn:
        kinds = conn.execute(text("SELECT kind FROM events WHERE kind LIKE 'batch%' ORDER BY id")).scalars().all()
    assert kinds == ["batch_set_aside", "batch_set_aside_delivered"]
