"""One wrapper per outside service a message leaves through: a Slack incoming webhook, a generic signed webhook,
email over SMTP (docs/alerts.md, "Routes"). Each send returns a `SendResult`; nothing raises into the sender's
loop. Error texts name the host, never a whole URL (a Slack webhook's path is its secret) nor a password.

What counts as what:
- HTTP 2xx: delivered.
- 408, 429, 5xx, refused or reset connections, timeouts: retry; `Retry-After` of a 429 or 503 sets the wait.
- Other 3xx and 4xx: retried all the same (a message is never dropped), with a reason that says it is probably a
  configuration error (a revoked Slack hook, a wrong URL or secret).
- SMTP: 4yz answers and lost connections: retry; 5yz answers, a refused login, a bad certificate: configuration.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit

from agent.httpclient import HttpError, parse_retry_after, request, tls_context

from .. import __version__
from ..settings import Settings

TIMEOUT_S = 10.0
"""Longest wait for each step of one request (connect, send, answer), s."""

SIGNATURE_HEADER = "X-Gpufleet-Signature"
TIMESTAMP_HEADER = "X-Gpufleet-Timestamp"
MESSAGE_ID_HEADER = "X-Gpufleet-Message-Id"

_RETRY_STATUSES = frozenset({408, 425, 429})
_RETRY_AFTER_STATUSES = frozenset({429, 503})
_EXCERPT = 200  # characters of a receiver's error answer kept in the reason


@dataclass(frozen=True)
class SendResult:
    """What became of one send. `retryable` False: the same send will most likely fail again until someone
    fixes the configuration; the outbox retries it anyway, so a fix delivers what waited."""

    delivered: bool
    reason: str | None = None
    retryable: bool = True
    retry_after_s: float | None = None
    """The receiver's `Retry-After`, s from its answer; None when it gave none."""


DELIVERED = SendResult(delivered=True)


def _failed(reason: str, *, retryable: bool = True, retry_after_s: float | None = None) -> SendResult:
    return SendResult(delivered=False, reason=reason, retryable=retryable, retry_after_s=retry_after_s)


def display_target(target: str) -> str:
    """A target as it may be shown or logged: an email address whole, a URL as scheme, host and port only (its
    path or query may hold a token), then a short digest of the whole URL to tell two webhooks of one host apart:
    `https://hooks.slack.com/... #3f2a9c`."""
    if "://" not in target:
        return target
    parts = urlsplit(target)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    shown = f"{parts.scheme}://{parts.hostname or '?'}{port}"
    if not (parts.path.strip("/") or parts.query):
        return shown
    return f"{shown}/... #{hashlib.sha256(target.encode()).hexdigest()[:6]}"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Gpufleet-Signature` value: HMAC-SHA256 with `secret` over `<timestamp>.<body>`, hex, prefixed
    `sha256=`. The timestamp (Unix s) is signed so a receiver can refuse an old message replayed."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def _post_json(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> SendResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return _failed("not an http(s) URL: probably a configuration error", retryable=False)
    host = display_target(url)
    all_headers = {"Content-Type": "application/json", "User-Agent": f"gpufleet/{__version__}", **headers}
    try:
        answer = request(
            "POST",
            url,
            body=body,
            headers=all_headers,
            timeout_s=timeout_s,
            context=tls_context() if parts.scheme == "https" else None,
            max_body=4096,
        )
    except HttpError as exc:
        text = str(exc)
        # The client names a URL it cannot parse; the URL may carry a token.
        reason = "bad URL" if text.startswith(("bad URL", "not an http")) else text
        return _failed(f"cannot reach {host}: {reason}")
    if 200 <= answer.status < 300:
        return DELIVERED
    excerpt = answer.body[:_EXCERPT].decode("utf-8", "replace").strip()
    said = f": {excerpt}" if excerpt else ""
    if answer.status in _RETRY_STATUSES or answer.status >= 500:
        wait = None
        if answer.status in _RETRY_AFTER_STATUSES:
            wait = parse_retry_after(answer.headers.get("retry-after"), time.time())
        return _failed(f"HTTP {answer.status} from {host}{said}", retry_after_s=wait)
    return _failed(
        f"HTTP {answer.status} from {host}{said} (probably a configuration error: check the route's URL and secret)",
        retryable=False,
    )


def slack_body(message_id: uuid.UUID, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON an incoming webhook gets: `text` (the notification and fallback), the payload's `blocks` (or one
    section of the text), and a context block naming the message id so people can tell a repeat."""
    text = str(payload.get("text") or payload.get("subject") or "")
    blocks = list(payload.get("blocks") or [])
    if not blocks and text:
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}]
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"gpufleet message `{message_id}`"}]})
    return {**payload, "text": text, "blocks": blocks}


def send_slack(
    url: str, *, message_id: uuid.UUID, payload: Mapping[str, Any], timeout_s: float = TIMEOUT_S
) -> SendResult:
    """POST a message to a Slack incoming webhook; `payload` holds `text` and optionally `blocks`."""
    body = json.dumps(slack_body(message_id, payload), ensure_ascii=False).encode()
    return _post_json(url, body, {}, timeout_s)


def send_webhook(
    url: str,
    *,
    message_id: uuid.UUID,
    payload: Mapping[str, Any],
    secret: str | None,
    timeout_s: float = TIMEOUT_S,
    timestamp: int | None = None,
) -> SendResult:
    """POST `payload` (plus its `message_id`) as JSON with the message id, timestamp and, when the route has a
    `secret`, signature headers. `timestamp`: Unix s, now unless given."""
    body = json.dumps({**payload, "message_id": str(message_id)}, ensure_ascii=False, separators=(",", ":")).encode()
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {MESSAGE_ID_HEADER: str(message_id), TIMESTAMP_HEADER: str(ts)}
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, ts, body)
    return _post_json(url, body, headers, timeout_s)


def email_message(settings: Settings, to: str, message_id: uuid.UUID, payload: Mapping[str, Any]) -> EmailMessage:
    """The email: `payload` holds `subject`, `text` and optionally `html` (sent as an alternative)."""
    msg = EmailMessage()
    msg["From"] = settings.smtp_from
    msg["To"] = to
    msg["Subject"] = str(payload.get("subject") or "gpufleet alert")
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = f"<{message_id}@gpufleet>"
    msg[MESSAGE_ID_HEADER] = str(message_id)
    msg.set_content(str(payload.get("text") or ""))
    if payload.get("html"):
        msg.add_alternative(str(payload["html"]), subtype="html")
    return msg


def _smtp_answer(exc: smtplib.SMTPResponseException) -> str:
    said = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
    return f"{exc.smtp_code} {said}".strip()[:_EXCERPT]


def _smtp_failed(server: str, code: int, said: str) -> SendResult:
    if 400 <= code < 500:
        return _failed(f"{server} answered {said}")
    return _failed(f"{server} answered {said} (probably a configuration error)", retryable=False)


def send_email(
    settings: Settings,
    *,
    to: str,
    message_id: uuid.UUID,
    payload: Mapping[str, Any],
    timeout_s: float = TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> SendResult:
    """Send one email through `GPUFLEET_SMTP_HOST`: STARTTLS first when `GPUFLEET_SMTP_STARTTLS` is on (a server
    that does not offer it gets nothing), then AUTH when `GPUFLEET_SMTP_USER` is set. `context`: the TLS
    settings, the system's trust store (or `SSL_CERT_FILE`) with host-name checks unless given."""
    if not settings.smtp_host:
        return _failed("GPUFLEET_SMTP_HOST is not set: no email can be sent", retryable=False)
    server = f"{settings.smtp_host}:{settings.smtp_port}"
    msg = email_message(settings, to, message_id, payload)
    try:
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout_s) as smtp:
            smtp.ehlo()
            if settings.smtp_starttls == "on":
                if not smtp.has_extn("starttls"):
                    return _failed(
                        f"{server} does not offer STARTTLS; nothing is sent in clear while GPUFLEET_SMTP_STARTTLS=on"
                    )
                smtp.starttls(context=context or ssl.create_default_context())
                smtp.ehlo()
            if settings.smtp_user:
                smtp.login(settings.smtp_user, settings.smtp_password or "")
            smtp.send_message(msg, from_addr=settings.smtp_from, to_addrs=[to])
    except smtplib.SMTPAuthenticationError as exc:
        return _failed(
            f"{server} refused the login: {_smtp_answer(exc)} (check GPUFLEET_SMTP_USER and GPUFLEET_SMTP_PASSWORD)",
            retryable=False,
        )
    except smtplib.SMTPNotSupportedError as exc:
        return _failed(f"{server}: {exc} (probably a configuration error)", retryable=False)
    except smtplib.SMTPRecipientsRefused as exc:
        code, said = next(iter(exc.recipients.values()), (550, b""))
        return _smtp_failed(server, code, f"{code} {said.decode('utf-8', 'replace')}".strip()[:_EXCERPT])
    except smtplib.SMTPResponseException as exc:  # sender refused, data refused, any other answer
        return _smtp_failed(server, exc.smtp_code, _smtp_answer(exc))
    except ssl.SSLCertVerificationError as exc:
        return _failed(f"{server}: TLS certificate refused: {exc.verify_message}", retryable=False)
    except ssl.SSLError as exc:
        return _failed(f"{server}: TLS failed: {exc.reason or exc}")
    except TimeoutError:
        return _failed(f"{server}: timed out after {timeout_s:g} s")
    except (OSError, smtplib.SMTPException) as exc:
        return _failed(f"cannot reach {server}: {getattr(exc, 'strerror', None) or str(exc) or type(exc).__name__}")
    return DELIVERED


def send(
    settings: Settings,
    *,
    channel: str,
    target: str,
    secret: str | None,
    message_id: uuid.UUID,
    payload: Mapping[str, Any],
    timeout_s: float = TIMEOUT_S,
) -> SendResult:
    """Send one outbox message through its channel."""
    if channel == "slack":
        return send_slack(target, message_id=message_id, payload=payload, timeout_s=timeout_s)
    if channel == "webhook":
        return send_webhook(target, message_id=message_id, payload=payload, secret=secret, timeout_s=timeout_s)
    if channel == "email":
        return send_email(settings, to=target, message_id=message_id, payload=payload, timeout_s=timeout_s)
    return _failed(f"unknown channel {channel[:20]!r}", retryable=False)
