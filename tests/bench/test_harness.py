"""bench/harness.py: percentiles, timed GETs over one connection, reading the server log."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.harness import Client, percentile, server_log_problems, time_get


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept-alive connections, as the server under test answers

    def do_GET(self) -> None:
        wants_json = self.headers.get("Accept") == "application/json"
        body = b'{"ok": true}' if wants_json else b"<html>" + self.headers.get("Authorization", "").encode()
        self.send_response(200 if self.path == "/" else 404)
        self.send_header("Content-Type", "application/json" if wants_json else "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.95) == 95.0
    assert percentile(values, 0.5) == 50.0
    assert percentile([7.0], 0.95) == 7.0
    assert math.isnan(percentile([], 0.95))


def test_time_get(port: int) -> None:
    client = Client(port, "secret")
    try:
        page = time_get(client, "/", runs=5, warmup=1)
        as_json = time_get(client, "/", {"Accept": "application/json"}, runs=5, warmup=0)
        missing = time_get(client, "/nothing", runs=2, warmup=0)
    finally:
        client.close()
    assert page.status == 200 and page.statuses == {200: 5}
    assert page.last_body == b"<html>Bearer secret"
    assert page.figures()["bytes"] == len(b"<html>Bearer secret")
    assert 0 < page.p50_ms <= page.p95_ms
    assert as_json.content_type == "application/json" and as_json.last_body == b'{"ok": true}'
    assert missing.status == 404
    assert set(page.figures()) == {"p50_ms", "p95_ms", "bytes", "status", "content_type"}


def test_server_log_problems(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO:     Started server process [1]\n"
        'INFO:     127.0.0.1:1 - "GET /mig HTTP/1.1" 200 OK\n'
        'INFO:     127.0.0.1:1 - "GET /heatmap HTTP/1.1" 404 Not Found\n'
        "ERROR:    Exception in ASGI application\n"
    )
    count, lines = server_log_problems(log)
    assert count == 2
    assert "404" in lines[0] and "ERROR" in lines[1]
    assert server_log_problems(tmp_path / "none.log") == (0, [])
