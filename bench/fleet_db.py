"""The database of the dashboard and report benchmarks (bench/pages.py, bench/report.py): their shared options,
the fleet loaded into it or found there from an earlier run, kept up to the present, and the server on it.

With `--data-dir DIR --keep` the loaded database stays; a later run with the same parameters finds it (the
parameters are kept in the table `bench_fleet`), skips the load and only adds the samples of the time since. A
fleet loaded under another schema revision, or by code that made other data (`bench.fleet.SHAPE`), is reloaded.
Without `--data-dir` the embedded PostgreSQL lives in a temporary folder; `--database-url` names a PostgreSQL
server instead, where the database `gpufleet_bench_pages` is used (created if missing; dropped at the end if
this run created it and `--keep` is not given).

psycopg, SQLAlchemy and the app are imported by the functions that use them (see bench/harness.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.database import connect, libpq_url, server_name, with_database
from bench.fleet import HOUR, SHAPE, Fleet, make_fleet
from bench.fleet_bill import drop_bill, ensure_bill
from bench.fleet_load import device_ids, ensure_partitions, load_fleet, top_up, utc
from bench.harness import free_port, log, quiet, start_server, stop_server, wait_ready

if TYPE_CHECKING:
    from sqlalchemy import Engine

DATABASE = "gpufleet_bench_pages"
META_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_fleet (id int PRIMARY KEY CHECK (id = 1), params jsonb NOT NULL, "
    "loaded_until bigint NOT NULL, figures jsonb NOT NULL)"
)


def parse_args(argv: list[str] | None, description: str | None) -> argparse.Namespace:
    """The fleet's, the database's and the timing's options, the same for bench/pages.py and bench/report.py."""
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
    p.add_argument(
        "--bill",
        choices=("on", "off"),
        default="on",
        help="on (default): the fleet has a month of bill and spot price history (bench/fleet_bill.py), imported "
        "once; off: the billing tables are emptied and every hour is at the instance's own price",
    )
    p.add_argument(
        "--alert-rules",
        action="store_true",
        help="install bench/alerts.py's ten alert rules, so the server evaluates them every GPUFLEET_ALERTS_CHECK_S "
        "while it is timed (removed at the end with their incidents and messages)",
    )
    p.add_argument("--load-workers", type=int, default=2, help="processes generating and writing samples")
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SUBSTRING",
        help="time only the URLs (reports: the 'window grouping format' keys) holding SUBSTRING; repeatable",
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="PATH",
        help="an earlier run's output (its last JSON line counts): p95 against this run's, on stderr and in 'compare'",
    )
    args = p.parse_args(argv)
    if args.instances < 1 or args.days < 1 or args.runs < 1 or args.load_workers < 1 or args.workers < 1:
        p.error("--instances, --days, --runs, --load-workers and --workers must be positive")
    if args.interval_s < 1 or HOUR % args.interval_s:
        p.error("--interval-s must divide 3600")
    if args.compare is not None and not args.compare.is_file():
        p.error(f"--compare: no file {args.compare}")
    return args


# --------------------------------------------------------------------------------------------------------------
# The database and what a run keeps in it


@dataclass
class Database:
    url: str
    where: str
    """"embedded" or "external"."""
    disk: Path | None
    """Where its files are, when on this machine."""


def open_database(args: argparse.Namespace, stack: contextlib.ExitStack) -> Database:
    """The database of `--database-url` or `--data-dir` (or a temporary one); what this run made and is not to
    keep goes when `stack` closes."""
    if args.database_url:
        admin = libpq_url(args.database_url)
        with connect(admin) as conn:
            created = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None
            if created:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        if created and not args.keep:

            def drop() -> None:
                with connect(admin) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
                log(f"dropped database {DATABASE}")

            stack.callback(quiet("drop bench database", drop))
        log(f"database {DATABASE} on {server_name(admin)} ({'created' if created else 'found'})")
        url = with_database(admin, DATABASE)
        return Database(url, "external", None)

    from app.embedded import EmbeddedPostgres

    data_dir = args.data_dir.resolve() if args.data_dir else Path(tempfile.mkdtemp(prefix="gpufleet-bench-pages-"))
    if not args.keep and not (data_dir / "pgdata").exists():
        # Made by this run and not to be kept; a database an earlier run kept stays.
        made = data_dir / "pgdata" if args.data_dir else data_dir
        stack.callback(quiet("remove the database files", lambda: shutil.rmtree(made, ignore_errors=True)))
    else:
        log(f"the database stays in {data_dir}")
    embedded = EmbeddedPostgres(data_dir)
    stack.callback(quiet("stop embedded PostgreSQL", embedded.stop))
    log(f"starting embedded PostgreSQL in {embedded.pgdata}")
    return Database(embedded.start(), "embedded", data_dir)


def read_meta(url: str) -> dict[str, Any] | None:
    """What the run that loaded the fleet kept: its parameters, the end of its samples (epoch s), its figures."""
    with connect(url) as conn:
        if conn.execute("SELECT to_regclass('bench_fleet')").fetchone() in (None, (None,)):
            return None
        row = conn.execute("SELECT params, loaded_until, figures FROM bench_fleet").fetchone()
    if row is None:
        return None
    return {"params": row[0], "loaded_until": int(row[1]), "figures": row[2]}


def write_meta(url: str, params: dict[str, int], loaded_until: int, figures: dict[str, Any] | None) -> None:
    """Keep what `read_meta` reads; with no `figures`, only move the end of the samples."""
    with connect(url) as conn:
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
    with connect(url) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


def has_data(url: str) -> bool:
    with connect(url) as conn:
        if conn.execute("SELECT to_regclass('instances')").fetchone() in (None, (None,)):
            return False
        return conn.execute("SELECT EXISTS (SELECT 1 FROM instances)").fetchone() == (True,)


# --------------------------------------------------------------------------------------------------------------
# Preparing and serving


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
        """Add the samples of the time since the last load or refresh (nothing with --skip-load)."""
        if self.fleet is None or self.skip_load:
            return
        current = read_meta(self.db.url)
        assert current is not None
        ensure_partitions(self.engine, self.retention)
        n, end = top_up(self.engine, self.fleet, self.ids, current["loaded_until"], self.mem_held_mib)
        if end > current["loaded_until"]:
            write_meta(self.db.url, self.fleet.params(), end, None)
        self.topped += n

    def data_until(self) -> str | None:
        """The end of the fleet's samples, ISO 8601, if a loaded fleet is there."""
        meta = read_meta(self.db.url)
        return utc(meta["loaded_until"]).isoformat() if meta else None


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
    if same and meta is not None and meta["figures"].get("shape") != SHAPE and not args.skip_load:
        # An older fleet lacks what the bench times now (holders, for the report by user).
        log(f"the fleet was loaded in shape {meta['figures'].get('shape', 1)}, the code makes {SHAPE}: reloading")
        same = False
    fleet: Fleet | None = None
    figures: dict[str, Any] = {}
    if args.skip_load or same:
        if meta is not None:
            if not same:
                log(f"WARNING: the database holds a fleet of other parameters: {meta['params']}")
            fleet = make_fleet(**meta["params"])
            figures = dict(meta["figures"])
            log(f"found a loaded fleet: {meta['params']}, data up to {utc(meta['loaded_until']).isoformat()}")
        else:
            log("WARNING: no loaded fleet in this database; timing on what is there")
        upgrade(url)
    else:
        if meta is not None or has_data(url):
            log("the database holds other data or an unfinished load: emptying it")
            wipe(url)
        upgrade(url)
        fleet = make_fleet(**wanted, end=int(time.time()) // args.interval_s * args.interval_s)
        figures = load_fleet(
            url, fleet, disk=db.disk, workers=args.load_workers, retention=retention, mem_held_mib=mem_held_mib
        )
        figures["schema"] = schema
        figures["shape"] = SHAPE
        write_meta(url, fleet.params(), fleet.end, figures)
    reused = bool(figures) and (args.skip_load or same)
    if fleet is not None:
        retention = max(14, fleet.days + 1)

    if fleet is not None and args.bill == "on":
        figures |= ensure_bill(url, fleet)
    elif args.bill == "off":
        drop_bill(url)
        log("no bill: every hour at the instance's own price")
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
    stack.callback(quiet("stop server", lambda: stop_server(proc)))
    wait_ready(proc, port, log_path)
    log(f"server ready on port {port}")
    return proc, port, log_path
