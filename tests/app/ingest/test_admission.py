"""Ingest admission over a real uvicorn server on loopback: credentials and headers are judged before the body is
read, and past a load limit the answer is an immediate 503 with Retry-After."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.auth import Caller
from app.errors import ApiError
from app.ingest.admission import Slots, TokenCache
from app.settings import Settings
from tests.agent.live_server import LiveServer
from tests.conftest import make_token
from tests.factories import batch, gpu

URL = "/api/v1/ingest"
MIB = 1024 * 1024


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any
    sent: int
    """Body bytes the client had sent when the answer arrived."""
    closed: bool = field(default=False)


def post_watching(
    port: int, headers: dict[str, str], body: bytes, *, declared: int | None = None, first_wait_s: float = 3.0
) -> Answer:
    """POST `body` in 64 KiB pieces, stopping as soon as an answer arrives. Before the first piece the client
    waits up to `first_wait_s` for an answer given on the headers alone, as a client sending `Expect:
    100-continue` does; a server that reads the body first gets all of it."""
    head = f"POST {URL} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode())
    sock.setblocking(False)
    sent = 0
    got = b""
    closed = False
    deadline = time.monotonic() + 30
    select.select([sock], [], [], first_wait_s)
    try:
        while time.monotonic() < deadline:
            want_write = [sock] if sent < len(body) and not got else []
            readable, writable, _ = select.select([sock], want_write, [], 0.5)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed = True
                    break
                got += data
                if _complete(got):
                    break
            elif writable:
                sent += sock.send(body[sent : sent + 65536])
        # A server that closes does so right after its answer.
        if not closed and select.select([sock], [], [], 1.0)[0]:
            try:
                closed = sock.recv(1) == b""
            except BlockingIOError:
                closed = False
            except ConnectionResetError:
                closed = True
    finally:
        sock.close()
    head_bytes, _, rest = got.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    answer_headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(status, answer_headers, json.loads(rest) if rest else None, sent, closed)


def _complete(got: bytes) -> bool:
    head, sep, rest = got.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return len(rest) >= int(value)
    return False


@pytest.fixture
def server(settings: Settings, engine: Engine) -> Iterator[LiveServer]:
    with LiveServer(settings) as live:
        yield live


def test_no_token_and_8_mib_body_is_401_before_the_body_is_read(server: LiveServer) -> None:
    body = b" " * (8 * MIB)
    got = post_watching(server.port, {"Content-Type": "application/json"}, body)
    assert got.status == 401, got
    assert got.body == {"error": "missing Authorization header (expected: Bearer <token>)", "detail": []}
    assert got.headers["www-authenticate"].startswith("Bearer")
    assert got.sent == 0
    assert got.headers["connection"] == "close" and got.closed


def test_unknown_token_is_401_before_the_body_is_read(server: LiveServer) -> None:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer gpf_nobody"}
    got = post_watching(server.port, headers, b" " * (8 * MIB))
    assert (got.status, got.body["error"], got.sent) == (401, "unknown token", 0)


def test_wrong_scope_is_403_before_the_body_is_read(server: LiveServer, sessions: sessionmaker[Session]) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {make_token(sessions, 'read')}"}
    got = post_watching(server.port, headers, b" " * (8 * MIB))
    assert got.status == 403, got
    assert got.body == {"error": "token scope 'read' does not allow 'ingest'", "detail": []}
    assert got.sent == 0


def test_bad_type_encoding_or_size_of_a_caller_is_refused_before_the_body(
    server: LiveServer, ingest_token: str
) -> None:
    auth = {"Authorization": f"Bearer {ingest_token}"}
    cases = [
        ({"Content-Type": "text/plain"}, None, 415),
        ({"Content-Type": "application/json", "Content-Encoding": "br"}, None, 415),
        ({"Content-Type": "application/json"}, 8 * MIB + 1, 413),
    ]
    for headers, declared, status in cases:
        got = post_watching(server.port, {**auth, **headers}, b" " * MIB, declared=declared)
        assert (got.status, got.sent) == (status, 0), (headers, got)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_no_token_with_another_content_type_is_401(client: TestClient, content_type: str) -> None:
    r = client.post(URL, content=b"x=1", headers={"Content-Type": content_type})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_a_good_batch_still_goes_through(server: LiveServer, ingest_token: str, engine: Engine) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ingest_token}"}
    got = post_watching(server.port, headers, json.dumps(batch([gpu(0)])).encode(), first_wait_s=0.2)
    assert got.status == 200 and got.body["status"] == "stored", got
    assert not got.closed


@dataclass
class Blocked:
    """`count` ingest requests held inside their store transactions by a table lock, so they keep their slots
    and their bodies (each padded with `pad` bytes of white space)."""

    port: int
    token: str
    engine: Engine
    count: int = 1
    pad: int = 0
    answers: list[Answer] = field(default_factory=list)

    def __enter__(self) -> Blocked:
        self._conn = self.engine.connect()
        self._tx = self._conn.begin()
        self._conn.execute(text("LOCK TABLE ingest_batches IN ACCESS EXCLUSIVE MODE"))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}

        def run(n: int) -> None:
            body = json.dumps(batch([gpu(0)], instance_id=f"i-0blocked{n:08x}")).encode() + b" " * self.pad
            self.answers.append(post_watching(self.port, headers, body, first_wait_s=0))

        self._threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(self.count)]
        for th in self._threads:
            th.start()
        with self.engine.connect() as conn:  # until every request waits for the lock
            deadline = time.monotonic() + 15
            while (
                conn.execute(
                    text("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'ingest_batches'::regclass")
                ).scalar_one()
                < self.count
            ):
                assert time.monotonic() < deadline, "the requests never reached the store"
                time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._tx.rollback()
        self._conn.close()
        for th in self._threads:
            th.join(timeout=30)


def _shed_count(server: LiveServer) -> float:
    return float(server._server.config.app.state.gpufleet.metrics.batches_rejected.labels("shed")._value.get())  # type: ignore[union-attr]


def test_no_free_store_slot_is_503_with_retry_after(settings: Settings, engine: Engine, ingest_token: str) -> None:
    tight = settings.model_copy(update={"ingest_max_storing": 1, "ingest_slot_wait_s": 0.2, "ingest_retry_after_s": 7})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ingest_token}"}
    with LiveServer(tight) as server:
        with Blocked(server.port, ingest_token, engine) as first:
            t = time.monotonic()
            got = post_watching(server.port, headers, json.dumps(batch([gpu(0)])).encode(), first_wait_s=0)
            took = time.monotonic() - t
        assert got.status == 503, got
        assert got.headers["retry-after"] == "7"
        assert got.body["error"].startswith("the server is busy") and got.body["detail"] == []
        assert took < 5.0
        assert [a.status for a in first.answers] == [200]
        assert _shed_count(server) == 1
        # The slot is free again.
        again = post_watching(server.port, headers, json.dumps(batch([gpu(0)])).encode(), first_wait_s=0)
        assert again.status == 200


def test_over_the_memory_budget_is_503_before_the_body(settings: Settings, engine: Engine, ingest_token: str) -> None:
    # A budget below the smallest the settings allow (model_copy does not check), to reach it with few bytes.
    tight = settings.model_copy(update={"max_body_bytes": 512 * 1024, "ingest_memory_budget_bytes": 1300 * 1024})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ingest_token}"}
    with LiveServer(tight) as server:
        # One request held in the store with 60 KiB of JSON: 60 KiB as received and 16 x 60 KiB parsed.
        with Blocked(server.port, ingest_token, engine, pad=60 * 1024 - 1200) as blocked:
            got = post_watching(server.port, headers, b" " * (300 * 1024))
            assert got.status == 503, got
            assert got.headers["retry-after"] == "5" and got.sent == 0 and got.closed
            assert "GPUFLEET_INGEST_MEMORY_BUDGET_BYTES" in got.body["error"]
            small = post_watching(server.port, headers, b" " * (10 * 1024), first_wait_s=0.2)
            assert small.status == 400, small  # within the budget: read, then refused as what it is
            big = post_watching(server.port, headers, b" " * (100 * 1024), first_wait_s=0.2)
            assert big.status == 503, big  # it fits as received, not once parsed
        assert [a.status for a in blocked.answers] == [200]
        assert _shed_count(server) == 2
        assert server._server.config.app.state.gpufleet.admission.memory.used == 0  # type: ignore[union-attr]


def test_budget_must_hold_the_largest_body() -> None:
    with pytest.raises(ValueError, match="at least 18 times"):
        Settings(max_body_bytes=16 * MIB)


# The parts on their own ------------------------------------------------------------------------------------------


def test_slots_wait_in_line_then_give_up() -> None:
    async def scenario() -> list[str]:
        slots = Slots(1)
        events: list[str] = []
        assert await slots.acquire(0)
        assert not await slots.acquire(0)  # full, and no wait allowed

        async def waiter(name: str, wait_s: float) -> None:
            if await slots.acquire(wait_s):
                events.append(f"{name} in")
                slots.release()
            else:
                events.append(f"{name} gave up")

        tasks = [asyncio.create_task(waiter("a", 5.0)), asyncio.create_task(waiter("b", 0.05))]
        await asyncio.sleep(0.2)
        slots.release()
        await asyncio.gather(*tasks)
        assert (slots.used, slots.waiting) == (0, 0)
        return events

    assert asyncio.run(scenario()) == ["b gave up", "a in"]


def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    async def scenario() -> int:
        slots = Slots(1)
        assert await slots.acquire(0)
        task = asyncio.create_task(slots.acquire(5.0))
        await asyncio.sleep(0.01)
        slots.release()  # handed to the waiter ...
        task.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await task
        return slots.used

    assert asyncio.run(scenario()) == 0


def test_token_cache_shares_one_lookup_and_keeps_refusals() -> None:
    calls: list[str] = []

    async def scenario() -> None:
        cache = TokenCache(ttl_s=60)

        async def good() -> Caller:
            calls.append("good")
            await asyncio.sleep(0.05)
            return Caller(token_id=1, name="fleet", scope="ingest")

        async def bad() -> Caller:
            calls.append("bad")
            raise ApiError(401, "unknown token")

        callers = await asyncio.gather(*(cache.caller("Bearer a", good) for _ in range(20)))
        assert {c.token_id for c in callers} == {1}
        for _ in range(3):
            with pytest.raises(ApiError, match="unknown token"):
                await cache.caller("Bearer b", bad)
        cache.forget("Bearer a")
        await cache.caller("Bearer a", good)

    asyncio.run(scenario())
    assert calls == ["good", "bad", "good"]
