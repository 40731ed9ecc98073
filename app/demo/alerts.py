"""The demo's alert rule, and the receiver that prints its messages when no `--webhook` is given.

The rule is an ordinary one (app/alerts/rules.py), kept in the demo's database and shown on /alerts: GPUs idle
for `IDLE_FOR` go to a signed webhook. With `--webhook URL` that is the given URL; without, a receiver of the demo's
own on 127.0.0.1 that checks each message's signature and prints it, so the messages travel the same path
(evaluation, outbox, signed POST) either way.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..alerts import rules
from ..alerts.channels import MESSAGE_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from ..alerts.rules import Route, Rule, Target
from ..alerts.tables import alert_incidents, alert_outbox

RULE_NAME = "demo: forgotten GPUs"
IDLE_FOR_HOURS = 4.0
"""Longer than the training fleet's idle nights on weekdays, far shorter than the forgotten g5's stretch."""
SECRET = "gpufleet-demo-webhook-secret"
"""The demo's webhook signing secret: printed at start, so a receiver of one's own can check signatures."""
MAX_BODY = 1 << 20


def demo_rule(url: str) -> Rule:
    return Rule(
        RULE_NAME,
        "gpu_idle",
        Route(Target("webhook", url, secret=SECRET)),
        for_hours=IDLE_FOR_HOURS,
        remind_s=24 * 3600,
    )


def install_rule(session: Session, url: str, *, now: datetime) -> Rule:
    """The demo's rule, pointing at `url`, made afresh (the caller commits). A demo started again tells its story
    again: the rule of the last run goes, with its incidents and the messages it had not sent (to a receiver that
    went with that run)."""
    old = rules.get_rule(session, RULE_NAME)
    if old is not None:
        incidents = select(alert_incidents.c.id).where(alert_incidents.c.rule_id == old.id).scalar_subquery()
        session.execute(
            delete(alert_outbox).where(alert_outbox.c.incident_id.in_(incidents), alert_outbox.c.sent_at.is_(None))
        )
        rules.delete_rule(session, RULE_NAME)
    return rules.create_rule(session, demo_rule(url), by="gpufleet demo", now=now)


def describe(body: dict[str, Any]) -> str:
    """One line for the log from a webhook message: its text, and its snooze link when it has one."""
    text = body.get("text")
    if not isinstance(text, str) or not text:
        return json.dumps(body, sort_keys=True)[:300]
    line = " ".join(text.split())
    snooze = body.get("snooze_url")
    return f"{line} (snooze: {snooze})" if isinstance(snooze, str) and snooze else line


class PrintingReceiver:
    """An HTTP server on 127.0.0.1 that takes the demo's signed webhook messages and hands each to `show`.

    A message whose signature does not check out is refused (401), so what the log shows is what a receiver
    that checks signatures, as docs/alerts.md shows, would accept. A message id seen before is answered 200 and
    not shown again: delivery is at least once, and receivers deduplicate by the id."""

    def __init__(self, show: Callable[[str], None]) -> None:
        seen: set[str] = set()
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self.send_error(413)
                    return
                body = self.rfile.read(length)
                stamp = self.headers.get(TIMESTAMP_HEADER, "")
                given = self.headers.get(SIGNATURE_HEADER, "")
                expected = sign(SECRET, int(stamp), body) if stamp.isdigit() else ""
                if not expected or not hmac.compare_digest(given, expected):
                    self.send_error(401, "bad signature")
                    return
                message = self.headers.get(MESSAGE_ID_HEADER, "")
                with lock:
                    new = message not in seen
                    seen.add(message)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if new:
                    try:
                        show(describe(json.loads(body)))
                    except ValueError:
                        show(body[:300].decode(errors="replace"))

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-alerts", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/alerts"

    def start(self) -> PrintingReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
