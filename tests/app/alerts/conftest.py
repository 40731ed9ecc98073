"""Fixtures of the alert tests: the receivers of tests/app/alerts/receivers.py, started per test."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.app.alerts.receivers import HttpReceiver, Inbox, SmtpServer, start_smtp


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def smtp_tls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SmtpServer]:
    """STARTTLS required, then AUTH required. `request.param` (indirect), when given: the one mechanism offered."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    ca_file = tmp_path / "smtp-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    inbox = Inbox()
    only = getattr(request, "param", None)
    excluded = [m for m in ("LOGIN", "PLAIN") if only and m != only]
    server = SmtpServer("127.0.0.1", 0, ca_file, client_context, inbox, only)

    def authenticate(_srv: SMTP, _session: Session, _env: Envelope, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == (
            server.user,
            server.password,
        )
        if ok:
            inbox.logins.append((mechanism, server.user))
        return AuthResult(success=ok, handled=False, auth_data=(server.user, mechanism) if ok else None)

    controller, server.port = start_smtp(
        inbox,
        tls_context=server_context,
        require_starttls=True,
        auth_required=True,
        auth_require_tls=True,
        auth_exclude_mechanism=excluded,
        authenticator=authenticate,
    )
    try:
        yield server
    finally:
        controller.stop()


@pytest.fixture
def smtp_plain() -> Iterator[tuple[int, Inbox]]:
    """A server that offers neither STARTTLS nor AUTH."""
    inbox = Inbox()
    controller, port = start_smtp(inbox)
    try:
        yield port, inbox
    finally:
        controller.stop()
