"""Who gets in, and how much the ingest path takes on at once: the token checked from the headers before the body
is read, a memory budget for bodies and their parsed batches, and a bounded number of batches parsed and stored
at once.

Past a limit a request is refused at once (503 with `Retry-After`) rather than queued: an answer that comes later
than the agent's timeout makes it send again and adds to the load. The limits hold per worker process: they
live in its event loop. docs/ingest-protocol.md, "Limits and load shedding", describes them for operators.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from ..auth import Caller, authenticate
from ..db import session_scope
from ..errors import ApiError
from ..settings import Settings

LOOKUP_SLOTS = 2
"""Token lookups (cache misses) running at once: each takes a database connection for a moment."""
TOKEN_CACHE_ENTRIES = 4096
"""Most token lookups remembered; beyond it the oldest go first."""


class Shed(ApiError):
    """503: the server is at a limit; the client should send the same batch again after `Retry-After`."""


def shed(message: str, retry_after_s: int) -> Shed:
    return Shed(503, message, headers={"Retry-After": str(retry_after_s)})


def missing_credentials() -> ApiError:
    return ApiError(
        401,
        "missing Authorization header (expected: Bearer <token>)",
        headers={"WWW-Authenticate": 'Bearer realm="gpufleet"'},
    )


class Slots:
    """At most `size` holders at once. A newcomer waits in line a bounded time, then is told no.

    Used from one event loop only, so it needs no lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, wait_s: float) -> bool:
        """True once a slot is held; False when none came free within `wait_s` seconds."""
        if self.used < self.size and not self._waiters:
            self.used += 1
            return True
        if wait_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=wait_s)
        except BaseException:
            # Cancelled (the client went away): a slot handed over in the meantime goes to the next in line.
            self._forget(waiter)
            raise
        if waiter.done():
            return True  # `release` handed its slot over
        self._forget(waiter)
        return False

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release()
            return
        waiter.cancel()
        self._waiters.remove(waiter)

    def release(self) -> None:
        # The slot passes straight to the first in line, so a newcomer cannot overtake those waiting.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.used -= 1

    @asynccontextmanager
    async def hold(self, wait_s: float, refusal: Callable[[], ApiError]) -> AsyncIterator[None]:
        if not await self.acquire(wait_s):
            raise refusal()
        try:
            yield
        finally:
            self.release()


class ByteBudget:
    """Bytes held by the requests in progress, against a fixed budget. Taken from the event loop while the body
    arrives and from a worker thread when gzip is undone, hence the lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.size:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Hold:
    """What one request holds of a ByteBudget; `grow` refuses with 503 past the budget."""

    def __init__(self, budget: ByteBudget, retry_after_s: int) -> None:
        self.budget = budget
        self.retry_after_s = retry_after_s
        self.bytes = 0

    def grow(self, n: int) -> None:
        if n <= 0:
            return
        if not self.budget.take(n):
            raise shed(
                "the server holds as many ingest bodies as its memory budget allows "
                "(GPUFLEET_INGEST_MEMORY_BUDGET_BYTES): send again later",
                self.retry_after_s,
            )
        self.bytes += n

    def close(self) -> None:
        self.budget.give(self.bytes)
        self.bytes = 0

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass
class _Looked:
    """One token lookup: the caller, or the refusal (401, 403), until `expires` (time.monotonic())."""

    caller: Caller | None
    refusal: ApiError | None
    expires: float


class TokenCache:
    """Token lookups reused for `ttl_s` seconds, so a batch's credentials are known from its headers alone.

    Only the answer before the body is read comes from here: the transaction that stores a batch checks its
    token again, so a revoked token stores nothing from the moment it is revoked. Requests with the same token
    that miss together share one lookup."""

    def __init__(self, ttl_s: float, max_entries: int = TOKEN_CACHE_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, _Looked] = {}
        self._pending: dict[str, asyncio.Future[_Looked]] = {}

    @staticmethod
    def key(authorization: str) -> str:
        return hashlib.sha256(authorization.encode()).hexdigest()

    def forget(self, authorization: str) -> None:
        self._entries.pop(self.key(authorization), None)

    async def caller(self, authorization: str, lookup: Callable[[], Awaitable[Caller]]) -> Caller:
        """The caller behind `authorization`, or the 401/403 its lookup gave; `lookup` runs on a miss."""
        key = self.key(authorization)
        entry = self._entries.get(key)
        if entry is None or entry.expires <= time.monotonic():
            task = self._pending.get(key)
            if task is None:
                # A task of its own: a client that goes away must not cancel the lookup others wait for.
                task = asyncio.ensure_future(self._look_up(lookup))
                self._pending[key] = task
                task.add_done_callback(lambda done: self._settle(key, done))
            entry = await asyncio.shield(task)
        if entry.refusal is not None:
            refusal = entry.refusal
            raise ApiError(refusal.status_code, refusal.error, list(refusal.detail), dict(refusal.headers or {}))
        assert entry.caller is not None
        return entry.caller

    async def _look_up(self, lookup: Callable[[], Awaitable[Caller]]) -> _Looked:
        try:
            caller = await lookup()
        except ApiError as exc:
            if exc.status_code not in (401, 403):
                raise
            return _Looked(None, exc, time.monotonic() + self.ttl_s)
        return _Looked(caller, None, time.monotonic() + self.ttl_s)

    def _settle(self, key: str, done: asyncio.Future[_Looked]) -> None:
        del self._pending[key]
        if done.cancelled() or done.exception() is not None:
            return  # nothing to remember; reading the exception also keeps asyncio from reporting it
        self._remember(key, done.result())

    def _remember(self, key: str, entry: _Looked) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            now = time.monotonic()
            for k in [k for k, e in self._entries.items() if e.expires <= now]:
                del self._entries[k]
            while len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
        self._entries.pop(key, None)
        self._entries[key] = entry


class Admission:
    """The limits of one worker's ingest path, made from its settings."""

    def __init__(self, settings: Settings) -> None:
        self.retry_after_s = settings.ingest_retry_after_s
        self.wait_s = settings.ingest_slot_wait_s
        self.memory = ByteBudget(settings.ingest_memory_budget_bytes)
        self.storing = Slots(settings.ingest_store_slots)
        self.parsing = Slots(settings.ingest_max_parsing)
        self.lookups = Slots(LOOKUP_SLOTS)
        self.tokens = TokenCache(settings.ingest_token_cache_s)

    def busy(self, what: str, setting: str) -> Callable[[], Shed]:
        return lambda: shed(
            f"the server is busy: no {what} slot came free within {self.wait_s:g} s ({setting}): send again later",
            self.retry_after_s,
        )

    async def caller(self, sessions: sessionmaker[Session], authorization: str | None) -> Caller:
        """The ingest caller named by the `Authorization` header, from the cache or the database; ApiError 401
        or 403 otherwise (503 when lookups are at their limit). Reads no body."""
        if not authorization or not authorization.strip():
            raise missing_credentials()

        async def lookup() -> Caller:
            async with self.lookups.hold(self.wait_s, self.busy("token lookup", "GPUFLEET_INGEST_SLOT_WAIT_S")):
                return await run_in_threadpool(_look_up_token, sessions, authorization)

        return await self.tokens.caller(authorization, lookup)

    def hold(self) -> Hold:
        return Hold(self.memory, self.retry_after_s)


def _look_up_token(sessions: sessionmaker[Session], authorization: str) -> Caller:
    with session_scope(sessions) as session:
        return authenticate(session, authorization, needed="ingest", now=datetime.now(UTC))
