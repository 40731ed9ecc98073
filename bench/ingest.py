"""Ingest benchmark: simulated agents POST gzipped batches to a real `gpufleet serve`; a plain COPY of the same
number of rows into `samples` is the physical reference.

    .venv/bin/python bench/ingest.py [--seconds 30] [--agents 32] [--intervals 6] [--database-url URL] [--workers 2]
    .venv/bin/python bench/ingest.py --realistic [--agents 64]

`--realistic` sends what agents at their defaults send (bench/instances.py: 8 GPUs, some in MIG mode, the agent's
intervals per batch) and reports how many such instances the server keeps up with (`instances_sustained`).
A 503 is answered as an agent does: the same batch again after its Retry-After.

Progress goes to stderr; the last line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import http.client
import json
import math
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import psycopg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INGEST_PATH = "/api/v1/ingest"
INTERVAL_S = 10.0
PLAIN_GPUS = 4
MIG_GPUS = 4
SLICES_PER_GPU = 7
DEVICES = PLAIN_GPUS + MIG_GPUS * (1 + SLICES_PER_GPU)
GPU_NAME = "NVIDIA A100-SXM4-40GB"
GPU_MEM_MIB = 40960
SLICE_MEM_MIB = 4864
MIG_REASON = "A100 MIG: NVML gives no utilization for MIG devices or their parent GPU"
# The server refuses intervals more than 300 s ahead of its clock; stay well inside that.
FUTURE_MARGIN_S = 240.0
QUERY_RUNS = 5


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------------------------------------------
# Simulated agents


@dataclass(frozen=True)
class AgentSpec:
    """One p4d.24xlarge-like instance: 4 plain A100s and 4 in MIG mode with 7 1g.5gb slices each."""

    index: int
    seed: int
    start: float  # epoch seconds of its first interval
    intervals: int
    limit: int  # batches it may send before its clock would pass the server's future-skew bound
    static: dict[str, Any]  # agent, instance and gpus: the same in every batch
    plain: tuple[str, ...]
    mig: tuple[tuple[str, tuple[str, ...]], ...]


SliceLayout = tuple[str, int, int, int]
"""profile, compute slices, memory MiB, GPU instance id: one MIG slice as agents report it."""

# A100 places 1g.5gb GPU instances at ids 7..13.
DENSE_SLICES: tuple[SliceLayout, ...] = tuple(("1g.5gb", 1, SLICE_MEM_MIB, 7 + k) for k in range(SLICES_PER_GPU))


def gpu_inventory(
    plain: tuple[str, ...], mig: tuple[tuple[str, tuple[str, ...]], ...], layout: tuple[SliceLayout, ...]
) -> list[dict[str, Any]]:
    """The batch's `gpus`: the plain GPUs first, then the MIG GPUs, each split as `layout` says."""
    gpus: list[dict[str, Any]] = [
        {"uuid": u, "index": i, "name": GPU_NAME, "memory_total_mib": GPU_MEM_MIB, "mig_mode": False}
        for i, u in enumerate(plain)
    ]
    for j, (gpu_uuid, slices) in enumerate(mig):
        gpus.append(
            {
                "uuid": gpu_uuid,
                "index": len(plain) + j,
                "name": GPU_NAME,
                "memory_total_mib": GPU_MEM_MIB,
                "mig_mode": True,
                "unpartitioned_slices": 0,
                "util_unavailable_reason": MIG_REASON,
                "slices": [
                    {
                        "uuid": s,
                        "gpu_instance_id": gi,
                        "compute_instance_id": 0,
                        "profile": profile,
                        "compute_slices": compute,
                        "memory_total_mib": mem,
                        "util_unavailable_reason": MIG_REASON,
                    }
                    for s, (profile, compute, mem, gi) in zip(slices, layout, strict=True)
                ],
            }
        )
    return gpus


def make_spec(index: int, seed: int, now: float, intervals: int) -> AgentSpec:
    rng = random.Random(seed * 7919 + index)
    # A day back, so each agent has ~1440 batches of room before reaching the present.
    start = math.floor((now - 86400.0) / INTERVAL_S) * INTERVAL_S + rng.uniform(0.0, INTERVAL_S)
    batch_s = intervals * INTERVAL_S
    last_offset = (intervals - 1) * INTERVAL_S
    limit = max(0, math.floor((now + FUTURE_MARGIN_S - start - last_offset) / batch_s) + 1)

    def uid(prefix: str) -> str:
        return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128), version=4)}"

    plain = tuple(uid("GPU") for _ in range(PLAIN_GPUS))
    mig = tuple((uid("GPU"), tuple(uid("MIG") for _ in range(SLICES_PER_GPU))) for _ in range(MIG_GPUS))
    gpus = gpu_inventory(plain, mig, DENSE_SLICES)
    octets = (index // 250, index % 250 + 2)
    static: dict[str, Any] = {
        "agent": {"version": "0.1.0", "interval_s": INTERVAL_S, "dropped_batches": 0},
        "instance": {
            "instance_id": f"i-0{rng.getrandbits(64):016x}",
            "hostname": f"ip-10-0-{octets[0]}-{octets[1]}.ec2.internal",
            "instance_type": "p4d.24xlarge",
            "region": "us-east-1",
            "availability_zone": f"us-east-1{'abcd'[index % 4]}",
            "lifecycle": "spot" if index % 3 == 0 else "on-demand",
            "ami_id": "ami-0123456789abcdef0",
            "tags": {"Name": f"bench-{index}", "team": f"team-{index % 5}", "env": "bench"},
        },
        "gpus": gpus,
    }
    return AgentSpec(index, seed, start, intervals, limit, static, plain, mig)


def make_batch(spec: AgentSpec, n: int) -> dict[str, Any]:
    """Batch `n` of this agent: deterministic, so it can be built in any process."""
    rng = random.Random(spec.seed * 1_000_003 + spec.index * 100_003 + n)
    t0 = spec.start + n * spec.intervals * INTERVAL_S
    intervals: list[dict[str, Any]] = []
    for k in range(spec.intervals):
        start = datetime.fromtimestamp(t0 + k * INTERVAL_S, UTC).isoformat(timespec="milliseconds")
        samples: list[dict[str, Any]] = []
        for u in spec.plain:
            util = round(rng.uniform(0.0, 100.0), 1)
            busy = util >= 5.0
            samples.append(
                {
                    "uuid": u,
                    "util": util,
                    "util_source": "nvml.samples",
                    "mem_used_mib": rng.randint(8000, GPU_MEM_MIB - 512) if busy else rng.choice((0, 0, 418)),
                    "power_w": round(55.0 + util * 3.4 + rng.uniform(-5.0, 5.0), 1),
                    "temp_c": round(31.0 + util * 0.35 + rng.uniform(-2.0, 2.0), 1),
                    "procs": rng.randint(1, 3) if busy else 0,
                }
            )
        for gpu_uuid, slices in spec.mig:
            slice_samples: list[dict[str, Any]] = []
            mem_total = 0
            procs_total = 0
            for s in slices:
                procs = rng.choice((0, 1, 1, 2))
                mem = rng.randint(300, SLICE_MEM_MIB - 64) if procs else 0
                mem_total += mem
                procs_total += procs
                slice_samples.append(
                    {"uuid": s, "util": None, "util_source": "none", "mem_used_mib": mem, "procs": procs}
                )
            samples.append(
                {
                    "uuid": gpu_uuid,
                    "util": None,
                    "util_source": "none",
                    "mem_used_mib": mem_total,
                    "power_w": round(rng.uniform(70.0, 330.0), 1),
                    "temp_c": round(rng.uniform(33.0, 68.0), 1),
                    "procs": procs_total,
                }
            )
            samples.extend(slice_samples)
        intervals.append({"start": start, "duration_s": INTERVAL_S, "samples": samples})
    return {"schema_version": 1, "batch_id": str(uuid.uuid4()), **spec.static, "intervals": intervals}


def make_body(spec: AgentSpec, n: int) -> bytes:
    return gzip.compress(orjson.dumps(make_batch(spec, n)), compresslevel=6, mtime=0)


def spec_devices(spec: AgentSpec) -> int:
    """Samples per interval of this agent: every GPU, and every slice of a MIG GPU."""
    return len(spec.plain) + sum(1 + len(slices) for _gpu, slices in spec.mig)


def build_bodies(spec: AgentSpec, count: int) -> list[bytes]:
    return [make_body(spec, n) for n in range(min(count, spec.limit))]


class BodySource:
    """An agent's batches in order: pre-built ones first, then built on the spot (counted, as it costs CPU)."""

    def __init__(self, spec: AgentSpec, bodies: list[bytes]) -> None:
        self.spec = spec
        self.bodies = bodies
        self.next_n = 0
        self.built_live = 0

    def next(self) -> bytes | None:
        n = self.next_n
        if n >= self.spec.limit:
            return None
        self.next_n = n + 1
        if n < len(self.bodies):
            body = self.bodies[n]
            self.bodies[n] = b""  # the memory can go once sent
            return body
        self.built_live += 1
        return make_body(self.spec, n)


# --------------------------------------------------------------------------------------------------------------
# Load clients


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


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool, float | None]:
    """Status, body, whether the server keeps the connection open (HTTP/1.1, no `Connection: close`), and its
    Retry-After in seconds, if any."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    if "content-length" in headers:
        data = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:  # no trailers are expected
                break
        data = b"".join(p[:-2] for p in parts)
    else:
        data = await reader.read()
    retry_after = headers.get("retry-after", "")
    return status, data, headers.get("connection") != "close", float(retry_after) if retry_after.isdigit() else None


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
                    status, data, keep, retry_after = await _read_response(reader)
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


# --------------------------------------------------------------------------------------------------------------
# Processes: CPU accounting, the server


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and of its children it has reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / tick)
    return table


def tree_cpu(root: int) -> float | None:
    """CPU seconds used by a process and all its descendants (reaped ones included), or None if it is gone."""
    table = _proc_table()
    if root not in table:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in table.items():
        children.setdefault(ppid, []).append(pid)
    total = 0.0
    todo = [root]
    while todo:
        pid = todo.pop()
        total += table[pid][1]
        todo.extend(children.get(pid, []))
    return total


def postmaster_pid(url: str) -> int | None:
    """The database server's main process if it runs on this machine (its CPU is then measured)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is None:
            return None
        with open(f"/proc/{int(row[0])}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, psycopg.Error, ValueError):
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(url: str, port: int, workers: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, GPUFLEET_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "app.cli", "serve", "--database-url", url, "--port", str(port)]
    cmd += ["--workers", str(workers)]
    # Access log lines go to a file: one per request would flood the terminal.
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise BenchError(f"server exited with {proc.returncode}:\n{tail(log_path)}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise BenchError(f"server not ready after {timeout:.0f} s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log("server did not stop within 30 s of SIGTERM; killing its process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Its session is its own (start_new_session): anything left in that group is a stray worker of ours.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def server_log_problems(path: Path) -> tuple[int, list[str]]:
    """Lines of the server log that are neither access lines for 2xx answers nor start/stop chatter."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0, []
    bad = [
        line
        for line in text.splitlines()
        if ("Traceback" in line or "ERROR" in line or "WARNING" in line or "Exception" in line)
        or ('HTTP/1.1"' in line and '" 2' not in line)
    ]
    return len(bad), bad[:10]


# --------------------------------------------------------------------------------------------------------------
# Database: setup, size, queries, reference COPY


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_bench_database(server_url: str) -> tuple[str, str, str]:
    admin = libpq_url(server_url)
    name = f"gpufleet_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(admin).set(database=name).render_as_string(hide_password=False), admin, name


def drop_bench_database(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    log(f"dropped database {name}")


def prepare_database(url: str) -> str:
    """Schema, partitions, and an ingest token; returns the token's secret."""
    from app.auth import create_token
    from app.db import make_engine, make_sessionmaker, session_scope
    from app.main import run_upkeep
    from app.migrate import upgrade
    from app.settings import Settings

    upgrade(url)
    engine = make_engine(url, pool_size=1)
    try:
        run_upkeep(engine, Settings(database_url=url))
        with session_scope(make_sessionmaker(engine)) as session:
            _token, secret = create_token(session, name="bench", scope="ingest")
    finally:
        engine.dispose()
    return secret


@dataclass
class Sizes:
    rows: int
    total: int
    heap: int
    index: int
    batches: int
    rollup_secs: float
    per_index: dict[str, int]


def measure_sizes(conn: psycopg.Connection[Any]) -> Sizes:
    row = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0), coalesce(sum(pg_relation_size(inhrelid)), 0), "
        "coalesce(sum(pg_indexes_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = 'samples'::regclass"
    ).fetchone()
    count = conn.execute("SELECT count(*) FROM samples").fetchone()
    batches = conn.execute("SELECT count(*) FROM ingest_batches").fetchone()
    secs = conn.execute("SELECT coalesce(sum(secs), 0) FROM rollups_hourly").fetchone()
    assert row is not None and count is not None and batches is not None and secs is not None
    # Partition indexes summed under the partitioned index they belong to.
    per_index = {
        str(name): int(size)
        for name, size in conn.execute(
            "SELECT p.relname, sum(pg_relation_size(i.inhrelid)) FROM pg_inherits i "
            "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_index x ON x.indexrelid = p.oid "
            "WHERE x.indrelid = 'samples'::regclass GROUP BY 1 ORDER BY 1"
        ).fetchall()
    }
    return Sizes(int(count[0]), int(row[0]), int(row[1]), int(row[2]), int(batches[0]), float(secs[0]), per_index)


def _plan_nodes(plan: dict[str, Any]) -> list[str]:
    label = plan["Node Type"]
    target = plan.get("Index Name") or plan.get("Relation Name")
    out = [f"{label}({target})" if target else label]
    for child in plan.get("Plans", []):
        out += _plan_nodes(child)
    return out


def explain(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], brin: set[str]) -> tuple[list[str], bool]:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    plan: dict[str, Any] = doc[0]["Plan"]
    nodes = _plan_nodes(plan)
    used = any(n.endswith(")") and n.rsplit("(", 1)[1][:-1] in brin for n in nodes)
    return nodes, used


def time_query(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> float:
    times: list[float] = []
    for _ in range(QUERY_RUNS):
        t = time.perf_counter()
        conn.execute(sql, params).fetchall()
        times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times)


@dataclass
class QueryResult:
    device_hour_ms: float | None
    fleet_5min_ms: float | None
    device_hour_plan: list[str]
    fleet_5min_plan: list[str]
    brin_used: bool


DEVICE_HOUR_SQL = "SELECT avg(util), max(mem_used_mib) FROM samples WHERE device_id = %s AND ts >= %s AND ts < %s"
FLEET_SQL = "SELECT count(*), avg(util) FROM samples WHERE ts >= %s AND ts < %s"


def run_queries(conn: psycopg.Connection[Any], t_lo: datetime) -> QueryResult:
    brin = {
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'brin'"
        ).fetchall()
    }
    partition_brin = [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
            "WHERE a.amname = 'brin' AND c.relkind = 'i'"
        ).fetchall()
    ]
    # In service, autovacuum summarizes new BRIN ranges and gathers statistics within minutes; a table
    # filled seconds ago has neither, so do now what autovacuum would have done.
    for name in partition_brin:
        conn.execute("SELECT brin_summarize_new_values(%s::regclass)", (name,))
    conn.execute("ANALYZE samples")
    found = conn.execute(
        "SELECT device_id FROM samples WHERE ts >= %s AND ts < %s AND util IS NOT NULL LIMIT 1",
        (t_lo, t_lo + timedelta(seconds=3 * INTERVAL_S)),
    ).fetchone()
    device_ms: float | None = None
    device_plan: list[str] = []
    used = True
    if found is not None:
        params: tuple[Any, ...] = (int(found[0]), t_lo, t_lo + timedelta(hours=1))
        device_plan, brin_device = explain(conn, DEVICE_HOUR_SQL, params, brin)
        log(f"plan, one device over one hour: {' > '.join(device_plan)}")
        device_ms = time_query(conn, DEVICE_HOUR_SQL, params)
        used = brin_device
    fleet_params = (t_lo, t_lo + timedelta(minutes=5))
    fleet_plan, brin_fleet = explain(conn, FLEET_SQL, fleet_params, brin)
    log(f"plan, whole fleet over 5 minutes: {' > '.join(fleet_plan)}")
    fleet_ms = time_query(conn, FLEET_SQL, fleet_params)
    if not (used and brin_fleet):
        # Diagnosis only: is the index usable at all, or did the planner just prefer a scan (no ANALYZE yet)?
        conn.execute("SET enable_seqscan = off")
        try:
            forced, _ = explain(conn, FLEET_SQL, fleet_params, brin)
        finally:
            conn.execute("RESET enable_seqscan")
        log(f"WARNING: a query did not use a BRIN index; with enable_seqscan off: {' > '.join(forced)}")
    return QueryResult(device_ms, fleet_ms, device_plan, fleet_plan, used and brin_fleet and found is not None)


def reference_rows(count: int, t_lo: float, t_hi: float, agents: int, seed: int) -> Iterator[list[tuple[Any, ...]]]:
    """Rows shaped as copy_samples_direct expects, laid out like the load (time-ordered, 36 devices per agent
    per interval, same value mix), in chunks; time wraps around inside the loaded range."""
    rng = random.Random(seed)
    chunk_rows = max(DEVICES, 50_000 // DEVICES * DEVICES)
    steps = max(1, int((t_hi - t_lo) // INTERVAL_S))
    made = 0
    step = 0
    chunk: list[tuple[Any, ...]] = []
    while made < count:
        ts = datetime.fromtimestamp(t_lo + (step % steps) * INTERVAL_S, UTC)
        step += 1
        for agent in range(agents):
            base = agent * DEVICES + 1
            for d in range(DEVICES):
                if made >= count:
                    break
                if d < PLAIN_GPUS:
                    util = round(rng.uniform(0.0, 100.0), 1)
                    row: tuple[Any, ...] = (
                        ts,
                        base + d,
                        rng.randint(0, GPU_MEM_MIB),
                        util,
                        None,
                        round(55 + util * 3.4),
                        round(31 + util * 0.35),
                        rng.randint(0, 3),
                        1,
                    )
                elif (d - PLAIN_GPUS) % (SLICES_PER_GPU + 1) == 0:
                    row = (
                        ts,
                        base + d,
                        rng.randint(0, GPU_MEM_MIB),
                        None,
                        None,
                        rng.randint(70, 330),
                        rng.randint(33, 68),
                        rng.randint(0, 14),
                        0,
                    )
                else:
                    row = (ts, base + d, rng.randint(0, SLICE_MEM_MIB), None, None, None, None, rng.randint(0, 2), 0)
                chunk.append(row)
                made += 1
                if len(chunk) >= chunk_rows:
                    yield chunk
                    chunk = []
    if chunk:
        yield chunk


def reference_copy(url: str, count: int, t_lo: float, t_hi: float, agents: int, seed: int) -> float:
    """Seconds spent COPYing `count` rows straight into `samples` (row generation is not timed; commits are)."""
    from app.db import make_engine, make_sessionmaker, session_scope
    from app.store.samples import copy_samples_direct

    engine = make_engine(url, pool_size=1)
    sessions = make_sessionmaker(engine)
    spent = 0.0
    try:
        for chunk in reference_rows(count, t_lo, t_hi, agents, seed):
            t = time.perf_counter()
            with session_scope(sessions) as session:
                copy_samples_direct(session, chunk)
            spent += time.perf_counter() - t
    finally:
        engine.dispose()
    return spent


# --------------------------------------------------------------------------------------------------------------
# The run


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def _quiet(what: str, fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as exc:
            log(f"cleanup: {what} failed: {exc}")

    return run


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="length of the load phase (default 30)")
    p.add_argument("--agents", type=int, default=32, help="concurrent simulated agents (default 32)")
    p.add_argument(
        "--intervals", type=int, default=None, help="10 s intervals per batch (default 6; --realistic: the agent's)"
    )
    p.add_argument(
        "--realistic",
        action="store_true",
        help="per-instance batches as agents at their defaults send them (bench/instances.py)",
    )
    p.add_argument("--database-url", help="PostgreSQL server to create a scratch database on (default: embedded)")
    p.add_argument("--workers", type=int, default=2, help="server worker processes (default 2)")
    p.add_argument(
        "--client",
        choices=["asyncio", "threads"],
        default="asyncio",
        help="load client: one asyncio loop over raw streams, or a thread per agent with http.client",
    )
    p.add_argument(
        "--expect-rate",
        type=float,
        default=300.0,
        help="batches/s the pre-built payloads are sized for; past that they are built during the load",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed batches each agent sends first (instance registration; default 1)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    args = p.parse_args(argv)
    if args.intervals is None:
        from bench.instances import AGENT_BATCH_INTERVALS

        args.intervals = AGENT_BATCH_INTERVALS if args.realistic else 6
    if args.agents < 1 or args.intervals < 1 or args.seconds <= 0 or args.workers < 1:
        p.error("--agents, --intervals, --workers and --seconds must be positive")
    return args


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    seed: int = args.seed if args.seed is not None else secrets.randbits(31)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    stack.callback(_quiet("remove temporary folder", lambda: shutil.rmtree(tmp, ignore_errors=True)))

    if args.database_url:
        url, admin, name = create_bench_database(args.database_url)
        stack.callback(_quiet("drop bench database", lambda: drop_bench_database(admin, name)))
        log(f"created database {name}")
        where = "external"
    else:
        from app.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(tmp / "db")
        stack.callback(_quiet("stop embedded PostgreSQL", embedded.stop))
        log(f"starting embedded PostgreSQL in {embedded.pgdata}")
        url = embedded.start()
        where = "embedded"
    secret = prepare_database(url)
    db_pid = postmaster_pid(libpq_url(url))
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        shown = [
            f"{r[0]}={r[1]}"
            for r in conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'shared_buffers', "
                "'synchronous_commit', 'fsync', 'wal_level', 'max_wal_size', 'checkpoint_timeout') ORDER BY name"
            ).fetchall()
        ]
    log(f"database ready ({where}): {', '.join(shown)}")

    port = free_port()
    log_path = tmp / "server.log"
    proc = start_server(url, port, args.workers, log_path)
    stack.callback(_quiet("stop server", lambda: stop_server(proc)))

    # Payloads are built while the server starts, in processes: the timed phase only sends bytes.
    now = time.time()
    if args.realistic:
        from bench.instances import realistic_spec

        specs = [realistic_spec(i, seed, now, args.intervals) for i in range(args.agents)]
    else:
        specs = [make_spec(i, seed, now, args.intervals) for i in range(args.agents)]
    samples_per_batch = statistics.mean(s.intervals * spec_devices(s) for s in specs)
    batch_period_s = INTERVAL_S * args.intervals  # one agent's batches are this far apart
    per_agent = math.ceil(args.seconds * args.expect_rate / args.agents) + 2 + args.warmup
    t = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, args.agents))) as pool:
        bodies = list(pool.map(build_bodies, specs, [per_agent] * len(specs)))
    nbytes = sum(len(b) for bs in bodies for b in bs)
    nbodies = sum(len(bs) for bs in bodies)
    raw_size = len(orjson.dumps(make_batch(specs[0], 0)))
    log(
        f"built {nbodies} batches in {time.perf_counter() - t:.1f} s: {nbytes / max(nbodies, 1) / 1024:.1f} KiB "
        f"gzipped each ({raw_size / 1024:.1f} KiB of JSON), {nbytes / 2**20:.0f} MiB in all"
    )
    sources = [BodySource(spec, bs) for spec, bs in zip(specs, bodies, strict=True)]

    wait_ready(proc, port, log_path)
    log(
        f"server ready on port {port} with {args.workers} worker(s); load: {args.agents} agents, "
        f"{args.seconds:g} s, {samples_per_batch:g} samples per batch, {args.client} client"
    )
    load = run_load(args.client, port, secret, sources, args.seconds, args.warmup, proc.pid, db_pid)
    stop_server(proc)
    problems, problem_lines = server_log_problems(log_path)
    for line in problem_lines:
        log(f"server log: {line}")

    latencies = sorted(x for s in load.stats for x in s.latencies)
    batches = sum(s.batches for s in load.stats)
    samples = sum(s.samples for s in load.stats)
    errors = sum(s.errors for s in load.stats)
    warm_batches = sum(s.batches for s in load.warmup)
    warm_samples = sum(s.samples for s in load.warmup)
    warm_latencies = sorted(x for s in load.warmup for x in s.latencies)
    for message in [m for s in load.warmup + load.stats for m in s.messages][:5]:
        log(f"error: {message}")
    if load.built_live:
        log(f"WARNING: {load.built_live} batches were built during the load (raise --expect-rate)")
    if load.exhausted:
        log(f"WARNING: {load.exhausted} agents ran out of time range before the end")
    samples_per_s = samples / load.elapsed
    log(
        f"load done: {batches} batches, {samples} samples in {load.elapsed:.1f} s = {samples_per_s:,.0f} samples/s; "
        f"CPU s: client {load.client_cpu_s:.1f}, server {load.server_cpu_s}, db {load.db_cpu_s}"
    )

    t_lo = min(s.start for s in specs)
    t_hi = max(s.spec.start + s.next_n * s.spec.intervals * INTERVAL_S for s in sources)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        # Queries first: they bring the BRIN summaries up to date, which the size figure should include.
        queries = run_queries(conn, datetime.fromtimestamp(math.floor(t_lo), UTC))
        sizes = measure_sizes(conn)
        rows_match = sizes.rows == samples + warm_samples and sizes.batches == batches + warm_batches
        if not rows_match:
            log(
                f"WARNING: database holds {sizes.rows} samples in {sizes.batches} batches; acknowledged "
                f"{samples + warm_samples} in {batches + warm_batches} (warm-up included)"
            )
        if abs(sizes.rollup_secs - sizes.rows * INTERVAL_S) > 1e-6 * max(1.0, sizes.rollup_secs):
            log(f"WARNING: rollups cover {sizes.rollup_secs:g} s, samples {sizes.rows * INTERVAL_S:g} s")
    rows = max(sizes.rows, 1)
    log(
        f"samples: {sizes.rows} rows, {sizes.total / 2**20:.1f} MiB ({sizes.heap / 2**20:.1f} heap, "
        f"{sizes.index / 2**20:.2f} index); queries: device-hour {queries.device_hour_ms} ms, "
        f"fleet-5min {queries.fleet_5min_ms} ms"
    )

    log(f"reference: COPY of {samples} rows straight into samples")
    copy_s = reference_copy(url, samples, t_lo, max(t_hi, t_lo + INTERVAL_S), args.agents, seed) if samples else 0.0
    copy_per_s = samples / copy_s if copy_s > 0 else 0.0
    log(f"reference COPY: {copy_s:.2f} s = {copy_per_s:,.0f} samples/s")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        after = measure_sizes(conn)
    copied = max(after.rows - sizes.rows, 1)
    log(
        "index bytes per sample, load / COPY: "
        + ", ".join(
            f"{name} {size / rows:.2f} / {(after.per_index.get(name, 0) - size) / copied:.2f}"
            for name, size in sizes.per_index.items()
        )
    )

    def r(x: float | None, digits: int = 2) -> float | None:
        return None if x is None or math.isnan(x) else round(x, digits)

    return {
        "samples_per_s": r(samples_per_s, 1),
        "copy_samples_per_s": r(copy_per_s, 1),
        "ratio": r(samples_per_s / copy_per_s if copy_per_s else None, 4),
        "p50_ms": r(percentile(latencies, 0.50) * 1000.0),
        "p99_ms": r(percentile(latencies, 0.99) * 1000.0),
        "max_ms": r(latencies[-1] * 1000.0 if latencies else None),
        "bytes_per_sample": r(sizes.total / rows),
        "heap_bytes_per_sample": r(sizes.heap / rows),
        "index_bytes_per_sample": r(sizes.index / rows),
        "batches": batches,
        "samples": samples,
        "seconds": args.seconds,
        "elapsed_s": r(load.elapsed, 3),
        "agents": args.agents,
        "intervals_per_batch": args.intervals,
        "samples_per_batch": round(samples_per_batch, 1),
        "mode": "realistic" if args.realistic else "dense",
        "batches_per_s": r(batches / load.elapsed, 1),
        # How many instances at the agent's default cadence (a batch every interval_s * batch_intervals) the
        # server kept up with; meaningful in --realistic mode, where batches are theirs.
        "instances_sustained": round(batches / load.elapsed * batch_period_s) if args.realistic else None,
        "shed_503": sum(s.shed for s in load.stats),
        "workers": args.workers,
        "device_hour_query_ms": r(queries.device_hour_ms, 3),
        "fleet_5min_query_ms": r(queries.fleet_5min_ms, 3),
        "brin_used": queries.brin_used,
        "errors": errors,
        "server_log_problems": problems,
        "rows_in_db": sizes.rows,
        "rows_match": rows_match,
        "warmup_batches": warm_batches,
        "warmup_errors": sum(s.errors for s in load.warmup),
        "warmup_max_ms": r(warm_latencies[-1] * 1000.0 if warm_latencies else None),
        "copy_seconds": r(copy_s, 3),
        "copy_bytes_per_sample": r((after.total - sizes.total) / copied),
        "copy_index_bytes_per_sample": r((after.index - sizes.index) / copied),
        "index_bytes_per_sample_by_index": {k: r(v / rows) for k, v in sizes.per_index.items()},
        "client": args.client,
        "client_cpu_s": r(load.client_cpu_s),
        "server_cpu_s": r(load.server_cpu_s),
        "db_cpu_s": r(load.db_cpu_s),
        "cpus": os.cpu_count(),
        "gzip_bytes_per_batch": round(nbytes / nbodies) if nbodies else None,
        "json_bytes_per_batch": raw_size,
        "built_during_load": load.built_live,
        "database": where,
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    return run_and_report(run, parse_args(argv))


def run_and_report(
    run: Callable[[argparse.Namespace, contextlib.ExitStack], dict[str, Any]], args: argparse.Namespace
) -> int:
    """Run a benchmark, clean up whatever it set up, and print its figures as the last line (one JSON)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.ExitStack() as stack:
            result = run(args, stack)
    except BenchError as exc:
        log(f"failed: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
