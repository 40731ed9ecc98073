"""Real receivers for the alert channels: an HTTP server (Slack and webhooks) that records every request and can
answer with faults, per path, and an SMTP server (aiosmtpd) with STARTTLS and AUTH LOGIN/PLAIN behind a
certificate of a CA made for the test."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_url(path: str = "/hook") -> str:
    """A URL nothing listens on: a receiver that is down."""
    return f"http://127.0.0.1:{free_port()}{path}"


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    """Names in lower case."""
    body: bytes
    status: int
    """What the receiver answered."""
    at: float
    """When it came in, time.monotonic()."""


@dataclass
class Fault:
    status: int = 500
    times: int = 1_000_000
    """Answer `status` to this many requests, then 200."""
    delay_s: float = 0.0
    """Wait this long before answering (past the sender's timeout: a slow receiver)."""
    retry_after: str | None = None
    gate: threading.Event | None = None
    """Hold every answer until this is set (at most 10 s)."""


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[Request] = field(default_factory=list)
    faults: dict[str, Fault] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        at = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        state = self.server.state
        with state.lock:
            fault = state.faults.get(self.path)
            status = 200
            if fault is not None and fault.times > 0:
                fault.times -= 1
                status = fault.status
            headers = {k.lower(): v for k, v in self.headers.items()}
            state.requests.append(Request(self.path, headers, body, status, at))
        if fault is not None and fault.gate is not None:
            fault.gate.wait(10)
        if fault is not None and fault.delay_s:
            time.sleep(fault.delay_s)
        answer = b"ok" if status == 200 else b"receiver says no"
        self.send_response(status)
        if fault is not None and fault.retry_after is not None and status != 200:
            self.send_header("Retry-After", fault.retry_after)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a slow answer may still sleep when the test ends
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a sender that timed out has hung up; the broken pipe is expected


class HttpReceiver:
    """Answers 200 to every POST unless a fault is set for its path."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def fault(self, path: str, **how: Any) -> Fault:
        fault = Fault(**how)
        with self._server.state.lock:
            self._server.state.faults[path] = fault
        return fault

    def requests(self, path: str | None = None) -> list[Request]:
        with self._server.state.lock:
            return [r for r in self._server.state.requests if path is None or r.path == path]

    def delivered_ids(self, path: str | None = None) -> list[str]:
        """The message ids of the requests answered 200, in arrival order."""
        return [r.headers.get("x-gpufleet-message-id", "") for r in self.requests(path) if r.status == 200]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class Mail:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    tls: bool
    login: str | None
    mechanism: str | None


class Inbox:
    def __init__(self) -> None:
        self.mails: list[Mail] = []
        self.logins: list[tuple[str, str]] = []  # (mechanism, login) of every AUTH accepted

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = message_from_bytes(raw, policy=policy.default)
        auth = session.auth_data if isinstance(session.auth_data, tuple) else (None, None)
        self.mails.append(
            Mail(envelope.mail_from or "", list(envelope.rcpt_tos), message, session.ssl is not None, *auth)
        )
        return "250 OK"


@dataclass
class SmtpServer:
    host: str
    port: int
    ca_file: Path
    client_context: ssl.SSLContext
    inbox: Inbox
    only: str | None = None
    """The one AUTH mechanism offered; None: LOGIN and PLAIN."""
    user: str = "alerts"
    password: str = "s3cret-pw"


def start_smtp(inbox: Inbox, **kwargs: Any) -> tuple[Controller, int]:
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    return controller, port
