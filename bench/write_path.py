"""Write-path benchmark: `write_samples` alone, in a loop, on batches like an agent's (36 devices: 4 whole GPUs and 4
in MIG mode with 7 slices each; 6 intervals of about 10 s per batch, in order, each after the last, starts and
lengths off by a few milliseconds as an agent's are), against a fresh database on a real PostgreSQL server.

    .venv/bin/python -m bench.write_path [--database-url URL] [--batches 400] [--devices 36] [--intervals 6]
    (or .venv/bin/python bench/write_path.py with the same options)

Times the call itself (COPY and the one round trip) and, separately, the commit; reads this process's CPU time in
the call, and the database backend's CPU time from /proc where the server runs on this machine. Progress goes to
stderr; the last line of stdout is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from app.store.samples import StageRow

WARMUP = 20
FLEETS = 8


def backend_cpu_s(pid: int) -> float | None:
    """User + system CPU of one local PostgreSQL backend, s; None where /proc does not show it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--devices", type=int, default=36)
    parser.add_argument("--intervals", type=int, default=6)
    args = parser.parse_args(argv)
    import psycopg
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    import app
    from app.db import make_engine, make_sessionmaker
    from app.migrate import upgrade
    from app.store.partitions import create_day
    from app.store.samples import write_samples

    print(f"bench: code from {Path(app.__file__).parent}", file=sys.stderr)

    admin = make_url(args.database_url).set(drivername="postgresql")
    name = f"gpufleet_bench_{secrets.token_hex(4)}"
    admin_url = admin.render_as_string(hide_password=False)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url, pool_size=1)
    try:
        upgrade(url)
        start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)
        with engine.begin() as db:
            for d in range(-1, 2):
                create_day(db, (start + timedelta(days=d)).date())
        sessions = make_sessionmaker(engine)
        rng = random.Random(1)
        clocks = [start + timedelta(seconds=rng.uniform(0, 5)) for _ in range(FLEETS)]

        def next_batch(fleet: int) -> list[StageRow]:
            rows: list[StageRow] = []
            t = clocks[fleet]
            for _ in range(args.intervals):
                dur = 10.0 + rng.uniform(-0.004, 0.004)
                for d in range(args.devices):
                    util = rng.choice([0.0, 0.0, 3.0, 40.0, 97.0])
                    rows.append(
                        (t, 1000 * (fleet + 1) + d, dur, 2048, util, None, 180, 45, 1, 1, None, None, None, None)
                    )
                t += timedelta(seconds=dur + rng.uniform(-0.003, 0.003))
            clocks[fleet] = t
            return rows

        write_ms: list[float] = []
        client_cpu_s = 0.0
        commit_ms: list[float] = []
        checked = 0
        cpu_start: float | None = None
        pid = 0
        for n in range(WARMUP + args.batches):
            rows = next_batch(n % FLEETS)
            session = sessions()
            try:
                session.begin()
                if n == WARMUP:
                    pid = int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())
                    cpu_start = backend_cpu_s(pid)
                c0 = time.process_time()
                t0 = time.perf_counter()
                written = write_samples(session, rows, mem_held_mib=256)
                t1 = time.perf_counter()
                c1 = time.process_time()
                session.commit()
                t2 = time.perf_counter()
            finally:
                session.close()
            if n >= WARMUP:
                write_ms.append((t1 - t0) * 1000)
                commit_ms.append((t2 - t1) * 1000)
                client_cpu_s += c1 - c0
                checked += getattr(written, "checked", 0)
        cpu_end = backend_cpu_s(pid) if cpu_start is not None else None
        samples = args.batches * args.devices * args.intervals
        result: dict[str, Any] = {
            "code": str(Path(app.__file__).parent.parent),
            "batches": args.batches,
            "rows_per_batch": args.devices * args.intervals,
            "write_ms_median": round(statistics.median(write_ms), 3),
            "write_ms_p10": round(statistics.quantiles(write_ms, n=10)[0], 3),
            "write_ms_p90": round(statistics.quantiles(write_ms, n=10)[-1], 3),
            "commit_ms_median": round(statistics.median(commit_ms), 3),
            "db_cpu_us_per_sample": None
            if cpu_start is None or cpu_end is None
            else round((cpu_end - cpu_start) * 1e6 / samples, 2),
            "client_cpu_us_per_sample": round(client_cpu_s * 1e6 / samples, 2),
            "rows_checked": checked,
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(result))
    finally:
        engine.dispose()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
