"""What the ingest benchmark measures in the database after the load: the size of `samples` per row and per
index, the plans and times of two queries that should use the BRIN indexes, and a plain COPY of as many rows
straight into `samples` (the physical reference the HTTP path is held against).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bench.batches import DEVICES, GPU_MEM_MIB, INTERVAL_S, PLAIN_GPUS, SLICE_MEM_MIB, SLICES_PER_GPU
from bench.harness import log

if TYPE_CHECKING:
    import psycopg

QUERY_RUNS = 5


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
