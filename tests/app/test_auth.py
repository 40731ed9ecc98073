"""The peer address behind a request, as the access rule sees it."""

from __future__ import annotations

from ipaddress import ip_address

import pytest
from starlette.requests import Request

from app.auth import is_loopback, peer_address, requires


def _request(host: str | None) -> Request:
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    if host is not None:
        scope["client"] = (host, 1234)
    return Request(scope)


@pytest.mark.parametrize(
    ("host", "peer", "loopback"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "127.0.0.1", True),  # a dual-stack socket's view of an IPv4 client
        ("::ffff:10.0.0.9", "10.0.0.9", False),
        ("10.0.0.9", "10.0.0.9", False),
        ("testclient", None, False),
        (None, None, False),
    ],
)
def test_peer_address(host: str | None, peer: str | None, loopback: bool) -> None:
    request = _request(host)
    assert peer_address(request) == (ip_address(peer) if peer else None)
    assert is_loopback(request) is loopback


def test_requires() -> None:
    assert requires(None) == {"security": []}
    assert requires("ingest") == {"security": [{"bearerToken": ["ingest"]}]}
    assert requires("read") == {"security": [{"bearerToken": ["read"]}, {"sessionCookie": []}]}
    with pytest.raises(ValueError):
        requires("write")
