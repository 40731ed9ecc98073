"""Dashboard benchmark: a synthetic fleet (bench/fleet.py) loaded through the bulk write path, then every page and
its htmx fragment timed through a real `gpufleet serve`.

    .venv/bin/python -m bench.pages [--instances 300] [--days 14] [--interval-s 30] [--runs 30]
        [--data-dir DIR --keep] [--database-url URL] [--skip-load] [--load-workers 2]

Loading: instances, GPUs and MIG slices go in through `upsert_inventory` (as the first batch of each agent
would put them, then again where a MIG layout changes), samples through `write_samples` (COPY into the
staging table, then into `samples` and the hourly rollups), one UTC hour of the whole fleet per transaction,
in time order as agents' batches would arrive. Then VACUUM ANALYZE, so autovacuum does not run during the
timing. With `--data-dir DIR --keep` the loaded database stays; a later run with the same parameters finds it
(the parameters are kept in the table `bench_fleet`), skips the load and only adds the samples of the time
since, so the pages show a fleet that is up to date. Without `--data-dir` the embedded PostgreSQL lives in a
temporary folder; `--database-url` names a PostgreSQL server instead, where the database `gpufleet_bench_pages`
is used (created if missing; dropped at the end if this run created it and `--keep` is not given).

Timing: 3 untimed requests, then `--runs` sequential ones per URL, each page once as a full page and once as
its htmx fragment (`HX-Request: true`). A page that does not exist yet answers 404: its status is recorded and
the run goes on. Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import http.client
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from app.store.bulk import quiet_bulk_loads
from bench.fleet import DAY, HOUR, Fleet, SampleMaker, batch_dict, last_seen, make_fleet
from bench.ingest import (
    BenchError,
    free_port,
    libpq_url,
    log,
    percentile,
    run_and_report,
    server_log_problems,
    start_server,
    stop_server,
    wait_ready,
)

DATABASE = "gpufleet_bench_pages"
META_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_fleet (id int PRIMARY KEY CHECK (id = 1), params jsonb NOT NULL, "
    "loaded_until bigint NOT NULL, figures jsonb NOT NULL)"
)
WARMUP = 3


def parse_args(argv: list[str] | None, description: str | None = __doc__) -> argparse.Namespace:
    """The fleet's, the database's and the timing's options; bench/report.py takes the same ones."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=300, help="instances in the fleet (default 300)")
    p.add_argument("--days", type=int, default=14, help="days of samples (default 14)")
    p.add_argument("--interval-s", type=int, default=30, help="collection interval, s; divides an hour (default 30)")
    p.add_argument("--seed", type=int, default=None, help="fleet seed (default: bench/fleet.py's)")
    p.add_argument("--runs", type=int, default=30, help="timed requests per URL (default 30)")
    p.add_argument("--database-url", help="PostgreSQL server to use (database gpufleet_bench_pages); default: embedded")
    p.add_argument("--data-dir", type=Path, help="folder of the embedded PostgreSQL (default: a temporary one)")
    p.add_argument(
        "--keep", action="store_true", help="keep a database this run made (data folder, or external database)"
    )
    p.add_argument("--skip-load", action="store_true", help="write no samples: time the pages on what is there")
    p.add_argument("--load-workers", type=int, default=2, help="processes generating and writing samples")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    args = p.parse_args(argv)
    if args.instances < 1 or args.days < 1 or args.runs < 1 or args.load_workers < 1 or args.workers < 1:
        p.error("--instances, --days, --runs, --load-workers and --workers must be positive")
    if args.interval_s < 1 or HOUR % args.interval_s:
        p.error("--interval-s must divide 3600")
    return args


# --------------------------------------------------------------------------------------------------------------
# The database


@dataclass
class Database:
    url: str
    where: str  # embedded or external
    disk: Path | None  # where its files are, when on this machine


def open_database(args: argparse.Namespace, stack: contextlib.ExitStack) -> Database:
    if args.database_url:
        admin = libpq_url(args.database_url)
        with psycopg.connect(admin, autocommit=True) as conn:
            created = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None
            if created:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        if created and not args.keep:

            def drop() -> None:
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
                log(f"dropped database {DATABASE}")

            stack.callback(_quiet("drop bench database", drop))
        log(f"database {DATABASE} on {make_url(admin).host or 'local socket'} ({'created' if created else 'found'})")
        url = make_url(admin).set(database=DATABASE).render_as_string(hide_password=False)
        return Database(url, "external", None)

    from app.embedded import EmbeddedPostgres

    data_dir = args.data_dir.resolve() if args.data_dir else Path(tempfile.mkdtemp(prefix="gpufleet-bench-pages-"))
    if not args.keep and not (data_dir / "pgdata").exists():
        # Made by this run and not to be kept; a database an earlier run kept stays.
        made = data_dir / "pgdata" if args.data_dir else data_dir
        stack.callback(_quiet("remove the database files", lambda: shutil.rmtree(made, ignore_errors=True)))
    else:
        log(f"the database stays in {data_dir}")
    embedded = EmbeddedPostgres(data_dir)
    stack.callback(_quiet("stop embedded PostgreSQL", embedded.stop))
    log(f"starting embedded PostgreSQL in {embedded.pgdata}")
    return Database(embedded.start(), "embedded", data_dir)


def read_meta(url: str) -> dict[str, Any] | None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('bench_fleet')").fetchone() in (None, (None,)):
            return None
        row = conn.execute("SELECT params, loaded_until, figures FROM bench_fleet").fetchone()
    if row is None:
        return None
    return {"params": row[0], "loaded_until": int(row[1]), "figures": row[2]}


def write_meta(url: str, params: dict[str, int], loaded_until: int, figures: dict[str, Any] | None) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(META_DDL)
        if figures is None:
            conn.execute("UPDATE bench_fleet SET loaded_until = %s", (loaded_until,))
            return
        conn.execute(
            "INSERT INTO bench_fleet (id, params, loaded_until, figures) VALUES (1, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET params = excluded.params, loaded_until = excluded.loaded_until, "
            "figures = excluded.figures",
            (json.dumps(params), loaded_until, json.dumps(figures)),
        )


def wipe(url: str) -> None:
    """Everything in the database goes: a fleet of other parameters, or a load that did not finish."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


def has_data(url: str) -> bool:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('instances')").fetchone() in (None, (None,)):
            return False
        return conn.execute("SELECT EXISTS (SELECT 1 FROM instances)").fetchone() == (True,)


def db_size_mib(url: str) -> float:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return round(int(row[0]) / 2**20, 1) if row else 0.0


def ensure_partitions(engine: Engine, retention_days: int) -> None:
    from app.store.partitions import upkeep

    with engine.begin() as conn:
        upkeep(
            conn,
            now=datetime.now(UTC),
            raw_retention_days=retention_days,
            rollup_retention_days=400,
            ahead_days=3,
        )


# --------------------------------------------------------------------------------------------------------------
# Loading


def _utc(t: int) -> datetime:
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
            first = _utc(fleet.start)
            batch = IngestBatchIn.model_validate(batch_dict(fleet, inst, fleet.start))
            result = upsert_inventory(session, batch, first=first, last=first + step)
            insert_events(session, result.events)
            if inst.reconfigured_at is not None:
                at = _utc(inst.reconfigured_at)
                batch = IngestBatchIn.model_validate(batch_dict(fleet, inst, inst.reconfigured_at))
                insert_events(session, upsert_inventory(session, batch, first=at, last=at + step).events)
            if inst.gone_at is not None:
                notice = {
                    "ts": _utc(inst.gone_at - 120),
                    "kind": "spot_interruption",
                    "instance_pk": result.instance_pk,
                    "device_id": None,
                    "details": {"action": "terminate", "time": _utc(inst.gone_at).isoformat()},
                }
                insert_events(session, [notice])
            seen = _utc(last_seen(inst, fleet.end, fleet.interval_s))
            touch_instance(session, result.instance_pk, first=first, last=seen, agent_errors={})


def device_ids(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT uuid, id FROM gpus UNION ALL SELECT uuid, id FROM mig_slices"))
        return {str(u): int(i) for u, i in rows}


_worker: dict[str, Any] = {}


def _init_worker(url: str, params: dict[str, int], ids: dict[str, int], mem_held_mib: int) -> None:
    from app.db import make_engine, make_sessionmaker

    # Millions of short-lived tuples and no cycles: the collector would only spend time looking.
    gc.disable()
    engine = make_engine(url, pool_size=1)
    quiet_bulk_loads(engine)
    _worker["maker"] = SampleMaker(make_fleet(**params), ids)
    _worker["sessions"] = make_sessionmaker(engine)
    _worker["mem_held_mib"] = mem_held_mib


def _load_span(span: tuple[int, int]) -> tuple[int, float, float]:
    """Generate and store one span (an hour) of the fleet's samples: (rows, generation s, write s)."""
    from app.db import session_scope
    from app.store.samples import write_samples

    t = time.perf_counter()
    rows = _worker["maker"].rows(*span)
    made = time.perf_counter()
    with session_scope(_worker["sessions"]) as session:
        write_samples(session, rows, mem_held_mib=_worker["mem_held_mib"])
    return len(rows), made - t, time.perf_counter() - made


def hour_spans(t0: int, t1: int) -> list[tuple[int, int]]:
    spans = []
    t = t0
    while t < t1:
        nxt = min(t1, (t // HOUR + 1) * HOUR)
        spans.append((t, nxt))
        t = nxt
    return spans


def load_samples(
    url: str, fleet: Fleet, ids: dict[str, int], t0: int, t1: int, workers: int, mem_held_mib: int
) -> tuple[int, float]:
    """Samples of [t0, t1), one hour per transaction, in worker processes; returns (rows, seconds)."""
    spans = hour_spans(t0, t1)
    log(f"loading {len(spans)} hours of samples with {workers} worker(s)")
    start = time.perf_counter()
    rows = 0
    gen_s = write_s = 0.0
    done = 0
    next_report = start + 30.0
    ctx = get_context("spawn")
    initargs = (url, fleet.params(), ids, mem_held_mib)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=initargs) as pool:
        pending: set[Future[tuple[int, float, float]]] = set()
        todo = iter(spans)
        try:
            # A few spans queued per worker, so they are written in roughly time order.
            for span in todo:
                pending.add(pool.submit(_load_span, span))
                if len(pending) < 2 * workers:
                    continue
                finished, pending = wait(pending, return_when="FIRST_COMPLETED")
                for fut in finished:
                    n, g, w = fut.result()
                    rows, gen_s, write_s, done = rows + n, gen_s + g, write_s + w, done + 1
                now = time.perf_counter()
                if now >= next_report:
                    rate = rows / (now - start)
                    eta = (len(spans) - done) * (now - start) / max(done, 1)
                    log(
                        f"load: {done}/{len(spans)} hours, {rows:,} rows, {rate:,.0f} rows/s; per hour and worker "
                        f"{gen_s / done:.2f} s making rows, {write_s / done:.2f} s writing; "
                        f"about {eta / 60:.0f} min left"
                    )
                    next_report = now + 30.0
            for fut in pending:
                n, g, w = fut.result()
                rows, gen_s, write_s, done = rows + n, gen_s + g, write_s + w, done + 1
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    busy = max(gen_s + write_s, 1e-9)
    log(f"workers spent {gen_s / busy:.0%} of their time making rows, {write_s / busy:.0%} writing them")
    return rows, time.perf_counter() - start


def top_up(engine: Engine, url: str, fleet: Fleet, ids: dict[str, int], t0: int, mem_held_mib: int) -> tuple[int, int]:
    """Samples from `t0` to the present, in this process, and instances seen up to their last sample;
    returns (rows, new end)."""
    from app.db import make_sessionmaker, session_scope
    from app.store.inventory import touch_instance
    from app.store.samples import write_samples

    step = fleet.interval_s
    t1 = int(time.time()) // step * step
    if t1 <= t0:
        return 0, t0
    maker = SampleMaker(fleet, ids)
    sessions = make_sessionmaker(engine)
    rows = 0
    spans = hour_spans(t0, t1)
    if len(spans) > 2:
        log(f"topping up {(t1 - t0) / HOUR:.1f} hours of samples, from {_utc(t0).isoformat()}")
    for span in spans:
        chunk = maker.rows(*span)
        rows += len(chunk)
        with session_scope(sessions) as session:
            write_samples(session, chunk, mem_held_mib=mem_held_mib)
    with session_scope(sessions) as session:
        pks = {str(i): int(pk) for i, pk in session.execute(text("SELECT instance_id, id FROM instances"))}
        for inst in fleet.instances:
            seen = last_seen(inst, t1, step)
            if inst.instance_id in pks and seen > t0:
                touch_instance(
                    session, pks[inst.instance_id], first=_utc(fleet.start), last=_utc(seen), agent_errors={}
                )
    write_meta(url, fleet.params(), t1, None)
    return rows, t1


def vacuum_analyze(url: str) -> float:
    t = time.perf_counter()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - t


def check_disk(where: Path, rows: int, devices: int, days: int) -> None:
    """Refuse a load that cannot fit: about 64 bytes per sample, 400 per rollup row, and WAL."""
    need = rows * 70 + devices * days * 24 * 400 + 4 * 2**30
    free = shutil.disk_usage(where).free
    log(f"disk: {free / 2**30:.1f} GiB free at {where}, load needs about {need / 2**30:.1f} GiB")
    if free < need:
        raise BenchError(f"not enough disk at {where}: {free / 2**30:.1f} GiB free, about {need / 2**30:.1f} needed")


# --------------------------------------------------------------------------------------------------------------
# Timing the pages


def page_urls(instance_id: str | None) -> list[str]:
    urls = [
        "/?window=24h",
        "/?window=30d",
        "/gpus/idle?window=24h",
        "/mig?window=24h",
        "/waste?window=24h",
        "/waste?group_by=tag:team&window=24h",
        "/instances?window=24h",
    ]
    if instance_id:
        urls.append(f"/instances/{instance_id}?window=24h")
    return urls


def pick_instance(fleet: Fleet | None, url: str) -> str | None:
    """The busiest page of one instance: an 8-GPU host with MIG GPUs, one reconfigured if there is one."""
    if fleet is not None:
        mig = [i for i in fleet.instances if any(g.mig for g in i.gpus) and i.gone_at is None]
        best = [i for i in mig if i.reconfigured_at is not None] or mig or list(fleet.instances)
        return best[0].instance_id if best else None
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SELECT instance_id FROM instances ORDER BY last_seen DESC LIMIT 1").fetchone()
    return str(row[0]) if row else None


class Client:
    """Sequential GETs with a bearer token over one kept-alive connection, as a script would send them."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.auth = {"Authorization": f"Bearer {token}"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
        """Status, body and seconds until the whole answer was read."""
        for attempt in range(2):
            t = time.perf_counter()
            try:
                self.conn.request("GET", path, headers={**(headers or {}), **self.auth})
                response = self.conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                if attempt:
                    raise
                continue
            return response.status, body, time.perf_counter() - t
        raise BenchError(f"GET {path}: no answer")

    def close(self) -> None:
        self.conn.close()


def make_read_token(db_url: str, name: str) -> str:
    """A token of scope read, made in the database: the dashboard and the report need a reader."""
    from app.auth import create_token
    from app.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(db_url, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            _token, secret = create_token(session, name=name, scope="read")
    finally:
        engine.dispose()
    log(f"made the token {name} with scope read for the requests")
    return secret


def time_url(client: Client, path: str, headers: dict[str, str], runs: int) -> dict[str, Any]:
    for _ in range(WARMUP):
        client.get(path, headers)
    times: list[float] = []
    statuses: Counter[int] = Counter()
    size = 0
    for _ in range(runs):
        status, body, took = client.get(path, headers)
        size = len(body)
        times.append(took * 1000.0)
        statuses[status] += 1
    times.sort()
    status = statuses.most_common(1)[0][0]
    if len(statuses) > 1:
        log(f"WARNING: {path} answered {dict(statuses)}")
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(percentile(times, 0.95), 2),
        "bytes": size,
        "status": status,
    }


# --------------------------------------------------------------------------------------------------------------
# The run


def first_traceback(path: Path, limit: int = 40) -> str:
    """The first traceback of the server log, to tell why a page answered 500."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if start is None:
        return ""
    block: list[str] = []
    for line in lines[start : start + limit]:
        block.append(line)
        if len(block) > 1 and line and not line[0].isspace() and not line.startswith(("Traceback", "During", "The ")):
            break
    return "\n".join(block)


def _quiet(what: str, fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as exc:
            log(f"cleanup: {what} failed: {exc}")

    return run


def load_fleet(db: Database, fleet: Fleet, workers: int, retention: int, mem_held_mib: int) -> dict[str, Any]:
    """Inventory and every sample of the fleet, then VACUUM ANALYZE; returns the load figures."""
    from app.db import make_engine

    counts = fleet.counts
    expect = counts["devices"] * fleet.days * DAY // fleet.interval_s
    log(
        f"fleet: {counts['instances']} instances, {counts['gpus']} GPUs ({counts['mig_gpus']} in MIG mode), "
        f"{counts['slices']} MIG slices ({counts['retired_slices']} retired by a reconfiguration), "
        f"about {expect:,} samples over {fleet.days} days"
    )
    if db.disk is not None:
        check_disk(db.disk, expect, counts["devices"], fleet.days)
    engine = make_engine(db.url, pool_size=1)
    try:
        ensure_partitions(engine, retention)
        t = time.perf_counter()
        create_inventory(engine, fleet)
        inventory_s = time.perf_counter() - t
        ids = device_ids(engine)
    finally:
        engine.dispose()
    log(f"inventory made in {inventory_s:.1f} s")
    rows, load_s = load_samples(db.url, fleet, ids, fleet.start, fleet.end, workers, mem_held_mib)
    log(f"loaded {rows:,} rows in {load_s:.0f} s = {rows / load_s:,.0f} rows/s")
    log("VACUUM ANALYZE")
    vacuum_s = vacuum_analyze(db.url)
    size = db_size_mib(db.url)
    log(f"VACUUM ANALYZE took {vacuum_s:.0f} s; database {size:,.0f} MiB")
    return {
        **{k: counts[k] for k in ("instances", "gpus", "mig_gpus", "slices", "devices")},
        "rows": rows,
        "load_s": round(load_s, 1),
        "rows_per_s": round(rows / load_s),
        "inventory_s": round(inventory_s, 1),
        "vacuum_s": round(vacuum_s, 1),
        "load_workers": workers,
        "db_size_mib_after_load": size,
    }


@dataclass
class Prepared:
    """The database with the fleet loaded (or found), kept up to the present by `refresh`."""

    db: Database
    fleet: Fleet | None
    figures: dict[str, Any]
    reused: bool
    retention: int
    """Raw retention, days, for the server: long enough to keep every day of the fleet."""
    engine: Engine
    ids: dict[str, int]
    mem_held_mib: int
    skip_load: bool
    topped: int = 0
    """Sample rows added since the load, to bring the fleet up to the present."""

    def refresh(self) -> None:
        if self.fleet is None or self.skip_load:
            return
        current = read_meta(self.db.url)
        assert current is not None
        ensure_partitions(self.engine, self.retention)
        n, _end = top_up(self.engine, self.db.url, self.fleet, self.ids, current["loaded_until"], self.mem_held_mib)
        self.topped += n


def prepare(args: argparse.Namespace, stack: contextlib.ExitStack) -> Prepared:
    """Open the database, load the fleet unless the database already holds it, and top it up to now."""
    from app.db import make_engine
    from app.migrate import head_revision, upgrade
    from app.settings import Settings

    db = open_database(args, stack)
    url = db.url
    wanted: dict[str, int] = {"instances": args.instances, "days": args.days, "interval_s": args.interval_s}
    if args.seed is not None:
        wanted["seed"] = args.seed
    retention = max(14, args.days + 1)
    mem_held_mib = Settings().mem_held_mib
    schema = head_revision()
    meta = read_meta(url)
    same = meta is not None and all(meta["params"].get(k) == v for k, v in wanted.items())
    if same and meta is not None and meta["figures"].get("schema") != schema and not args.skip_load:
        log(f"the fleet was loaded under schema {meta['figures'].get('schema')}, the code is at {schema}: reloading")
        same = False
    fleet: Fleet | None = None
    figures: dict[str, Any] = {}
    if args.skip_load or same:
        if meta is not None:
            if not same:
                log(f"WARNING: the database holds a fleet of other parameters: {meta['params']}")
            fleet = make_fleet(**meta["params"])
            figures = dict(meta["figures"])
            log(f"found a loaded fleet: {meta['params']}, data up to {_utc(meta['loaded_until']).isoformat()}")
        else:
            log("WARNING: no loaded fleet in this database; timing on what is there")
        upgrade(url)
    else:
        if meta is not None or has_data(url):
            log("the database holds other data or an unfinished load: emptying it")
            wipe(url)
        upgrade(url)
        fleet = make_fleet(**wanted, end=int(time.time()) // args.interval_s * args.interval_s)
        figures = load_fleet(db, fleet, args.load_workers, retention, mem_held_mib)
        figures["schema"] = schema
        write_meta(url, fleet.params(), fleet.end, figures)
    reused = bool(figures) and (args.skip_load or same)
    if fleet is not None:
        retention = max(14, fleet.days + 1)

    engine = make_engine(url, pool_size=2)
    stack.callback(engine.dispose)
    ids = device_ids(engine) if fleet is not None else {}
    prepared = Prepared(db, fleet, figures, reused, retention, engine, ids, mem_held_mib, args.skip_load)
    if fleet is not None and not args.skip_load:
        t = time.perf_counter()
        prepared.refresh()
        log(f"topped up to the present: {prepared.topped:,} rows in {time.perf_counter() - t:.1f} s")
    return prepared


def serve(prepared: Prepared, workers: int, stack: contextlib.ExitStack) -> tuple[subprocess.Popen[bytes], int, Path]:
    """`gpufleet serve` on the prepared database, stopped when `stack` closes: (process, port, its log file)."""
    os.environ["GPUFLEET_RAW_RETENTION_DAYS"] = str(prepared.retention)
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-log-"))
    stack.callback(lambda: shutil.rmtree(log_dir, ignore_errors=True))
    log_path = log_dir / "server.log"
    proc = start_server(prepared.db.url, port, workers, log_path)
    stack.callback(_quiet("stop server", lambda: stop_server(proc)))
    wait_ready(proc, port, log_path)
    log(f"server ready on port {port}")
    return proc, port, log_path


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    prepared = prepare(args, stack)
    db, fleet, figures, url = prepared.db, prepared.fleet, prepared.figures, prepared.db.url
    refresh = prepared.refresh
    proc, port, log_path = serve(prepared, args.workers, stack)

    client = Client(port, make_read_token(url, f"bench-pages-{secrets.token_hex(4)}"))
    stack.callback(client.close)
    pages: dict[str, dict[str, Any]] = {}
    fragments: dict[str, dict[str, Any]] = {}
    for path in page_urls(pick_instance(fleet, url)):
        refresh()
        pages[path] = time_url(client, path, {}, args.runs)
        fragments[path] = time_url(client, path, {"HX-Request": "true"}, args.runs)
        log(
            f"{path}: page {pages[path]['status']} p50 {pages[path]['p50_ms']} ms p95 {pages[path]['p95_ms']} ms "
            f"{pages[path]['bytes']} B; fragment {fragments[path]['status']} p50 {fragments[path]['p50_ms']} ms "
            f"p95 {fragments[path]['p95_ms']} ms {fragments[path]['bytes']} B"
        )
    stop_server(proc)
    problems, lines = server_log_problems(log_path)
    for line in lines[:4]:
        log(f"server log: {line}")
    trace = first_traceback(log_path)
    if trace:
        log("first traceback in the server log:\n" + trace)

    day, month = pages.get("/?window=24h"), pages.get("/?window=30d")
    ratio = None
    if day and month and day["status"] == month["status"] == 200 and day["p50_ms"] > 0:
        ratio = round(month["p50_ms"] / day["p50_ms"], 3)
    ok = [v["p95_ms"] for v in (*pages.values(), *fragments.values()) if v["status"] == 200]
    load = {k: figures.get(k) for k in ("instances", "gpus", "mig_gpus", "slices", "devices", "rows")}
    load.update({k: figures.get(k) for k in ("load_s", "rows_per_s", "inventory_s", "vacuum_s", "load_workers")})
    end = read_meta(url)
    return {
        **load,
        "db_size_mib": db_size_mib(url),
        "reused": prepared.reused,
        "days": fleet.days if fleet else args.days,
        "interval_s": fleet.interval_s if fleet else args.interval_s,
        "data_until": _utc(end["loaded_until"]).isoformat() if end else None,
        "topup_rows": prepared.topped,
        "runs": args.runs,
        "pages": pages,
        "fragments": fragments,
        "overview_30d_over_1d": ratio,
        "pages_p95_max_ms": max(ok) if ok else None,
        "server_log_problems": problems,
        "database": db.where,
        "data_dir": str(db.disk) if db.disk else None,
    }


Run = Callable[[argparse.Namespace, contextlib.ExitStack], dict[str, Any]]


def readable(run: Run) -> Run:
    """`run`, with a database, HTTP or file error turned into one line for run_and_report to print."""
    from sqlalchemy.exc import SQLAlchemyError

    def wrapped(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
        try:
            return run(args, stack)
        except (psycopg.Error, SQLAlchemyError, OSError, http.client.HTTPException) as exc:
            message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            raise BenchError(f"{type(exc).__name__}: {message[0] if message else ''}") from exc

    return wrapped


def main(argv: list[str] | None = None) -> int:
    return run_and_report(readable(run), parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
