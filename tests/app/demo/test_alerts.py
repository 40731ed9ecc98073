"""The demo's alert receiver: it prints each signed message once, and refuses what is not signed with the demo's
secret."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from app.alerts.channels import send_webhook
from app.demo.alerts import SECRET, PrintingReceiver, demo_rule


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
