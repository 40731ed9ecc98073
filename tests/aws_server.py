"""A local AWS API server for tests: moto's server mode, on a free loopback port, reached through the real boto3
client. `aws` (a pytest fixture) starts one per test session and points the standard AWS environment at it
(`AWS_ENDPOINT_URL`, fake credentials, a region); each test gets a fresh state."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class AwsServer:
    endpoint_url: str
    region: str = REGION

    def reset(self) -> None:
        """Forget every resource made so far (moto's reset API)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()


@pytest.fixture(scope="session")
def aws_server() -> Iterator[AwsServer]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield AwsServer(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def aws(aws_server: AwsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsServer]:
    """The local AWS API server, fresh, with the environment boto3 reads pointed at it."""
    aws_server.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", aws_server.region)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    yield aws_server
