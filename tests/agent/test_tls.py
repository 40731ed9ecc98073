"""TLS to the server: verified by default, and a private CA is trusted only when configured."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from agent.send import Poster


class _Ingest(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"status": "stored", "batch_id": "x", "samples": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/api/v1/ingest", ca_file
    finally:
        server.shutdown()
        server.server_close()


def test_an_unknown_certificate_is_refused(https_server: tuple[str, Path]) -> None:
    url, _ca = https_server
    outcome = Poster(url, "gpf_x", timeout_s=5).post(b"{}")
    assert outcome.kind == "retry"
    assert "certificate verify failed" in outcome.message.lower() or "tls" in outcome.message.lower()


def test_the_configured_ca_bundle_is_trusted(https_server: tuple[str, Path]) -> None:
    url, ca = https_server
    assert Poster(url, "gpf_x", ca_bundle=ca, timeout_s=5).post(b"{}").kind == "stored"
