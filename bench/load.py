"""Load test: many simulated agents post realistic batches back to back to a real `gpufleet serve` on loopback.

    .venv/bin/python -m bench.load [--agents 200] [--seconds 60] [--flood 8] [--workers 1] [--database-url URL]
    (or .venv/bin/python bench/load.py with the same options)

Each agent sends its instance's batches (bench/instances.py: 8 GPUs, some in MIG mode, the agent's intervals per
batch, gzip, a fresh batch id each) one after another, waits at most the agent's HTTP timeout for an answer, and
answers a 429 or 503 with Retry-After as the agent does: the same batch again once that time has passed.

Phase 1 is the agents alone. Phase 2 (unless `--flood 0`) adds `--flood` clients that post 8 MiB bodies without a
token, over and over. Both report the answers by status, latency percentiles and the server's peak RSS (its
whole process tree), which must stay under 300 MiB per worker in phase 2. At the end every acknowledged batch
must be stored exactly once, with the samples it carried. The last line of stdout is one JSON object; `passed`
says whether every check held: no answer other than 200, 429 or 503, none later than the agent's timeout, the
RSS limit, exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil  # type: ignore[import-untyped]

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.batches import INGEST_PATH, BodySource, build_bodies, read_response, spec_devices
from bench.database import connect, open_scratch, prepare_database
from bench.harness import (
    BenchError,
    free_port,
    log,
    percentile,
    quiet,
    run_and_report,
    server_log_problems,
    start_server,
    stop_server,
    wait_ready,
)
from bench.instances import AGENT_BATCH_INTERVALS, realistic_spec

AGENT_TIMEOUT_S = 10.0
"""The agent's HTTP timeout (agent/config.py, http_timeout_s): an answer later than this is as good as none."""
FLOOD_BODY_BYTES = 8 * 1024 * 1024
RSS_LIMIT_MIB = 300.0
"""Per worker: the server's whole process tree must stay under this times `--workers` while unauthenticated
8 MiB bodies pour in."""
MIB = 1024 * 1024


@dataclass
class Phase:
    """What the agents saw in one phase."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ok_latencies: list[float] = field(default_factory=list)
    late: int = 0
    """Answers that did not come within AGENT_TIMEOUT_S."""
    errors: list[str] = field(default_factory=list)
    flood: Counter[str] = field(default_factory=Counter)
    peak_rss_mib: float = 0.0

    def summary(self, elapsed: float) -> dict[str, Any]:
        lat = sorted(self.latencies)
        ok = sorted(self.ok_latencies)

        def ms(values: list[float], q: float) -> float | None:
            return round(percentile(values, q) * 1000.0, 1) if values else None

        return {
            "elapsed_s": round(elapsed, 1),
            "statuses": dict(self.statuses),
            "batches_per_s": round(self.statuses.get("200", 0) / elapsed, 1),
            "p50_ms": ms(lat, 0.50),
            "p95_ms": ms(lat, 0.95),
            "max_ms": round(lat[-1] * 1000.0, 1) if lat else None,
            "stored_p95_ms": ms(ok, 0.95),
            "stored_max_ms": round(ok[-1] * 1000.0, 1) if ok else None,
            "late_answers": self.late,
            "errors": len(self.errors),
            "flood": dict(self.flood),
            "peak_rss_mib": round(self.peak_rss_mib, 1),
        }


@dataclass
class Acks:
    """Every batch the server acknowledged: id -> (status, samples sent, samples the answer said it stored)."""

    batches: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    doubled: int = 0
    """A batch acknowledged as `stored` twice."""

    def add(self, answer: dict[str, Any], sent: int) -> None:
        batch_id, status = str(answer["batch_id"]), str(answer["status"])
        before = self.batches.get(batch_id)
        if before is not None and before[0] == "stored" and status == "stored":
            self.doubled += 1
        if before is None or status == "stored":
            self.batches[batch_id] = (status, sent, int(answer["samples"]))


def tree_rss_mib(proc: psutil.Process) -> float:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total / MIB


class RssWatch:
    """The server tree's RSS, sampled every 0.1 s in a thread; `peak` since the last `reset`."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, tree_rss_mib(self.proc))

    def reset(self) -> float:
        peak, self.peak = self.peak, 0.0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


async def agent(port: int, token: str, source: BodySource, deadline: float, phase: Phase, acks: Acks) -> None:
    head = (
        f"POST {INGEST_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nAuthorization: Bearer {token}\r\nContent-Length: "
    ).encode()
    sent = source.spec.intervals * spec_devices(source.spec)
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    body: bytes | None = None
    try:
        while time.perf_counter() < deadline:
            body = body or source.next()
            if body is None:
                break
            t = time.perf_counter()
            reused = conn is not None
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conn
                writer.writelines((head, str(len(body)).encode(), b"\r\n\r\n", body))
                await writer.drain()
                status, data, keep, retry_after = await asyncio.wait_for(read_response(reader), AGENT_TIMEOUT_S)
            except TimeoutError:
                phase.late += 1  # the agent gives up on this answer and sends the same batch again later
                if conn is not None:
                    conn[1].close()
                conn = None
                await asyncio.sleep(1.0)
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                if conn is not None:
                    conn[1].close()
                conn = None
                if reused and isinstance(exc, ConnectionError | asyncio.IncompleteReadError):
                    continue  # the server had closed the idle connection: a client sends again on a new one
                phase.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)
                continue
            took = time.perf_counter() - t
            phase.statuses[str(status)] += 1
            phase.latencies.append(took)
            if not keep:
                writer.close()
                conn = None
            if status == 200:
                phase.ok_latencies.append(took)
                acks.add(orjson.loads(data), sent)
                body = None
            elif status in (429, 503) and retry_after is not None:
                await asyncio.sleep(retry_after)
            else:
                phase.errors.append(f"HTTP {status}: {data[:200]!r}")
                body = None
    finally:
        if conn is not None:
            conn[1].close()


async def flooder(port: int, deadline: float, phase: Phase) -> None:
    """Posts an 8 MiB body with no token, again and again; counts how each attempt ended."""
    head = (
        f"POST {INGEST_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {FLOOD_BODY_BYTES}\r\n\r\n"
    ).encode()
    body = b"[" + b" " * (FLOOD_BODY_BYTES - 2) + b"]"
    while time.perf_counter() < deadline:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            writer.write(body)
            status, _data, _keep, _retry = await asyncio.wait_for(read_response(reader), 30.0)
            phase.flood[str(status)] += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            phase.flood["reset"] += 1
        except TimeoutError:
            phase.flood["timeout"] += 1
        finally:
            if writer is not None:
                writer.close()


def run_phase(
    port: int, token: str, sources: list[BodySource], seconds: float, flood: int, watch: RssWatch, acks: Acks
) -> tuple[Phase, float]:
    phase = Phase()

    async def everyone() -> None:
        deadline = time.perf_counter() + seconds
        await asyncio.gather(
            *(agent(port, token, src, deadline, phase, acks) for src in sources),
            *(flooder(port, deadline, phase) for _ in range(flood)),
        )

    watch.reset()
    t0 = time.perf_counter()
    asyncio.run(everyone())
    elapsed = time.perf_counter() - t0
    phase.peak_rss_mib = watch.reset()
    return phase, elapsed


def check_stored(url: str, acks: Acks) -> dict[str, Any]:
    """The database against what was acknowledged: each batch once, with its samples."""
    with connect(url) as conn:
        rows = dict(conn.execute("SELECT batch_id::text, samples FROM ingest_batches").fetchall())
        samples = conn.execute("SELECT count(*) FROM samples").fetchone()
    missing = [b for b in acks.batches if b not in rows]
    wrong_count = [b for b, (_s, sent, _n) in acks.batches.items() if b in rows and rows[b] != sent]
    not_acked = [b for b in rows if b not in acks.batches]
    stored_samples = sum(n for status, _sent, n in acks.batches.values() if status == "stored")
    return {
        "acked_batches": len(acks.batches),
        "stored_batches": len(rows),
        "missing": len(missing),
        "wrong_sample_count": len(wrong_count),
        "stored_without_ack": len(not_acked),
        "acked_stored_twice": acks.doubled,
        "samples_in_db": samples[0] if samples else None,
        "samples_acked": stored_samples,
        "exactly_once": not missing
        and not wrong_count
        and not acks.doubled
        and samples is not None
        and samples[0] == stored_samples,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=200, help="simulated agents posting at once (default 200)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default 60)")
    p.add_argument("--flood", type=int, default=8, help="clients posting 8 MiB bodies without a token in phase 2")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    p.add_argument("--database-url", help="PostgreSQL server to create a scratch database on (default: embedded)")
    p.add_argument("--expect-rate", type=float, default=300.0, help="batches/s the pre-built bodies are sized for")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if args.agents < 1 or args.seconds <= 0 or args.flood < 0 or args.workers < 1:
        p.error("--agents, --seconds and --workers must be positive, --flood at least 0")
    return args


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    seed: int = args.seed if args.seed is not None else secrets.randbits(31)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-load-"))
    stack.callback(quiet("remove temporary folder", lambda: shutil.rmtree(tmp, ignore_errors=True)))
    url = open_scratch(args.database_url, tmp, stack).url
    token = prepare_database(url)
    port = free_port()
    log_path = tmp / "server.log"
    proc = start_server(url, port, args.workers, log_path)
    stack.callback(quiet("stop server", lambda: stop_server(proc)))

    now = time.time()
    specs = [realistic_spec(i, seed, now, AGENT_BATCH_INTERVALS) for i in range(args.agents)]
    phases = 2 if args.flood else 1
    per_agent = math.ceil(phases * args.seconds * args.expect_rate / args.agents) + 2
    with ProcessPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, 4))) as pool:
        bodies = list(pool.map(build_bodies, specs, [per_agent] * len(specs)))
    sources = [BodySource(spec, bs) for spec, bs in zip(specs, bodies, strict=True)]
    wait_ready(proc, port, log_path)
    watch = RssWatch(proc.pid)
    stack.callback(watch.stop)
    idle_rss = tree_rss_mib(psutil.Process(proc.pid))
    log(f"server ready on port {port} ({args.workers} worker(s)), {idle_rss:.0f} MiB; {args.agents} agents")

    acks = Acks()
    results: dict[str, Any] = {}
    for phase_name, flood in [("agents", 0), ("agents_and_flood", args.flood)][:phases]:
        phase, elapsed = run_phase(port, token, sources, args.seconds, flood, watch, acks)
        results[phase_name] = phase.summary(elapsed)
        for message in phase.errors[:5]:
            log(f"{phase_name}: error: {message}")
        log(f"{phase_name}: {orjson.dumps(results[phase_name]).decode()}")
    results["after_rss_mib"] = round(tree_rss_mib(psutil.Process(proc.pid)), 1)
    stop_server(proc)
    problems, lines = server_log_problems(log_path)
    for line in lines:
        log(f"server log: {line}")
    stored = check_stored(url, acks)
    log(f"stored: {stored}")
    phase_results = [results[k] for k in ("agents", "agents_and_flood") if k in results]
    allowed = {"200", "429", "503"}
    rss_limit = RSS_LIMIT_MIB * args.workers
    passed = (
        stored["exactly_once"]
        and all(p["errors"] == 0 and p["late_answers"] == 0 and set(p["statuses"]) <= allowed for p in phase_results)
        and ("agents_and_flood" not in results or results["agents_and_flood"]["peak_rss_mib"] < rss_limit)
    )
    if not stored["acked_batches"]:
        raise BenchError("no batch was acknowledged")
    return {
        "passed": passed,
        **results,
        "idle_rss_mib": round(idle_rss, 1),
        "rss_limit_mib": rss_limit,
        "stored": stored,
        "agents": args.agents,
        "seconds": args.seconds,
        "flood_clients": args.flood,
        "workers": args.workers,
        "samples_per_batch": round(sum(s.intervals * spec_devices(s) for s in specs) / len(specs), 1),
        "server_log_problems": problems,
        "cpus": os.cpu_count(),
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    return run_and_report(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
