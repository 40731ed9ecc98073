"""The outbox against the real database and real receivers: each message delivered once, retried with backoff,
a down or slow target delaying only its own messages, senders that run at once never doubling a message, and a
crash between send and record resending with the same message id."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import channels
from app.alerts.outbox import (
    BACKOFF_MAX_S,
    LEASE_S,
    backoff_s,
    claim,
    enqueue,
    message_id,
    outbox_status,
    record_failed,
    send_due,
    sender_job,
)
from app.alerts.tables import alert_outbox
from app.db import make_engine, make_sessionmaker, session_scope
from app.settings import Settings
from tests.app.alerts.jobs import run_beside_outage
from tests.app.alerts.receivers import HttpReceiver, SmtpServer, closed_url

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _queue(
    sessions: sessionmaker[Session],
    url: str,
    n: int = 1,
    *,
    channel: str = "webhook",
    due_at: datetime = T0,
    tag: str = "",
) -> list[uuid.UUID]:
    ids = [message_id("test", url, tag, i) for i in range(n)]
    with session_scope(sessions) as s:
        for i, mid in enumerate(ids):
            payload: dict[str, Any] = {"text": f"message {i}"} if channel == "slack" else {"n": i}
            if channel == "email":
                payload = {"subject": f"alert {i}", "text": f"message {i}"}
            enqueue(
                s,
                message_id=mid,
                incident_id=None,
                kind="open",
                channel=channel,
                target=url,
                secret="k" if channel == "webhook" else None,
                payload=payload,
                due_at=due_at - timedelta(milliseconds=n - i),
            )
    return ids


def _rows(sessions: sessionmaker[Session]) -> dict[uuid.UUID, Any]:
    with sessions() as s:
        return {r.message_id: r for r in s.execute(select(alert_outbox))}


def test_enqueue_twice_stores_one_row(sessions: sessionmaker[Session]) -> None:
    mid = message_id("incident", 7, "open", "https://example.com/hook")
    assert mid == message_id("incident", 7, "open", "https://example.com/hook")
    assert mid != message_id("incident", 7, "reminder", "https://example.com/hook")
    kwargs: dict[str, Any] = {
        "message_id": mid,
        "incident_id": None,
        "kind": "open",
        "channel": "webhook",
        "target": "https://example.com/hook",
        "secret": None,
    }
    with session_scope(sessions) as s:
        assert enqueue(s, payload={"first": True}, **kwargs)
        assert not enqueue(s, payload={"second": True}, **kwargs)
    with session_scope(sessions) as s:
        assert not enqueue(s, payload={"third": True}, **kwargs)
    rows = _rows(sessions)
    assert len(rows) == 1 and rows[mid].payload == {"first": True}


def test_enqueue_is_part_of_the_callers_transaction(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        enqueue(
            s,
            message_id=uuid.uuid4(),
            incident_id=None,
            kind="open",
            channel="webhook",
            target="x",
            secret=None,
            payload={},
        )
        s.rollback()
    assert _rows(sessions) == {}


def test_backoff_doubles_with_jitter_up_to_an_hour() -> None:
    rng = random.Random(1)
    for attempts, full in [(1, 15), (2, 30), (3, 60), (8, 1920), (9, 3600), (40, 3600)]:
        waits = [backoff_s(attempts, rng=rng) for _ in range(200)]
        assert full / 2 <= min(waits) and max(waits) <= full
        assert max(waits) - min(waits) > full / 4  # spread, so messages that failed together do not return together
    assert backoff_s(1, 120.0) == 120.0
    assert backoff_s(1, 86400.0) == BACKOFF_MAX_S


def test_a_message_is_retried_after_500s_and_delivered_exactly_once(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    receiver.fault("/hook", status=500, times=2)
    (mid,) = _queue(sessions, receiver.url("/hook"))
    first = send_due(sessions, settings, now=T0)
    assert (first.delivered, first.failed) == (0, 1)
    row = _rows(sessions)[mid]
    assert row.attempts == 1 and "HTTP 500" in row.last_error and row.sent_at is None and row.leased_until is None
    assert T0 + timedelta(seconds=7.5) <= row.due_at <= T0 + timedelta(seconds=15)
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=5)).claimed == 0  # backing off
    t = T0 + timedelta(seconds=16)
    assert send_due(sessions, settings, now=t).failed == 1
    second_due = _rows(sessions)[mid].due_at
    assert t + timedelta(seconds=15) <= second_due <= t + timedelta(seconds=30)  # doubled
    assert send_due(sessions, settings, now=second_due).delivered == 1
    for minutes in (1, 10, 100):
        assert send_due(sessions, settings, now=second_due + timedelta(minutes=minutes)).claimed == 0
    assert [r.status for r in receiver.requests()] == [500, 500, 200]
    assert {r.headers["x-gpufleet-message-id"] for r in receiver.requests()} == {str(mid)}
    row = _rows(sessions)[mid]
    assert row.sent_at == second_due and row.attempts == 3 and row.last_error is None


def test_retry_after_sets_the_next_try(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    receiver.fault("/busy", status=429, times=1, retry_after="120")
    (mid,) = _queue(sessions, receiver.url("/busy"), channel="slack")
    assert send_due(sessions, settings, now=T0).failed == 1
    assert _rows(sessions)[mid].due_at == T0 + timedelta(seconds=120)
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=119)).claimed == 0
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=120)).delivered == 1


def test_a_down_target_delays_only_its_own_messages(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    down = closed_url("/hook")
    down_ids = _queue(sessions, down, 3, due_at=T0 - timedelta(seconds=1))  # first in line
    up_ids = _queue(sessions, receiver.url("/up"), 3)
    report = send_due(sessions, settings, now=T0)
    assert (report.claimed, report.delivered, report.failed, report.deferred) == (6, 3, 1, 2)
    assert receiver.delivered_ids("/up") == [str(i) for i in up_ids]
    rows = _rows(sessions)
    tried, *deferred = (rows[i] for i in down_ids)
    assert tried.attempts == 1 and "refused" in tried.last_error.lower()
    for row in deferred:  # not tried, not counted, but waiting with the target
        assert row.attempts == 0 and row.sent_at is None and row.leased_until is None
        assert row.due_at >= tried.due_at
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=1)).claimed == 0
    assert report.failures == {channels.display_target(down): tried.last_error}

    with sessions() as s:
        status = {st.target: st for st in outbox_status(s, now=T0)}
    shown = channels.display_target(down)
    assert list(status) == [shown, channels.display_target(receiver.url("/up"))]  # the failing one first
    assert status[shown].queued == 3 and status[shown].sent_last_day == 0
    assert status[shown].last_error == tried.last_error
    assert status[shown].oldest_due == tried.due_at
    up = status[channels.display_target(receiver.url("/up"))]
    assert (up.queued, up.sent_last_day, up.last_error) == (0, 3, None)


def test_a_slow_target_does_not_hold_back_another(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    receiver.fault("/slow", status=200, delay_s=4)
    _queue(sessions, receiver.url("/slow"), 3, due_at=T0 - timedelta(seconds=1))  # first in line
    fast_ids = _queue(sessions, receiver.url("/fast"), 3)
    started = time.monotonic()
    report = send_due(sessions, settings, now=T0, timeout_s=1.0)
    took = time.monotonic() - started
    assert report.delivered == 3 and report.failed == 1 and report.deferred == 2
    assert receiver.delivered_ids("/fast") == [str(i) for i in fast_ids]
    slow_first = receiver.requests("/slow")[0].at
    # The fast target's messages arrived while the slow one was still timing out, and the round took one timeout,
    # not one per slow message.
    assert max(r.at for r in receiver.requests("/fast")) < slow_first + 1.0
    assert len(receiver.requests("/slow")) == 1
    assert took < 3.0


def test_two_senders_at_once_deliver_each_message_once(
    database_url: str, sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    ids = [mid for k in range(4) for mid in _queue(sessions, receiver.url(f"/t{k}"), 10)]
    for k in range(4):
        receiver.fault(f"/t{k}", status=200, delay_s=0.02)
    engines = [make_engine(database_url, pool_size=4) for _ in range(2)]
    barrier = threading.Barrier(2)

    def sender(engine: Engine) -> None:
        own = make_sessionmaker(engine)
        barrier.wait()
        for _ in range(30):  # 40 messages, 7 a round: a few rounds each, unless a message went twice
            if not send_due(own, settings, now=T0, batch=7).claimed:
                break

    try:
        threads = [threading.Thread(target=sender, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for e in engines:
            e.dispose()
    assert Counter(receiver.delivered_ids()) == Counter(str(i) for i in ids)
    assert all(r.sent_at is not None for r in _rows(sessions).values())


def test_a_sender_takes_nothing_another_holds(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    gate = threading.Event()
    receiver.fault("/held", status=200, gate=gate)
    ids = _queue(sessions, receiver.url("/held"), 3)
    first = threading.Thread(target=send_due, args=(sessions, settings), kwargs={"now": T0})
    first.start()
    try:
        deadline = time.monotonic() + 10
        while not receiver.requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        # The first sender is mid-send and holds all three: a second one takes none of them.
        assert send_due(sessions, settings, now=T0 + timedelta(seconds=30)).claimed == 0
    finally:
        gate.set()
        first.join(30)
    assert receiver.delivered_ids() == [str(i) for i in ids]


def test_a_claim_skips_rows_another_transaction_has_locked(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    ids = _queue(sessions, receiver.url("/a"), 3)
    done: list[int] = []
    with sessions() as locker:
        locker.execute(text("SELECT 1 FROM alert_outbox WHERE message_id = :m FOR UPDATE"), {"m": ids[0]})
        t = threading.Thread(target=lambda: done.append(send_due(sessions, settings, now=T0).delivered))
        t.start()
        t.join(5)  # without SKIP LOCKED it would wait for this transaction
        assert done == [2]
        locker.rollback()
    assert send_due(sessions, settings, now=T0).delivered == 1
    assert receiver.delivered_ids() == [str(ids[1]), str(ids[2]), str(ids[0])]


def test_a_crash_between_send_and_record_resends_with_the_same_id(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver
) -> None:
    (mid,) = _queue(sessions, receiver.url("/hook"))
    # A sender claims and sends, then dies before it records.
    (held,) = claim(sessions, now=T0)
    sent = channels.send(
        settings,
        channel=held.channel,
        target=held.target,
        secret=held.secret,
        message_id=held.message_id,
        payload=held.payload,
    )
    assert sent.delivered
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=LEASE_S - 1)).claimed == 0  # its lease holds
    assert send_due(sessions, settings, now=T0 + timedelta(seconds=LEASE_S + 1)).delivered == 1
    assert receiver.delivered_ids() == [str(mid), str(mid)]
    bodies = [r.body for r in receiver.requests()]
    assert all(f'"message_id":"{mid}"'.encode() in b for b in bodies)
    assert send_due(sessions, settings, now=T0 + timedelta(hours=1)).claimed == 0


def test_a_late_record_does_not_undo_a_later_senders_claim(sessions: sessionmaker[Session]) -> None:
    (mid,) = _queue(sessions, "http://127.0.0.1:9/x")
    (stale,) = claim(sessions, now=T0)
    (fresh,) = claim(sessions, now=T0 + timedelta(seconds=LEASE_S + 1))
    record_failed(sessions, stale, "late", T0 + timedelta(hours=1))
    row = _rows(sessions)[mid]
    assert row.leased_until == fresh.leased_until and row.attempts == 0 and row.last_error is None


def test_email_goes_through_the_outbox(
    sessions: sessionmaker[Session], smtp_tls: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(smtp_tls.ca_file))
    settings = Settings(
        database_url="postgresql://x/y",
        smtp_host=smtp_tls.host,
        smtp_port=smtp_tls.port,
        smtp_user=smtp_tls.user,
        smtp_password=smtp_tls.password,
    )
    (mid,) = _queue(sessions, "owner@example.com", channel="email")
    assert send_due(sessions, settings, now=T0).delivered == 1
    (mail,) = smtp_tls.inbox.mails
    assert mail.rcpt_tos == ["owner@example.com"] and mail.message["X-Gpufleet-Message-Id"] == str(mid)


def test_the_sender_job_delivers_and_a_database_outage_is_logged_once(
    engine: Engine, settings: Settings, receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    (mid,) = _queue(make_sessionmaker(engine), receiver.url("/hook"), due_at=datetime.now(UTC) - timedelta(seconds=1))
    fast = settings.model_copy(update={"alerts_send_s": 0.05})
    run_beside_outage(
        lambda e: sender_job(e, fast), engine, lambda: bool(receiver.delivered_ids()), caplog, timeout_s=10
    )
    assert receiver.delivered_ids() == [str(mid)]
    outages = [r for r in caplog.records if "the outbox failed" in r.getMessage()]
    assert len(outages) == 1 and "database" in outages[0].getMessage()
