"""The demo's alert rule and receiver: the receiver prints each signed message once and refuses what is not signed
with the demo's secret; the rule is made afresh at each start."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import outbox
from app.alerts.channels import send_webhook
from app.alerts.tables import alert_incidents, alert_outbox
from app.db import session_scope
from app.demo.alerts import SECRET, PrintingReceiver, demo_rule, install_rule


@pytest.fixture
def shown() -> Iterator[tuple[PrintingReceiver, list[str]]]:
    lines: list[str] = []
    receiver = PrintingReceiver(lines.append).start()
    try:
        yield receiver, lines
    finally:
        receiver.stop()


def test_a_signed_message_is_printed_once_however_often_it_comes(
    shown: tuple[PrintingReceiver, list[str]],
) -> None:
    receiver, lines = shown
    message = uuid.uuid4()
    payload = {
        "text": "GPU 0 of vision-finetune-dev\n idle for 102 h: $102.61 so far",
        "snooze_url": "http://127.0.0.1:8000/alerts/snooze/7.1.abc",
    }
    for _ in range(2):
        assert send_webhook(receiver.url, message_id=message, payload=payload, secret=SECRET).delivered
    assert lines == [
        "GPU 0 of vision-finetune-dev idle for 102 h: $102.61 so far "
        "(snooze: http://127.0.0.1:8000/alerts/snooze/7.1.abc)"
    ]


def test_a_message_not_signed_with_the_demo_secret_is_refused(shown: tuple[PrintingReceiver, list[str]]) -> None:
    receiver, lines = shown
    result = send_webhook(receiver.url, message_id=uuid.uuid4(), payload={"text": "x"}, secret="another-secret-0123")
    assert not result.delivered
    request = urllib.request.Request(receiver.url, data=b'{"text": "y"}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    refused.value.close()
    assert refused.value.code == 401
    assert lines == []


def test_the_demo_rule_reports_idle_gpus_to_a_signed_webhook() -> None:
    rule = demo_rule("http://127.0.0.1:9/hook")
    assert rule.condition == "gpu_idle" and rule.route.target is not None
    assert rule.route.target.channel == "webhook" and rule.route.target.secret == SECRET


def test_a_demo_started_again_tells_its_story_again(sessions: sessionmaker[Session]) -> None:
    now = datetime.now(UTC)
    with session_scope(sessions) as s:
        first = install_rule(s, "http://127.0.0.1:9/first", now=now)
        incident = s.execute(
            insert(alert_incidents)
            .values(rule_id=first.id, subject="gpu:GPU-1", since=now - timedelta(hours=5))
            .returning(alert_incidents.c.id)
        ).scalar_one()
        outbox.enqueue(
            s,
            message_id=uuid.uuid4(),
            incident_id=incident,
            kind="open",
            channel="webhook",
            target="http://127.0.0.1:9/first",
            secret=SECRET,
            payload={"text": "idle"},
        )
    with session_scope(sessions) as s:
        again = install_rule(s, "http://127.0.0.1:9/second", now=now)
    with session_scope(sessions) as s:
        assert again.route.target is not None and again.route.target.url == "http://127.0.0.1:9/second"
        assert s.execute(select(alert_incidents)).all() == []
        assert s.execute(select(alert_outbox)).all() == []
