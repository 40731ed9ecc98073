"""Report benchmark: GET /api/v1/report timed through a real `gpufleet serve`, on the synthetic fleet of
bench/pages.py.

    .venv/bin/python -m bench.report [--instances 300] [--days 14] [--interval-s 30] [--runs 30]
        [--data-dir DIR --keep] [--database-url URL] [--skip-load] [--load-workers 2]

The fleet, its loading and these options are bench/pages.py's (imported, not copied): run with the same
`--data-dir DIR --keep` (or `--database-url`) and the same fleet parameters and both benchmarks share one
loaded database; a run finds the fleet the other kept and only tops it up to the present. 300 instances are
about 2,000 GPUs. The 30-day reports read 30 days only when the fleet has them: load it with `--days 30`.

Timing: for each window (24h, 7d, 30d), grouping (instance, instance_type, tag:team) and format (json, csv),
3 untimed requests, then `--runs` sequential ones over one kept-alive connection; a request's time runs until
its whole answer is read. The run makes its own read token in the database (revoked at the end), so it does
not depend on how the dashboard pages authenticate. Progress goes to stderr; the last line of stdout is one
JSON object: p50/p95 ms, bytes, rows and status per combination, and the 30-day report by instance against
its target (p95 under 300 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import statistics
import sys
import urllib.parse
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from bench.ingest import log, percentile, run_and_report, server_log_problems, stop_server
from bench.pages import (
    WARMUP,
    Client,
    _quiet,
    first_traceback,
    make_read_token,
    parse_args,
    prepare,
    read_meta,
    readable,
    serve,
)

WINDOWS = ("24h", "7d", "30d")
GROUPINGS = ("instance", "instance_type", "tag:team")
FORMATS = ("json", "csv")
TARGET = ("30d", "instance", "json")
TARGET_MS = 300.0


def revoke_token(url: str, name: str) -> None:
    from app.auth import revoke_token as revoke
    from app.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(url, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            revoke(session, name, now=datetime.now(UTC))
    finally:
        engine.dispose()


def _rows(status: int, body: bytes, fmt: str) -> int | None:
    """Groups in a report answer (the totals row not counted); None for an error."""
    if status != 200:
        return None
    if fmt == "csv":
        return max(0, body.count(b"\n") - 2)
    return len(json.loads(body)["rows"])


def _problem(body: bytes) -> str:
    try:
        answer = json.loads(body)
        return "; ".join(f"{d['field']}: {d['message']}" for d in answer["detail"]) or str(answer["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def time_report(reader: Client, window: str, by: str, fmt: str, runs: int) -> dict[str, Any]:
    path = "/api/v1/report?" + urllib.parse.urlencode({"window": window, "group_by": by, "format": fmt})
    status, body, _took = reader.get(path)
    if status != 200:
        log(f"WARNING: {path} answered {status}: {_problem(body)}")
    rows = _rows(status, body, fmt)
    for _ in range(WARMUP - 1):
        reader.get(path)
    times: list[float] = []
    statuses: Counter[int] = Counter()
    size = 0
    for _ in range(runs):
        status, body, took = reader.get(path)
        times.append(took * 1000.0)
        statuses[status] += 1
        size = len(body)
    times.sort()
    if len(statuses) > 1:
        log(f"WARNING: {path} answered {dict(statuses)}")
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(percentile(times, 0.95), 2),
        "bytes": size,
        "rows": rows,
        "status": statuses.most_common(1)[0][0],
    }


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    prepared = prepare(args, stack)
    url = prepared.db.url
    name = f"bench-report-{secrets.token_hex(4)}"
    secret = make_read_token(url, name)
    # Registered after the database's own cleanup, so it runs first: the database is still up.
    stack.callback(_quiet("revoke the bench token", lambda: revoke_token(url, name)))
    proc, port, log_path = serve(prepared, args.workers, stack)
    reader = Client(port, secret)
    stack.callback(reader.close)

    reports: dict[str, dict[str, Any]] = {}
    for window in WINDOWS:
        for by in GROUPINGS:
            prepared.refresh()
            for fmt in FORMATS:
                key = f"{window} {by} {fmt}"
                r = reports[key] = time_report(reader, window, by, fmt, args.runs)
                log(f"{key}: {r['status']} p50 {r['p50_ms']} ms p95 {r['p95_ms']} ms, {r['rows']} rows, {r['bytes']} B")
    stop_server(proc)
    problems, lines = server_log_problems(log_path)
    for line in lines[:4]:
        log(f"server log: {line}")
    trace = first_traceback(log_path)
    if trace:
        log("first traceback in the server log:\n" + trace)

    figures = prepared.figures
    fleet = prepared.fleet
    target = reports[" ".join(TARGET)]
    end = read_meta(url)
    return {
        **{k: figures.get(k) for k in ("instances", "gpus", "mig_gpus", "slices", "devices")},
        "reused": prepared.reused,
        "days": fleet.days if fleet else args.days,
        "interval_s": fleet.interval_s if fleet else args.interval_s,
        "data_until": datetime.fromtimestamp(end["loaded_until"], UTC).isoformat() if end else None,
        "topup_rows": prepared.topped,
        "runs": args.runs,
        "workers": args.workers,
        "reports": reports,
        "target": {
            "report": " ".join(TARGET),
            "p95_ms": target["p95_ms"],
            "limit_ms": TARGET_MS,
            "met": target["status"] == 200 and target["p95_ms"] < TARGET_MS,
        },
        "reports_p95_max_ms": max((r["p95_ms"] for r in reports.values() if r["status"] == 200), default=None),
        "server_log_problems": problems,
        "database": prepared.db.where,
        "data_dir": str(prepared.db.disk) if prepared.db.disk else None,
    }


def main(argv: list[str] | None = None) -> int:
    return run_and_report(readable(run), parse_args(argv, description=__doc__))


if __name__ == "__main__":
    sys.exit(main())
