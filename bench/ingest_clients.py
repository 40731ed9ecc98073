"""The ingest benchmark's load clients: each simulated agent sends its batches one after another and waits for each
answer, from one asyncio loop over raw streams or from a thread per agent with http.client. A 503 is answered as
an agent does: the same batch again after its Retry-After.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from dataclasses import dataclass, field

import orjson

from bench.batches import INGEST_PATH, BodySource, read_response, spec_devices
from bench.harness import log, tree_cpu


@dataclass
class AgentStats:
    expected_samples: int
    latencies: list[float] = field(default_factory=list)
    batches: int = 0
    samples: int = 0
    errors: int = 0
    shed: int = 0
    """503 answers with Retry-After; the batch was sent again after it."""
    messages: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.errors += 1
        if len(self.messages) < 3:
            self.messages.append(message)

    def record(self, seconds: float, status: int, data: bytes) -> None:
        self.latencies.append(seconds)
        if status != 200:
            self.fail(f"HTTP {status}: {data[:300]!r}")
            return
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.fail(f"answer is not JSON: {data[:300]!r}")
            return
        stored = answer.get("samples", 0) if isinstance(answer, dict) else 0
        if not isinstance(answer, dict) or answer.get("status") != "stored":
            self.fail(f"not stored: {data[:300]!r}")
        elif stored != self.expected_samples:
            self.fail(f"stored {stored} samples, sent {self.expected_samples}")
        if isinstance(stored, int):
            self.samples += stored
        self.batches += 1


def _thread_agent(
    port: int, token: str, source: BodySource, deadline: float, budget: int, stop: threading.Event, stats: AgentStats
) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {token}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        for _ in range(budget):
            if stop.is_set() or time.perf_counter() >= deadline:
                break
            body = source.next()
            if body is None:
                break
            t = time.perf_counter()
            try:
                conn.request("POST", INGEST_PATH, body, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                stats.fail(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            stats.record(time.perf_counter() - t, response.status, data)
    finally:
        conn.close()


async def _async_agent(
    port: int, token: str, source: BodySource, deadline: float, budget: int, stop: threading.Event, stats: AgentStats
) -> None:
    head = (
        f"POST {INGEST_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nAuthorization: Bearer {token}\r\nContent-Length: "
    ).encode()
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    try:
        for _ in range(budget):
            if stop.is_set() or time.perf_counter() >= deadline:
                break
            body = source.next()
            if body is None:
                break
            retry_after: float | None = 0.0
            while retry_after is not None:
                t = time.perf_counter()
                try:
                    if conn is None:
                        conn = await asyncio.open_connection("127.0.0.1", port)
                    reader, writer = conn
                    writer.writelines((head, str(len(body)).encode(), b"\r\n\r\n", body))
                    await writer.drain()
                    status, data, keep, retry_after = await read_response(reader)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                    stats.fail(f"{type(exc).__name__}: {exc}")
                    if conn is not None:
                        conn[1].close()
                    conn = None
                    break
                if not keep:
                    writer.close()
                    conn = None
                if status == 503 and retry_after is not None:
                    stats.shed += 1  # as an agent does: the same batch again, once Retry-After has passed
                    if conn is not None:  # the server may close it while idle; the next try opens a new one
                        conn[1].close()
                        conn = None
                    await asyncio.sleep(retry_after)
                    continue
                retry_after = None
                stats.record(time.perf_counter() - t, status, data)
    finally:
        if conn is not None:
            conn[1].close()


def drive(
    client: str,
    port: int,
    token: str,
    sources: list[BodySource],
    stats: list[AgentStats],
    seconds: float,
    budget: int,
    report: bool,
) -> float:
    """Every agent sends its next batches, one at a time, until `seconds` pass or it has sent `budget`."""
    stop = threading.Event()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    threads: list[threading.Thread]
    if client == "threads":
        threads = [
            threading.Thread(target=_thread_agent, args=(port, token, src, deadline, budget, stop, st), daemon=True)
            for src, st in zip(sources, stats, strict=True)
        ]
    else:

        async def all_agents() -> None:
            await asyncio.gather(
                *(
                    _async_agent(port, token, src, deadline, budget, stop, st)
                    for src, st in zip(sources, stats, strict=True)
                )
            )

        threads = [threading.Thread(target=asyncio.run, args=(all_agents(),), daemon=True)]
    try:
        for th in threads:
            th.start()
        next_report = t0 + 5.0
        while any(th.is_alive() for th in threads):
            for th in threads:
                th.join(timeout=max(0.0, min(0.5, next_report - time.perf_counter())))
                if time.perf_counter() >= next_report:
                    break
            now = time.perf_counter()
            if now >= next_report:
                if report:
                    done = sum(s.samples for s in stats)
                    log(
                        f"load: {now - t0:5.1f} s, {sum(s.batches for s in stats)} batches, "
                        f"{done / (now - t0):,.0f} samples/s, {sum(s.errors for s in stats)} errors"
                    )
                next_report += 5.0
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=60)
    return time.perf_counter() - t0


@dataclass
class LoadResult:
    elapsed: float
    client_cpu_s: float
    server_cpu_s: float | None
    db_cpu_s: float | None
    stats: list[AgentStats]
    warmup: list[AgentStats]
    built_live: int
    exhausted: int


def run_load(
    client: str,
    port: int,
    token: str,
    sources: list[BodySource],
    seconds: float,
    warmup: int,
    server_pid: int,
    db_pid: int | None,
) -> LoadResult:
    samples_per_batch = [src.spec.intervals * spec_devices(src.spec) for src in sources]
    # An instance's first batch creates its inventory rows and each server connection its staging table:
    # one-time costs kept out of the steady-state figures.
    warm = [AgentStats(n) for n in samples_per_batch]
    if warmup:
        took = drive(client, port, token, sources, warm, 300.0, warmup, report=False)
        log(f"warm-up: {sum(s.batches for s in warm)} batches in {took:.1f} s, {sum(s.errors for s in warm)} errors")
    stats = [AgentStats(n) for n in samples_per_batch]
    server_cpu0 = tree_cpu(server_pid)
    db_cpu0 = tree_cpu(db_pid) if db_pid else None
    cpu0 = time.process_time()
    elapsed = drive(client, port, token, sources, stats, seconds, 2**62, report=True)
    client_cpu = time.process_time() - cpu0
    server_cpu1 = tree_cpu(server_pid)
    db_cpu1 = tree_cpu(db_pid) if db_pid else None
    return LoadResult(
        elapsed=elapsed,
        client_cpu_s=client_cpu,
        server_cpu_s=None if server_cpu0 is None or server_cpu1 is None else server_cpu1 - server_cpu0,
        db_cpu_s=None if db_cpu0 is None or db_cpu1 is None else db_cpu1 - db_cpu0,
        stats=stats,
        warmup=warm,
        built_live=sum(s.built_live for s in sources),
        exhausted=sum(1 for s in sources if s.next_n >= s.spec.limit),
    )
