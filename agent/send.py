"""Delivery: spooled batches go to the server oldest first; a batch leaves the spool only once acknowledged.

Answers and what they mean for the batch:
- 200 (`stored` or `duplicate`): delivered; delete it.
- 400, 413, 422 and other 4xx: this batch is bad and will stay bad; log once, move it to `rejected/`.
- 401, 403: the token is wrong or lacks the ingest scope. Not the batch's fault: keep it, back off.
- 404, 408, 425, 429, 502, 503, 504, network errors, timeouts: the server is away or busy; keep it, back off.
- 500 and the other 5xx: maybe the server chokes on this batch. Keep it and back off; after
  `set_aside_after` such answers in a row the batch is set aside (`spool/aside/`) so the newer ones can go,
  tried again every `aside_retry_s`, and reported in an agent event (`batch_set_aside`).
Back-off is exponential with jitter (so a fleet that lost its server does not return in lockstep), capped
at `backoff_max_s`, and reset by the first success. An answer with `Retry-After` replaces it: the sender
waits that long plus jitter, at most `RETRY_AFTER_MAX_S`.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from . import __version__
from .httpclient import HttpError, parse_retry_after, request, tls_context
from .spool import Spool, SpooledBatch

log = logging.getLogger("gpufleet.agent.send")

Kind = Literal["stored", "duplicate", "rejected", "retry", "auth"]
_RETRY_4XX = frozenset({404, 408, 425, 429})
_SERVER_AWAY = frozenset({502, 503, 504})  # a proxy without its server, or a server shedding load

SET_ASIDE_AFTER = 5  # answers in a row that may blame the batch before it stops holding up the queue
ASIDE_RETRY_S = 3600.0  # how often a set-aside batch is tried again
RETRY_AFTER_MAX_S = 900.0  # the longest wait a Retry-After header can impose, jitter included


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    status: int | None
    message: str
    retry_after_s: float | None = None
    """The server's `Retry-After`, in seconds from the answer, as sent (not yet capped)."""

    @property
    def delivered(self) -> bool:
        return self.kind in ("stored", "duplicate")

    @property
    def may_blame_batch(self) -> bool:
        """An answer the batch itself may have caused: a server error other than "away" or "busy"."""
        return (
            self.kind == "retry" and self.status is not None and self.status >= 500 and self.status not in _SERVER_AWAY
        )


class Poster:
    """POSTs one gzip body to the ingest URL with the bearer token; classifies the answer."""

    identity: Callable[[], str | None] | None = None
    """Gives the instance's signed identity for the X-Gpufleet-Instance-Identity header, or None (off EC2)."""

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
        # The signed EC2 identity (agent/identify/signed.py) authenticates on its own where the server accepts it.
        signed = self.identity() if self.identity is not None else None
        if signed:
            headers["X-Gpufleet-Instance-Identity"] = signed
        try:
            answer = request(
                "POST", self.url, body=body, headers=headers, timeout_s=self.timeout_s, context=self._context
            )
        except HttpError as exc:
            return Outcome("retry", None, f"cannot reach {self.url}: {exc}")
        if 200 <= answer.status < 300:
            return self._success(answer.status, answer.body)
        outcome = classify(answer.status, _error_text(answer.body))
        wait = parse_retry_after(answer.headers.get("retry-after"), time.time())
        return Outcome(outcome.kind, outcome.status, outcome.message, wait) if wait is not None else outcome

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
        set_aside_after: int = SET_ASIDE_AFTER,
        aside_retry_s: float = ASIDE_RETRY_S,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self.poster = poster
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.set_aside_after = set_aside_after
        self.aside_retry_s = aside_retry_s
        self.rng = rng
        self.clock = clock
        self.wake = threading.Event()
        self.failures = 0
        self.delivered = 0
        self.rejected = 0
        self.set_aside = 0
        """Batches set aside by this run."""
        self.retry_after_s: float | None = None
        """What the last failed answer asked for in `Retry-After`; None when it did not."""
        self.last_outcome: Outcome | None = None
        self._blamed: tuple[int, int] = (0, 0)  # (seq of the oldest batch, answers in a row that may blame it)
        # Set-aside batches found at start are first tried one retry period later, like newly set-aside ones.
        self._aside_due: dict[int, float] = {b.seq: clock() + aside_retry_s for b in spool.aside()}

    def backoff_s(self) -> float:
        """Delay, in seconds, before the next try. After an answer with `Retry-After`: what it asked for plus up
        to a quarter more (at least up to 1 s more), at most `RETRY_AFTER_MAX_S` in all. Otherwise after
        `failures` failures in a row: half fixed, half random, doubling up to `backoff_max_s`."""
        if self.retry_after_s is not None:
            asked = min(self.retry_after_s, RETRY_AFTER_MAX_S)
            return float(min(RETRY_AFTER_MAX_S, asked + self.rng() * max(1.0, asked / 4)))
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, self.failures - 1))
        return float(ceiling / 2 + self.rng() * ceiling / 2)

    def send_pending(self, stop: threading.Event | None = None) -> bool:
        """Send until the queue is empty (True) or a try fails (False). Set-aside batches whose retry is due go
        first, one try each."""
        while stop is None or not stop.is_set():
            due = self._due_aside()
            if due is not None:
                if not self._retry_aside(due):
                    return False
                continue
            batch = self.spool.oldest()
            if batch is None:
                return True
            body = self.spool.read(batch)
            if body is None:
                continue
            outcome = self._post(body)
            if outcome.delivered:
                self.spool.remove(batch)
                self._delivered()
                self._blamed = (0, 0)
            elif outcome.kind == "rejected":
                self._reject(batch, outcome)
            elif outcome.may_blame_batch and self._blame(batch) >= self.set_aside_after:
                self._failed(outcome)
                self._set_aside(batch, body, outcome)
            else:
                self._failed(outcome)
                return False
        return False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            # Cleared before sending, so a batch sealed while this pass runs wakes the next one at once.
            self.wake.clear()
            if self.send_pending(stop):
                self.wake.wait(5.0)
            else:
                deadline = self.clock() + self.backoff_s()
                # New batches do not cut the back-off short; only stopping does.
                while not stop.is_set() and self.clock() < deadline:
                    stop.wait(min(1.0, max(0.0, deadline - self.clock())))

    # -- one answer at a time ---------------------------------------------------------------------------

    def _post(self, body: bytes) -> Outcome:
        outcome = self.poster.post(body)
        self.last_outcome = outcome
        return outcome

    def _delivered(self) -> None:
        self.delivered += 1
        if self.failures:
            log.info("server reachable again after %d failed tries", self.failures)
        self.failures = 0
        self.retry_after_s = None

    def _reject(self, batch: SpooledBatch, outcome: Outcome) -> None:
        target = self.spool.reject(batch, f"HTTP {outcome.status}: {outcome.message}")
        self._aside_due.pop(batch.seq, None)
        self.rejected += 1
        log.error(
            "server refused batch %s (HTTP %s: %s); moved to %s",
            batch.path.name,
            outcome.status,
            outcome.message,
            target,
        )

    def _failed(self, outcome: Outcome) -> None:
        self.failures += 1
        self.retry_after_s = outcome.retry_after_s
        level = logging.WARNING if self.failures == 1 or self.failures % 20 == 0 else logging.DEBUG
        what = "token refused" if outcome.kind == "auth" else "delivery failed"
        log.log(
            level,
            "%s (try %d): %s%s%s; %d batches wait in the spool",
            what,
            self.failures,
            f"HTTP {outcome.status} " if outcome.status else "",
            outcome.message,
            f"; the server asks to wait {outcome.retry_after_s:g} s" if outcome.retry_after_s is not None else "",
            len(self.spool.pending()),
        )

    # -- batches the server keeps failing on --------------------------------------------------------------

    def _blame(self, batch: SpooledBatch) -> int:
        """Count one more answer that may blame the oldest batch; answers that say the server is away or busy
        (and the token's refusals) leave the count alone."""
        seq, count = self._blamed
        self._blamed = (batch.seq, count + 1 if seq == batch.seq else 1)
        return self._blamed[1]

    def _set_aside(self, batch: SpooledBatch, body: bytes, outcome: Outcome) -> None:
        tries = self._blamed[1]
        self._blamed = (0, 0)
        moved = self.spool.set_aside(batch)
        if moved is None:
            return
        self.set_aside += 1
        self._aside_due[moved.seq] = self.clock() + self.aside_retry_s
        details: dict[str, Any] = {
            "batch_id": _batch_id(body),
            "sealed_at": _iso(batch.created_ms / 1000),
            "tries": tries,
            "status": outcome.status,
            "error": outcome.message[:200],
            "set_aside_now": len(self.spool.aside()),
        }
        self._note("batch_set_aside", details)
        log.warning(
            "batch %s (%s) set aside after %d tries answered HTTP %s: %s; newer batches go first, and it is tried "
            "again every %g s until the spool's age bound drops it",
            details["batch_id"],
            moved.path.name,
            tries,
            outcome.status,
            outcome.message,
            self.aside_retry_s,
        )

    def _due_aside(self) -> SpooledBatch | None:
        now = self.clock()
        aside = self.spool.aside()
        if len(self._aside_due) > len(aside):  # some left by the bounds
            self._aside_due = {b.seq: due for b in aside if (due := self._aside_due.get(b.seq)) is not None}
        for batch in aside:
            if self._aside_due.setdefault(batch.seq, now + self.aside_retry_s) <= now:
                return batch
        return None

    def _retry_aside(self, batch: SpooledBatch) -> bool:
        """One try of a set-aside batch; False when the answer says to back off (server away, busy, token)."""
        body = self.spool.read(batch)
        if body is None:
            self._aside_due.pop(batch.seq, None)
            return True
        outcome = self._post(body)
        if outcome.delivered:
            self.spool.remove(batch)
            self._aside_due.pop(batch.seq, None)
            self._delivered()
            now = self.clock()
            # The server took one it had been failing on: it may take the others now too.
            for other in self._aside_due:
                self._aside_due[other] = now
            self._note(
                "batch_set_aside_delivered", {"batch_id": _batch_id(body), "sealed_at": _iso(batch.created_ms / 1000)}
            )
            log.info("set-aside batch %s delivered", batch.path.name)
            return True
        if outcome.kind == "rejected":
            self._reject(batch, outcome)
            return True
        if outcome.may_blame_batch:
            self._aside_due[batch.seq] = self.clock() + self.aside_retry_s
            log.info("set-aside batch %s failed again: HTTP %s %s", batch.path.name, outcome.status, outcome.message)
            return True
        self._failed(outcome)
        return False

    def _note(self, kind: str, details: dict[str, Any]) -> None:
        """An agent event for the next batch sealed (the collecting thread journals it)."""
        try:
            self.spool.add_event({"ts": _iso(time.time()), "kind": kind, "details": details})
        except OSError as exc:
            log.error("cannot write to the spool at %s: %s (event %s lost)", self.spool.dir, exc, kind)


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _batch_id(body: bytes) -> str | None:
    """The batch id inside a spooled body, for the reports about it; None when it cannot be read."""
    try:
        document = json.loads(gzip.decompress(body))
    except (OSError, ValueError, EOFError):
        return None
    batch_id = document.get("batch_id") if isinstance(document, dict) else None
    return batch_id if isinstance(batch_id, str) else None
