"""Ingest benchmark: simulated agents POST gzipped batches to a real `gpufleet serve`; a plain COPY of the same
number of rows into `samples` is the physical reference.

    .venv/bin/python -m bench.ingest [--seconds 30] [--agents 32] [--intervals 6] [--database-url URL] [--workers 2]
        [--holders]
    .venv/bin/python -m bench.ingest --realistic [--agents 64]
    (or .venv/bin/python bench/ingest.py with the same options)

`--realistic` sends what agents at their defaults send (bench/instances.py: 8 GPUs, some in MIG mode, the agent's
intervals per batch) and reports how many such instances the server keeps up with (`instances_sustained`).
A 503 is answered as an agent does: the same batch again after its Retry-After.

Progress goes to stderr; the last line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.batches import INTERVAL_S, BodySource, build_bodies, make_batch, make_spec, spec_devices
from bench.database import connect, open_scratch, postmaster_pid, prepare_database
from bench.harness import (
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
from bench.ingest_clients import run_load
from bench.instances import AGENT_BATCH_INTERVALS, realistic_spec
from bench.storage import measure_sizes, reference_copy, run_queries


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
    p.add_argument(
        "--holders",
        action="store_true",
        help="dense batches say which processes hold each device (three per device, each described once a batch)",
    )
    args = p.parse_args(argv)
    if args.intervals is None:
        args.intervals = AGENT_BATCH_INTERVALS if args.realistic else 6
    if args.agents < 1 or args.intervals < 1 or args.seconds <= 0 or args.workers < 1:
        p.error("--agents, --intervals, --workers and --seconds must be positive")
    return args


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    seed: int = args.seed if args.seed is not None else secrets.randbits(31)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    stack.callback(quiet("remove temporary folder", lambda: shutil.rmtree(tmp, ignore_errors=True)))
    scratch = open_scratch(args.database_url, tmp, stack)
    url, where = scratch.url, scratch.where
    secret = prepare_database(url)
    db_pid = postmaster_pid(url)
    with connect(url) as conn:
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
    stack.callback(quiet("stop server", lambda: stop_server(proc)))

    # Payloads are built while the server starts, in processes: the timed phase only sends bytes.
    now = time.time()
    if args.realistic:
        specs = [realistic_spec(i, seed, now, args.intervals) for i in range(args.agents)]
    else:
        specs = [make_spec(i, seed, now, args.intervals, holders=args.holders) for i in range(args.agents)]
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
    with connect(url) as conn:
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
    with connect(url) as conn:
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
        "holders": args.holders,
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


if __name__ == "__main__":
    sys.exit(main())
