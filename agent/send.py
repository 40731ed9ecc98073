"""Delivery: spooled batches go to the server oldest first; a batch leaves the spool only once acknowledged.

Answers and what they mean for the batch:
- 200 (`stored` or `duplicate`): delivered; delete it.
- 400, 413, 422 and other 4xx: this batch is bad and will stay bad; log once, move it to `rejected/`.
- 401, 403: the token is wrong or lacks the ingest scope. Not the batch's fault: keep it, back off.
- 404, 408, 425, 429, 5xx, network errors, timeouts: the server is away or busy; keep it, back off.
Back-off is exponential with jitter (so a fleet that lost its server does not return in lockstep), capped
at `backoff_max_s`, and reset by the first success.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import __version__
from .httpclient import HttpError, request, tls_context
from .spool import Spool

log = logging.getLogger("gpufleet.agent.send")

Kind = Literal["stored", "duplicate", "rejected", "retry", "auth"]
_RETRY_4XX = frozenset({404, 408, 425, 429})


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    status: int | None
    message: str

    @property
    def delivered(self) -> bool:
        return self.kind in ("stored", "duplicate")


class Poster:
    """POSTs one gzip body to the ingest URL with the bearer token; classifies the answer."""

    def __init__(self, url: str, token: str | None, *, ca_bundle: Path | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        self.token = token
        self.timeout_s = timeout_s
        self._context = tls_context(str(ca_bundle) if ca_bundle else None) if url.startswith("https:") else None

    def post(self, body: bytes, *, gzipped: bool = True) -> Outcome:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"gpufleet-agent/{__version__}",
            "Accept": "application/json",
        }
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            answer = request(
                "POST", self.url, body=body, headers=headers, timeout_s=self.timeout_s, context=self._context
            )
        except HttpError as exc:
            return Outcome("retry", None, f"cannot reach {self.url}: {exc}")
        if 200 <= answer.status < 300:
            return self._success(answer.status, answer.body)
        return classify(answer.status, _error_text(answer.body))

    def _success(self, status: int, raw: bytes) -> Outcome:
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {}
        if isinstance(answer, dict) and answer.get("status") == "duplicate":
            return Outcome("duplicate", status, "already stored")
        return Outcome("stored", status, "stored")


def classify(status: int, message: str) -> Outcome:
    if status in (401, 403):
        return Outcome("auth", status, message)
    if status in _RETRY_4XX or status >= 500:
        return Outcome("retry", status, message)
    if 400 <= status < 500:
        return Outcome("rejected", status, message)
    return Outcome("retry", status, message)


def _error_text(raw: bytes) -> str:
    """The server's error document as one line: its summary and each field it blames."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:300]
    if isinstance(answer, dict):
        details = "; ".join(
            f"{d.get('field')}: {d.get('message')}" for d in answer.get("detail", []) if isinstance(d, dict)
        )
        return f"{answer.get('error', '')} {details}".strip()[:500]
    return str(answer)[:300]


class Sender:
    """Drains the spool in order. Meant to run on its own thread so collection never waits on the network."""

    def __init__(
        self,
        spool: Spool,
        poster: Poster,
        *,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 300.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.spool = spool
        self.poster = poster
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.rng = rng
        self.wake = threading.Event()
        self.failures = 0
        self.delivered = 0
        self.rejected = 0
        self.last_outcome: Outcome | None = None

    def backoff_s(self) -> float:
        """Delay before the next try after `failures` failures in a row: half fixed, half random."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, self.failures - 1))
        return float(ceiling / 2 + self.rng() * ceiling / 2)

    def send_pending(self, stop: threading.Event | None = None) -> bool:
        """Send until the spool is empty (True) or a try fails (False)."""
        while stop is None or not stop.is_set():
            batch = self.spool.oldest()
            if batch is None:
                return True
            body = self.spool.read(batch)
            if body is None:
                continue
            outcome = self.poster.post(body)
            self.last_outcome = outcome
            if outcome.delivered:
                self.spool.remove(batch)
                self.delivered += 1
                if self.failures:
                    log.info("server reachable again after %d failed tries", self.failures)
                self.failures = 0
            elif outcome.kind == "rejected":
                target = self.spool.reject(batch, f"HTTP {outcome.status}: {outcome.message}")
                self.rejected += 1
                log.error(
                    "server refused batch %s (HTTP %s: %s); moved to %s",
                    batch.path.name,
                    outcome.status,
                    outcome.message,
                    target,
                )
            else:
                self.failures += 1
                level = logging.WARNING if self.failures == 1 or self.failures % 20 == 0 else logging.DEBUG
                what = "token refused" if outcome.kind == "auth" else "delivery failed"
                log.log(
                    level,
                    "%s (try %d): %s%s; %d batches wait in the spool",
                    what,
                    self.failures,
                    f"HTTP {outcome.status} " if outcome.status else "",
                    outcome.message,
                    len(self.spool.pending()),
                )
                return False
        return False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            # Cleared before sending, so a batch sealed while this pass runs wakes the next one at once.
            self.wake.clear()
            if self.send_pending(stop):
                self.wake.wait(5.0)
            else:
                deadline = time.monotonic() + self.backoff_s()
                # New batches do not cut the back-off short; only stopping does.
                while not stop.is_set() and time.monotonic() < deadline:
                    stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))
