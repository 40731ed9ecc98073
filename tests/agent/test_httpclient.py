"""The agent's HTTP client against a real socket server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from agent.httpclient import HttpError, request


@pytest.fixture
def answers_before_the_body() -> Iterator[int]:
    """A server that reads only the request head, answers 401 with `Connection: close`, and closes: as the
    ingest server does for a request without a valid token."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            body = b'{"error": "missing Authorization header", "detail": []}'
            conn.sendall(
                b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            conn.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    listener.close()
    thread.join(timeout=5)


def test_an_answer_given_before_the_body_is_read_is_returned_not_a_broken_pipe(answers_before_the_body: int) -> None:
    body = b"x" * (8 << 20)
    try:
        answer = request("POST", f"http://127.0.0.1:{answers_before_the_body}/api/v1/ingest", body=body, timeout_s=5)
    except HttpError as exc:
        pytest.fail(f"no answer: {exc}")
    assert answer.status == 401
    assert b"missing Authorization header" in answer.body
