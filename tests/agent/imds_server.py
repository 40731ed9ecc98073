"""A local stand-in for the EC2 instance metadata service, speaking IMDSv2 on 127.0.0.1.

    with ImdsServer(tags={"team": "ml"}) as imds:
        client = ImdsClient(imds.url)
        imds.count("meta-data/instance-id")   # how often a path was requested

Tokens are enforced (PUT /latest/api/token first, 401 without a valid one); `expire_tokens()`,
`disable()` (403), `set_spot_action()`, `set_rebalance()` and `delay_s` (a slow server) drive the cases
the agent must handle. Unless told otherwise (`dynamic`, `signed=False`) it serves a signed instance identity
document under `/latest/dynamic/instance-identity/`, signed by `shared_signer()`, whose certificate a test server
trusts through GPUFLEET_IDENTITY_EXTRA_CERTS (AWS's own keys are not at hand).
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from app.demo.signer import IdentitySigner

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"

DEFAULT_METADATA: dict[str, str] = {
    "instance-id": "i-0abc1234def567890",
    "instance-type": "p4d.24xlarge",
    "ami-id": "ami-0123456789abcdef0",
    "placement/region": "us-east-1",
    "placement/availability-zone": "us-east-1a",
    "instance-life-cycle": "spot",
    "hostname": "ip-10-0-0-12.ec2.internal",
}


@lru_cache(maxsize=1)
def shared_signer() -> IdentitySigner:
    """One signing key for the whole test run: making an RSA key takes a noticeable fraction of a second."""
    return IdentitySigner(common_name="gpufleet tests instance identity")


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connections are refused at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class ImdsServer:
    """IMDSv2 on an ephemeral 127.0.0.1 port. `metadata` maps meta-data paths to bodies (defaults above);
    `tags` None makes `tags/instance` a 404, as on instances without metadata tags. `delay_s` sleeps
    before every answer, in seconds."""

    def __init__(
        self,
        metadata: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        *,
        dynamic: Mapping[str, str] | None = None,
        signed: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        self.metadata: dict[str, str] = dict(DEFAULT_METADATA if metadata is None else metadata)
        self.tags: dict[str, str] | None = None if tags is None else dict(tags)
        if dynamic is None and signed and "instance-id" in self.metadata:
            dynamic = shared_signer().dynamic(
                self.metadata["instance-id"], region=self.metadata.get("placement/region", "us-east-1")
            )
        self.dynamic: dict[str, str] = dict(dynamic or {})
        self.delay_s = delay_s
        self.disabled = False
        self.requests: Counter[str] = Counter()
        self._spot_action: str | None = None
        self._rebalance: str | None = None
        self._tokens: dict[str, float] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.imds = self
        # A short poll interval keeps shutdown (and so every test using the server) quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="imds-server", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ImdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()  # wakes handlers sleeping in delay_s
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def expire_tokens(self) -> None:
        """Every token issued so far becomes invalid: the next GET with it gets 401."""
        with self._lock:
            self._tokens.clear()

    def disable(self) -> None:
        """403 on everything, as when the instance's metadata access is turned off."""
        self.disabled = True

    def enable(self) -> None:
        self.disabled = False

    def set_spot_action(self, action: Mapping[str, Any] | None) -> None:
        """The `spot/instance-action` notice (None: 404 again)."""
        self._spot_action = None if action is None else json.dumps(dict(action))

    def set_rebalance(self, notice: Mapping[str, Any] | None) -> None:
        """The `events/recommendations/rebalance` notice (None: 404 again)."""
        self._rebalance = None if notice is None else json.dumps(dict(notice))

    def count(self, path: str, method: str = "GET") -> int:
        """Requests for `path`: "meta-data/instance-id", "api/token", or a full "/latest/..." path."""
        full = path if path.startswith("/") else "/latest/" + path
        return self.requests[f"{method} {full}"]

    @property
    def token_puts(self) -> int:
        return self.count("api/token", "PUT")

    def total(self, method: str = "GET") -> int:
        return sum(n for key, n in self.requests.items() if key.startswith(method + " "))

    # Request handling, called from the server's threads.

    def _answer(self, method: str, path: str, headers: Mapping[str, str]) -> tuple[int, str]:
        """(status, body) for one request; `headers` has lower-case names."""
        with self._lock:
            self.requests[f"{method} {path}"] += 1
        if self.delay_s and self._closing.wait(self.delay_s):
            return 503, ""
        if self.disabled:
            return 403, ""
        if path == "/latest/api/token":
            return self._put_token(headers) if method == "PUT" else (405, "")
        if method != "GET":
            return 405, ""
        token = headers.get(TOKEN_HEADER.lower())
        with self._lock:
            expires = self._tokens.get(token or "")
        if expires is None or expires <= time.monotonic():
            return 401, ""
        body = self._lookup(path)
        return (404, "") if body is None else (200, body)

    def _put_token(self, headers: Mapping[str, str]) -> tuple[int, str]:
        try:
            ttl = int(headers.get(TTL_HEADER.lower(), ""))
        except ValueError:
            return 400, ""
        if not 1 <= ttl <= 21600:
            return 400, ""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return 200, token

    def _lookup(self, path: str) -> str | None:
        if path.startswith("/latest/dynamic/"):
            return self.dynamic.get(path[len("/latest/dynamic/") :])
        if not path.startswith("/latest/meta-data/"):
            return None
        item = path[len("/latest/meta-data/") :]
        if item == "spot/instance-action":
            return self._spot_action
        if item == "events/recommendations/rebalance":
            return self._rebalance
        if item.rstrip("/") == "tags/instance":
            return None if self.tags is None else "\n".join(self.tags)
        if item.startswith("tags/instance/"):
            return None if self.tags is None else self.tags.get(unquote(item[len("tags/instance/") :]))
        return self.metadata.get(item)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    imds: ImdsServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out leaves a broken pipe behind; that is the point of the slow mode.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._respond("GET")

    def do_PUT(self) -> None:
        self._respond("PUT")

    def do_POST(self) -> None:
        self._respond("POST")

    def _respond(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = urlsplit(self.path).path
        status, body = self.server.imds._answer(method, path, {k.lower(): v for k, v in self.headers.items()})
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
