"""A stand-in ingest endpoint on 127.0.0.1 that answers what a test scripts, over real HTTP.

It stores every batch it answers 200 for (a repeated batch id is a `duplicate`), answers 500 for the batch
ids in `poison`, and before either it plays the answers queued in `script`: a status with headers, or a
stall longer than the client's timeout.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 0.0
    """Seconds to wait before answering (longer than the client's timeout: no answer at all)."""
    error: str = ""
    """The `error` of the answer's body; by default `scripted answer <status>`."""


@dataclass(frozen=True)
class Post:
    batch_id: str | None
    at: float
    """time.monotonic() when the request arrived."""
    status: int


class Receiver:
    def __init__(self) -> None:
        self.poison: set[str] = set()
        self.poison_first = False
        """Add the first batch id posted to `poison`."""
        self.script: list[Answer] = []
        self.posts: list[Post] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._answer(self, raw)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/v1/ingest"

    def _answer(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        at = time.monotonic()
        try:
            body = gzip.decompress(raw) if handler.headers.get("Content-Encoding") == "gzip" else raw
            document = json.loads(body)
        except (OSError, ValueError):
            document = {}
        batch_id = document.get("batch_id") if isinstance(document, dict) else None
        with self._lock:
            if self.poison_first and not self.posts and batch_id:
                self.poison.add(batch_id)
            if self.script:
                answer = self.script.pop(0)
            elif batch_id in self.poison:
                answer = Answer(500)
            else:
                answer = Answer(200)
            self.posts.append(Post(batch_id, at, answer.status))
            reply: dict[str, Any]
            if answer.status == 200 and batch_id:
                reply = {"status": "duplicate" if batch_id in self.stored else "stored", "batch_id": batch_id}
                self.stored.setdefault(batch_id, document)
            else:
                reply = {"error": answer.error or f"scripted answer {answer.status}", "detail": []}
        if answer.stall_s:
            time.sleep(answer.stall_s)
        data = json.dumps(reply).encode()
        handler.send_response(answer.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in answer.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        with contextlib.suppress(OSError):  # the client may have given up waiting
            handler.wfile.write(data)

    def ids(self) -> list[str | None]:
        with self._lock:
            return [p.batch_id for p in self.posts]

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
