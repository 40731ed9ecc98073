"""Instance metadata (IMDSv2) for every simulated instance, from one HTTP server on 127.0.0.1.

Instance `i-...` answers under `/i-.../latest/...`, so an agent given `http://127.0.0.1:PORT/i-...` as its
metadata URL reads its identity and tags with its own IMDSv2 client, tokens included, as on EC2. With a signer,
each instance also serves its identity document and signature under `/latest/dynamic/instance-identity/`,
signed by the demo's own key (`app.demo.signer`).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from .signer import DEMO_ACCOUNT, IdentitySigner

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600


class MetadataServer:
    """IMDSv2 on an ephemeral 127.0.0.1 port for the instances in `instances`: instance id -> (meta-data paths
    and bodies, instance tags). With `signer`, each instance has a signed identity document of `account_id`."""

    def __init__(
        self,
        instances: Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]],
        *,
        signer: IdentitySigner | None = None,
        account_id: str = DEMO_ACCOUNT,
    ) -> None:
        self._instances = {k: (dict(meta), dict(tags)) for k, (meta, tags) in instances.items()}
        self._dynamic: dict[str, dict[str, str]] = {}
        if signer is not None:
            for instance_id, (meta, _tags) in self._instances.items():
                self._dynamic[instance_id] = signer.dynamic(
                    instance_id,
                    account_id=account_id,
                    region=meta.get("placement/region", "us-east-1"),
                    availability_zone=meta.get("placement/availability-zone", ""),
                    instance_type=meta.get("instance-type", ""),
                    image_id=meta.get("ami-id", ""),
                )
        self._tokens: dict[str, float] = {}
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.metadata = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="demo-imds", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def url_for(self, instance_id: str) -> str:
        """The metadata URL to give the agent of `instance_id`."""
        return f"{self.base_url}/{instance_id}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def answer(self, method: str, path: str, headers: Mapping[str, str]) -> tuple[int, str]:
        """(status, body) for one request; `headers` has lower-case names."""
        instance_id, _, rest = path.lstrip("/").partition("/")
        found = self._instances.get(instance_id)
        if found is None:
            return 404, ""
        if rest == "latest/api/token":
            return self._token(headers) if method == "PUT" else (405, "")
        if method != "GET":
            return 405, ""
        with self._lock:
            expires = self._tokens.get(headers.get(TOKEN_HEADER.lower(), ""))
        if expires is None or expires <= time.monotonic():
            return 401, ""
        if rest.startswith("latest/dynamic/"):
            value = self._dynamic.get(instance_id, {}).get(rest[len("latest/dynamic/") :])
            return (404, "") if value is None else (200, value)
        if not rest.startswith("latest/meta-data/"):
            return 404, ""
        item = rest[len("latest/meta-data/") :]
        meta, tags = found
        if item.rstrip("/") == "tags/instance":
            return 200, "\n".join(tags)
        tag = item.removeprefix("tags/instance/")
        value = tags.get(unquote(tag)) if tag != item else meta.get(item)
        return (404, "") if value is None else (200, value)

    def _token(self, headers: Mapping[str, str]) -> tuple[int, str]:
        try:
            ttl = int(headers.get(TTL_HEADER.lower(), ""))
        except ValueError:
            return 400, ""
        if not 1 <= ttl <= MAX_TTL_S:
            return 400, ""
        token = secrets.token_urlsafe(24)
        with self._lock:
            now = time.monotonic()
            # Every agent start asks for a token; expired ones go so the table stays small.
            self._tokens = {k: v for k, v in self._tokens.items() if v > now}
            self._tokens[token] = now + ttl
        return 200, token


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    metadata: MetadataServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._respond("GET")

    def do_PUT(self) -> None:
        self._respond("PUT")

    def _respond(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, body = self.server.metadata.answer(method, urlsplit(self.path).path, headers)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
