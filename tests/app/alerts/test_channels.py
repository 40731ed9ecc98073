"""The channels against real receivers: what a webhook, Slack and an SMTP server get, and how each failure is
reported (retry or configuration, never an exception, never a secret in the reason)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid

import pytest

from app.alerts import channels
from app.alerts.channels import display_target, send_email, send_slack, send_webhook
from app.settings import Settings
from tests.app.alerts.receivers import HttpReceiver, Inbox, SmtpServer, closed_url

MID = uuid.UUID("0b7e43c1-8a4f-5d8e-b2a6-0f6c1d7e9a10")
SECRET = "whsec-test-0123456789"


# The receiver side, as docs/alerts.md gives it.
def verify(secret: bytes, body: bytes, timestamp: str, signature: str, tolerance_s: int = 300) -> bool:
    if abs(time.time() - int(timestamp)) > tolerance_s:
        return False  # too old, or from the future: maybe a replay
    expected = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(signature, "sha256=" + expected)


def _settings(**smtp: object) -> Settings:
    return Settings(database_url="postgresql://x/y", **smtp)  # type: ignore[arg-type]


def test_a_webhook_is_signed_and_the_receiver_snippet_verifies_it(receiver: HttpReceiver) -> None:
    result = send_webhook(receiver.url("/hook"), message_id=MID, payload={"kind": "open", "usd": 12.5}, secret=SECRET)
    assert result.delivered
    (req,) = receiver.requests("/hook")
    h = req.headers
    assert h["content-type"] == "application/json"
    assert h["x-gpufleet-message-id"] == str(MID)
    assert json.loads(req.body) == {"kind": "open", "usd": 12.5, "message_id": str(MID)}
    assert h["x-gpufleet-signature"].startswith("sha256=")
    assert verify(SECRET.encode(), req.body, h["x-gpufleet-timestamp"], h["x-gpufleet-signature"])
    # Another secret, a changed body, a changed timestamp, an old message: all refused.
    assert not verify(b"other", req.body, h["x-gpufleet-timestamp"], h["x-gpufleet-signature"])
    assert not verify(
        SECRET.encode(), req.body.replace(b"12.5", b"1250"), h["x-gpufleet-timestamp"], h["x-gpufleet-signature"]
    )
    assert not verify(SECRET.encode(), req.body, str(int(h["x-gpufleet-timestamp"]) - 1), h["x-gpufleet-signature"])


def test_a_replayed_webhook_is_refused_by_its_timestamp(receiver: HttpReceiver) -> None:
    old = int(time.time()) - 3600
    assert send_webhook(receiver.url("/hook"), message_id=MID, payload={}, secret=SECRET, timestamp=old).delivered
    (req,) = receiver.requests()
    assert req.headers["x-gpufleet-timestamp"] == str(old)
    assert req.headers["x-gpufleet-signature"] == channels.sign(SECRET, old, req.body)  # genuine, but stale
    assert not verify(SECRET.encode(), req.body, str(old), req.headers["x-gpufleet-signature"])


def test_a_webhook_without_secret_is_sent_unsigned(receiver: HttpReceiver) -> None:
    assert send_webhook(receiver.url("/hook"), message_id=MID, payload={"a": 1}, secret=None).delivered
    (req,) = receiver.requests()
    assert "x-gpufleet-signature" not in req.headers
    assert req.headers["x-gpufleet-message-id"] == str(MID)


def test_slack_gets_text_blocks_and_the_message_id_in_a_context_block(receiver: HttpReceiver) -> None:
    payload = {"text": "g5.xlarge i-0abc idle for 102 h, $1.01/h"}
    assert send_slack(receiver.url("/services/T0/B0/x"), message_id=MID, payload=payload).delivered
    body = json.loads(receiver.requests()[0].body)
    assert body["text"] == payload["text"]
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": payload["text"]}}
    assert body["blocks"][-1]["type"] == "context"
    assert str(MID) in body["blocks"][-1]["elements"][0]["text"]


def test_slack_keeps_the_payloads_blocks(receiver: HttpReceiver) -> None:
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": "Idle GPU"}}]
    assert send_slack(receiver.url("/s"), message_id=MID, payload={"text": "t", "blocks": blocks}).delivered
    body = json.loads(receiver.requests()[0].body)
    assert body["blocks"][0] == blocks[0]
    assert [b["type"] for b in body["blocks"]] == ["header", "context"]


@pytest.mark.parametrize(
    ("status", "retry_after", "retryable", "wait"),
    [
        (500, None, True, None),
        (502, "7", True, None),  # Retry-After is obeyed on 429 and 503 only
        (503, "30", True, 30.0),
        (429, "120", True, 120.0),
        (404, None, False, None),
        (403, None, False, None),
    ],
)
def test_http_answers_are_classified(
    receiver: HttpReceiver, status: int, retry_after: str | None, retryable: bool, wait: float | None
) -> None:
    path = "/services/T0/B0/SECRETTOKEN"
    receiver.fault(path, status=status, retry_after=retry_after)
    result = send_slack(receiver.url(path), message_id=MID, payload={"text": "x"})
    assert not result.delivered
    assert result.retryable is retryable
    assert result.retry_after_s == wait
    assert result.reason is not None and f"HTTP {status}" in result.reason
    assert "SECRETTOKEN" not in result.reason
    assert ("configuration" in result.reason) is (not retryable)


def test_a_receiver_that_is_down_is_a_retry() -> None:
    result = send_webhook(closed_url("/hook?token=SECRETTOKEN"), message_id=MID, payload={}, secret=SECRET)
    assert not result.delivered and result.retryable
    assert result.reason is not None and "refused" in result.reason.lower()
    assert "SECRETTOKEN" not in result.reason


def test_a_slow_receiver_times_out_as_a_retry(receiver: HttpReceiver) -> None:
    receiver.fault("/slow", status=200, delay_s=3)
    started = time.monotonic()
    result = send_webhook(receiver.url("/slow"), message_id=MID, payload={}, secret=None, timeout_s=0.5)
    assert time.monotonic() - started < 2.5
    assert not result.delivered and result.retryable
    assert result.reason is not None and "timed out" in result.reason


def test_targets_are_shown_without_their_secrets() -> None:
    one = display_target("https://hooks.slack.com/services/T0/B0/XYZ")
    other = display_target("https://hooks.slack.com/services/T0/B1/ABC")
    assert one.startswith("https://hooks.slack.com/... #") and "XYZ" not in one
    assert other.startswith("https://hooks.slack.com/... #") and other != one
    assert display_target("http://127.0.0.1:8080/hook?t=1").startswith("http://127.0.0.1:8080/... #")
    assert display_target("https://example.com") == "https://example.com"
    assert display_target("ops@example.com") == "ops@example.com"


def _smtp_settings(server: SmtpServer, **more: object) -> Settings:
    values: dict[str, object] = {
        "smtp_host": server.host,
        "smtp_port": server.port,
        "smtp_user": server.user,
        "smtp_password": server.password,
        "smtp_from": "gpufleet@example.com",
    }
    return _settings(**(values | more))


@pytest.mark.parametrize("smtp_tls", ["LOGIN", "PLAIN"], indirect=True)
def test_email_goes_over_starttls_with_auth_and_carries_the_message_id(smtp_tls: SmtpServer) -> None:
    payload = {"subject": "Idle GPU on i-0abc", "text": "idle for 102 h", "html": "<p>idle for 102 h</p>"}
    result = send_email(
        _smtp_settings(smtp_tls),
        to="owner@example.com",
        message_id=MID,
        payload=payload,
        context=smtp_tls.client_context,
    )
    assert result.delivered, result.reason
    (mail,) = smtp_tls.inbox.mails
    assert mail.tls
    assert smtp_tls.inbox.logins == [(smtp_tls.only, smtp_tls.user)]
    assert mail.mail_from == "gpufleet@example.com" and mail.rcpt_tos == ["owner@example.com"]
    m = mail.message
    assert m["Message-ID"] == f"<{MID}@gpufleet>"
    assert m["X-Gpufleet-Message-Id"] == str(MID)
    assert m["Subject"] == "Idle GPU on i-0abc"
    plain = m.get_body(preferencelist=("plain",))
    html = m.get_body(preferencelist=("html",))
    assert plain is not None and plain.get_content().strip() == "idle for 102 h"
    assert html is not None and "<p>idle for 102 h</p>" in html.get_content()


def test_email_is_not_sent_in_clear_to_a_server_without_starttls(smtp_plain: tuple[int, Inbox]) -> None:
    port, inbox = smtp_plain
    settings = _settings(smtp_host="127.0.0.1", smtp_port=port)
    result = send_email(settings, to="owner@example.com", message_id=MID, payload={"subject": "s", "text": "t"})
    assert not result.delivered and result.retryable
    assert result.reason is not None and "STARTTLS" in result.reason
    assert inbox.mails == []
    # With STARTTLS off, the same server takes it.
    off = _settings(smtp_host="127.0.0.1", smtp_port=port, smtp_starttls="off")
    assert send_email(off, to="owner@example.com", message_id=MID, payload={"subject": "s", "text": "t"}).delivered
    assert len(inbox.mails) == 1 and not inbox.mails[0].tls


def test_a_refused_login_is_a_configuration_error_without_the_password(smtp_tls: SmtpServer) -> None:
    settings = _smtp_settings(smtp_tls, smtp_password="wrong-pw-SECRET")
    result = send_email(settings, to="o@example.com", message_id=MID, payload={}, context=smtp_tls.client_context)
    assert not result.delivered and not result.retryable
    assert result.reason is not None and "login" in result.reason and "SECRET" not in result.reason
    assert smtp_tls.inbox.mails == []


def test_an_unknown_certificate_is_refused(smtp_tls: SmtpServer) -> None:
    result = send_email(_smtp_settings(smtp_tls), to="o@example.com", message_id=MID, payload={})
    assert not result.delivered
    assert result.reason is not None and "certificate" in result.reason
    assert smtp_tls.inbox.mails == []


def test_the_ca_in_ssl_cert_file_is_trusted(smtp_tls: SmtpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(smtp_tls.ca_file))
    result = send_email(_smtp_settings(smtp_tls), to="o@example.com", message_id=MID, payload={"text": "t"})
    assert result.delivered, result.reason


def test_an_smtp_server_that_is_down_is_a_retry() -> None:
    settings = _settings(smtp_host="127.0.0.1", smtp_port=int(closed_url().split(":")[2].split("/")[0]))
    result = send_email(settings, to="o@example.com", message_id=MID, payload={})
    assert not result.delivered and result.retryable
    assert result.reason is not None and "refused" in result.reason.lower()


def test_no_smtp_host_is_a_configuration_error() -> None:
    result = send_email(_settings(), to="o@example.com", message_id=MID, payload={})
    assert not result.delivered and not result.retryable
    assert result.reason is not None and "GPUFLEET_SMTP_HOST" in result.reason
