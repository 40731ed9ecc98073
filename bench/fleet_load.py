"""Loading the synthetic fleet of bench/fleet.py into a database, as agents' batches would have put it there.

Instances, GPUs and MIG slices go in through `upsert_inventory` (as the first batch of each agent would put
them, then again where a MIG layout changes), samples through `write_samples` (COPY into the staging table, then
into `samples` and the rollups) and the processes holding the devices through `store_holders` right after, one
UTC hour of the whole fleet per transaction, in time order, from worker processes. Then VACUUM ANALYZE, so
autovacuum does not run during the timing. `top_up` adds the samples (and holders) of the time since, so the
pages show a fleet that is up to date.

psycopg, SQLAlchemy and the app are imported by the functions that use them (see bench/harness.py).
"""

from __future__ import annotations

import gc
import shutil
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.database import connect, database_size_mib
from bench.fleet import DAY, HOUR, Fleet, batch_dict, make_fleet
from bench.fleet_samples import Made, SampleMaker, last_seen
from bench.harness import BenchError, log

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session


def ensure_partitions(engine: Engine, retention_days: int) -> None:
    """Day partitions for `retention_days` back and three days ahead, as the server's upkeep keeps them."""
    from app.store.partitions import upkeep

    with engine.begin() as conn:
        upkeep(
            conn,
            now=datetime.now(UTC),
            raw_retention_days=retention_days,
            rollup_retention_days=400,
            ahead_days=3,
        )


def utc(t: int) -> datetime:
    """Epoch seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(t, UTC)


def create_inventory(engine: Engine, fleet: Fleet) -> None:
    """Instances, GPUs and slices as each agent's first batch makes them; a MIG layout change as the batch
    that shows it would; a spot interruption notice before each instance that is gone; last seen at its last
    sample."""
    from app.db import make_sessionmaker, session_scope
    from app.ingest.schemas import IngestBatchIn
    from app.store.inventory import insert_events, touch_instance, upsert_inventory

    step = timedelta(seconds=fleet.interval_s)
    with session_scope(make_sessionmaker(engine)) as session:
        for inst in fleet.instances:
            first = utc(fleet.start)
            batch = IngestBatchIn.model_validate(batch_dict(fleet, inst, fleet.start))
            result = upsert_inventory(session, batch, first=first, last=first + step)
            insert_events(session, result.events)
            if inst.reconfigured_at is not None:
                at = utc(inst.reconfigured_at)
                batch = IngestBatchIn.model_validate(batch_dict(fleet, inst, inst.reconfigured_at))
                insert_events(session, upsert_inventory(session, batch, first=at, last=at + step).events)
            if inst.gone_at is not None:
                notice = {
                    "ts": utc(inst.gone_at - 120),
                    "kind": "spot_interruption",
                    "instance_pk": result.instance_pk,
                    "device_id": None,
                    "details": {"action": "terminate", "time": utc(inst.gone_at).isoformat()},
                }
                insert_events(session, [notice])
            seen = utc(last_seen(inst, fleet.end, fleet.interval_s))
            touch_instance(session, result.instance_pk, first=first, last=seen, agent_errors={})


def device_ids(engine: Engine) -> dict[str, int]:
    """Device UUID -> id, of every GPU and MIG slice in the database."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT uuid, id FROM gpus UNION ALL SELECT uuid, id FROM mig_slices"))
        return {str(u): int(i) for u, i in rows}


def instance_pks(engine: Engine) -> dict[str, int]:
    """Instance id -> instances.id, of every instance in the database (what holders are stored under)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return {str(i): int(pk) for i, pk in conn.execute(text("SELECT instance_id, id FROM instances"))}


def store_made(session: Session, made: Made, mem_held_mib: int) -> float:
    """Write one span's samples, then its holders, in the session's transaction; returns the seconds the holders
    took (their statements run in one round trip, so this is what they cost)."""
    from app.store.holders import HolderRefs, HolderRow, store_holders
    from app.store.samples import write_samples

    write_samples(session, made.rows, mem_held_mib=mem_held_mib)
    if not made.holders:
        return 0.0
    t = time.perf_counter()
    holders = [HolderRow(slot, pk, *proc) for slot, pk, proc in made.holders]
    refs = HolderRefs(made.ref_ords, made.ref_slots, made.ref_used, made.ref_shares)
    store_holders(session, holders, refs)
    return time.perf_counter() - t


_worker: dict[str, Any] = {}


def _init_worker(url: str, params: dict[str, int], ids: dict[str, int], mem_held_mib: int, holders: bool) -> None:
    from app.db import make_engine, make_sessionmaker
    from app.store.bulk import quiet_bulk_loads

    # Millions of short-lived tuples and no cycles: the collector would only spend time looking.
    gc.disable()
    engine = make_engine(url, pool_size=1)
    quiet_bulk_loads(engine)
    _worker["maker"] = SampleMaker(make_fleet(**params), ids, instance_pks(engine) if holders else None)
    _worker["sessions"] = make_sessionmaker(engine)
    _worker["mem_held_mib"] = mem_held_mib


Span = tuple[int, int, float, float, float]
"""What one span's load did: (rows, holder references, generation s, write s, of which holders s)."""


def _load_span(span: tuple[int, int]) -> Span:
    """Generate and store one span (an hour) of the fleet's samples and holders."""
    from app.db import session_scope

    t = time.perf_counter()
    made = _worker["maker"].make(*span)
    t_made = time.perf_counter()
    with session_scope(_worker["sessions"]) as session:
        holders_s = store_made(session, made, _worker["mem_held_mib"])
    return len(made.rows), len(made.ref_ords), t_made - t, time.perf_counter() - t_made, holders_s


def hour_spans(t0: int, t1: int) -> list[tuple[int, int]]:
    spans = []
    t = t0
    while t < t1:
        nxt = min(t1, (t // HOUR + 1) * HOUR)
        spans.append((t, nxt))
        t = nxt
    return spans


def load_samples(
    url: str,
    fleet: Fleet,
    ids: dict[str, int],
    t0: int,
    t1: int,
    workers: int,
    mem_held_mib: int,
    *,
    holders: bool = True,
) -> tuple[int, int, float]:
    """Samples of [t0, t1) and their holders (unless `holders` is false), one hour per transaction, in worker
    processes; returns (rows, holder references, seconds)."""
    spans = hour_spans(t0, t1)
    log(f"loading {len(spans)} hours of samples with {workers} worker(s)")
    start = time.perf_counter()
    rows = refs = 0
    gen_s = write_s = holders_s = 0.0
    done = 0
    next_report = start + 30.0
    ctx = get_context("spawn")
    initargs = (url, fleet.params(), ids, mem_held_mib, holders)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=initargs) as pool:
        pending: set[Future[Span]] = set()
        todo = iter(spans)
        try:
            # A few spans queued per worker, so they are written in roughly time order.
            for span in todo:
                pending.add(pool.submit(_load_span, span))
                if len(pending) < 2 * workers:
                    continue
                finished, pending = wait(pending, return_when="FIRST_COMPLETED")
                for fut in finished:
                    n, r, g, w, h = fut.result()
                    rows, refs, gen_s, write_s, holders_s = rows + n, refs + r, gen_s + g, write_s + w, holders_s + h
                    done += 1
                now = time.perf_counter()
                if now >= next_report:
                    rate = rows / (now - start)
                    eta = (len(spans) - done) * (now - start) / max(done, 1)
                    log(
                        f"load: {done}/{len(spans)} hours, {rows:,} rows, {rate:,.0f} rows/s; per hour and worker "
                        f"{gen_s / done:.2f} s making rows, {write_s / done:.2f} s writing "
                        f"({holders_s / done:.2f} s of it holders); "
                        f"about {eta / 60:.0f} min left"
                    )
                    next_report = now + 30.0
            for fut in pending:
                n, r, g, w, h = fut.result()
                rows, refs, gen_s, write_s, holders_s = rows + n, refs + r, gen_s + g, write_s + w, holders_s + h
                done += 1
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    busy = max(gen_s + write_s, 1e-9)
    log(
        f"workers spent {gen_s / busy:.0%} of their time making rows, {write_s / busy:.0%} writing them "
        f"({holders_s / busy:.0%} writing holders)"
    )
    return rows, refs, time.perf_counter() - start


def top_up(engine: Engine, fleet: Fleet, ids: dict[str, int], t0: int, mem_held_mib: int) -> tuple[int, int]:
    """Samples and their holders from `t0` to the present, in this process, and instances seen up to their last
    sample; returns (rows, the new end in epoch s)."""
    from app.db import make_sessionmaker, session_scope
    from app.store.inventory import touch_instance

    step = fleet.interval_s
    t1 = int(time.time()) // step * step
    if t1 <= t0:
        return 0, t0
    pks = instance_pks(engine)
    maker = SampleMaker(fleet, ids, pks)
    sessions = make_sessionmaker(engine)
    rows = 0
    spans = hour_spans(t0, t1)
    if len(spans) > 2:
        log(f"topping up {(t1 - t0) / HOUR:.1f} hours of samples, from {utc(t0).isoformat()}")
    for span in spans:
        made = maker.make(*span)
        rows += len(made.rows)
        with session_scope(sessions) as session:
            store_made(session, made, mem_held_mib)
    with session_scope(sessions) as session:
        for inst in fleet.instances:
            seen = last_seen(inst, t1, step)
            if inst.instance_id in pks and seen > t0:
                touch_instance(session, pks[inst.instance_id], first=utc(fleet.start), last=utc(seen), agent_errors={})
    return rows, t1


def count_holders(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM holders").fetchone()
    return int(row[0]) if row else 0


def vacuum_analyze(url: str) -> float:
    t = time.perf_counter()
    with connect(url) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - t


def check_disk(where: Path, rows: int, devices: int, days: int) -> None:
    """Refuse a load that cannot fit: about 64 bytes per sample, 400 per rollup row, and WAL."""
    need = rows * 70 + devices * days * 24 * 400 + 4 * 2**30
    free = shutil.disk_usage(where).free
    log(f"disk: {free / 2**30:.1f} GiB free at {where}, load needs about {need / 2**30:.1f} GiB")
    if free < need:
        raise BenchError(f"not enough disk at {where}: {free / 2**30:.1f} GiB free, about {need / 2**30:.1f} needed")


def load_fleet(
    url: str,
    fleet: Fleet,
    *,
    disk: Path | None,
    workers: int,
    retention: int,
    mem_held_mib: int,
    holders: bool = True,
) -> dict[str, Any]:
    """Inventory and every sample of the fleet with its holders (none when `holders` is false: to measure what
    they cost), then VACUUM ANALYZE; returns the load figures. `disk` is where the database's files are, when on
    this machine (the load is refused if it cannot fit)."""
    from app.db import make_engine

    counts = fleet.counts
    expect = counts["devices"] * fleet.days * DAY // fleet.interval_s
    log(
        f"fleet: {counts['instances']} instances, {counts['gpus']} GPUs ({counts['mig_gpus']} in MIG mode), "
        f"{counts['slices']} MIG slices ({counts['retired_slices']} retired by a reconfiguration), "
        f"about {expect:,} samples over {fleet.days} days"
    )
    if disk is not None:
        check_disk(disk, expect, counts["devices"], fleet.days)
    engine = make_engine(url, pool_size=1)
    try:
        ensure_partitions(engine, retention)
        t = time.perf_counter()
        create_inventory(engine, fleet)
        inventory_s = time.perf_counter() - t
        ids = device_ids(engine)
    finally:
        engine.dispose()
    log(f"inventory made in {inventory_s:.1f} s")
    rows, refs, load_s = load_samples(url, fleet, ids, fleet.start, fleet.end, workers, mem_held_mib, holders=holders)
    log(f"loaded {rows:,} rows ({refs:,} holder references) in {load_s:.0f} s = {rows / load_s:,.0f} rows/s")
    log("VACUUM ANALYZE")
    vacuum_s = vacuum_analyze(url)
    size = database_size_mib(url)
    log(f"VACUUM ANALYZE took {vacuum_s:.0f} s; database {size:,.0f} MiB")
    return {
        **{k: counts[k] for k in ("instances", "gpus", "mig_gpus", "slices", "devices")},
        "rows": rows,
        "holder_refs": refs,
        "holders": count_holders(url),
        "load_s": round(load_s, 1),
        "rows_per_s": round(rows / load_s),
        "inventory_s": round(inventory_s, 1),
        "vacuum_s": round(vacuum_s, 1),
        "load_workers": workers,
        "db_size_mib_after_load": size,
    }
