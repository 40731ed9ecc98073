"""Report benchmark: GET /api/v1/report timed through a real `gpufleet serve`, on the synthetic fleet of
bench/pages.py.

    .venv/bin/python -m bench.report [--instances 300] [--days 14] [--interval-s 30] [--runs 30]
        [--data-dir DIR --keep] [--database-url URL] [--skip-load] [--load-workers 2] [--workers 1]
        [--only SUBSTRING ...] [--compare EARLIER_OUTPUT]
    (or .venv/bin/python bench/report.py with the same options)

The fleet, its loading and these options are bench/pages.py's (bench/fleet_db.py, shared): run with the same
`--data-dir DIR --keep` (or `--database-url`) and the same fleet parameters and both benchmarks share one
loaded database; a run finds the fleet the other kept and only tops it up to the present. 300 instances are
about 2,000 GPUs. The 30-day reports read 30 days only when the fleet has them: load it with `--days 30`.

Timing: for each window (24h, 7d, 30d), grouping (instance, instance_type, tag:team, and the holders' user and
namespace) and format (json, csv), 3 untimed requests, then `--runs` sequential ones over one kept-alive
connection; a request's time runs until its whole answer is read. A grouping the server refuses (400) is
recorded with its status and the run goes on. The run makes its own read token in the database (revoked at the
end), so it does not depend on how the dashboard pages authenticate. Progress goes to stderr; the last line of
stdout is one JSON object: p50/p95 ms, bytes, rows and status per combination, and the 30-day reports by
instance ("target") and by user ("targets", both) as JSON against their target (p95 under 300 ms). `--only`
times only the combinations whose key ("30d instance json") holds one of its substrings; `--compare` holds the
p95s against an earlier run's, as bench/pages.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
import urllib.parse
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import against, last_json
from bench.database import make_read_token, revoke_token
from bench.fleet_db import parse_args, prepare, serve
from bench.harness import (
    WARMUP,
    BenchError,
    Client,
    log,
    log_server_problems,
    quiet,
    readable,
    run_and_report,
    stop_server,
    time_get,
)

WINDOWS = ("24h", "7d", "30d")
GROUPINGS = ("instance", "instance_type", "tag:team", "user", "namespace")
FORMATS = ("json", "csv")
TARGETS = (("30d", "instance", "json"), ("30d", "user", "json"))
"""The reports held against TARGET_MS: the first is the result line's "target", all are in "targets"."""
TARGET_MS = 300.0


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
    first = reader.get(path)
    if first.status != 200:
        log(f"WARNING: {path} answered {first.status}: {_problem(first.body)}")
    timing = time_get(reader, path, runs=runs, warmup=WARMUP - 1)
    return {**timing.figures(), "rows": _rows(first.status, first.body, fmt)}


def target_check(reports: dict[str, dict[str, Any]], key: tuple[str, str, str]) -> dict[str, Any]:
    """One report against TARGET_MS: met when it answered 200 with a p95 under it."""
    timed = reports.get(" ".join(key))
    return {
        "report": " ".join(key),
        "status": timed["status"] if timed else None,
        "p95_ms": timed["p95_ms"] if timed else None,
        "limit_ms": TARGET_MS,
        "met": timed is not None and timed["status"] == 200 and timed["p95_ms"] < TARGET_MS,
    }


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    earlier = last_json(args.compare) if args.compare else None  # a bad file fails now, not after the load
    keys = [f"{window} {by} {fmt}" for window in WINDOWS for by in GROUPINGS for fmt in FORMATS]
    if args.only and not any(s in key for key in keys for s in args.only):
        raise BenchError(f"no report key ('window grouping format') holds any of {args.only}")
    prepared = prepare(args, stack)
    url = prepared.db.url
    name = f"bench-report-{secrets.token_hex(4)}"
    secret = make_read_token(url, name)
    # Registered after the database's own cleanup, so it runs first: the database is still up.
    stack.callback(quiet("revoke the bench token", lambda: revoke_token(url, name)))
    proc, port, log_path = serve(prepared, args.workers, stack)
    reader = Client(port, secret)
    stack.callback(reader.close)

    reports: dict[str, dict[str, Any]] = {}
    for window in WINDOWS:
        for by in GROUPINGS:
            keys = [f"{window} {by} {fmt}" for fmt in FORMATS]
            if args.only and not any(s in key for key in keys for s in args.only):
                continue
            prepared.refresh()
            for fmt, key in zip(FORMATS, keys, strict=True):
                if args.only and not any(s in key for s in args.only):
                    continue
                r = reports[key] = time_report(reader, window, by, fmt, args.runs)
                log(f"{key}: {r['status']} p50 {r['p50_ms']} ms p95 {r['p95_ms']} ms, {r['rows']} rows, {r['bytes']} B")
    stop_server(proc)
    problems = log_server_problems(log_path)

    figures = prepared.figures
    fleet = prepared.fleet
    targets = [target_check(reports, key) for key in TARGETS]
    result: dict[str, Any] = {
        **{k: figures.get(k) for k in ("instances", "gpus", "mig_gpus", "slices", "devices")},
        "reused": prepared.reused,
        "days": fleet.days if fleet else args.days,
        "interval_s": fleet.interval_s if fleet else args.interval_s,
        "data_until": prepared.data_until(),
        "topup_rows": prepared.topped,
        "runs": args.runs,
        "workers": args.workers,
        "only": args.only,
        "reports": reports,
        "target": targets[0],
        "targets": targets,
        "reports_p95_max_ms": max((r["p95_ms"] for r in reports.values() if r["status"] == 200), default=None),
        "server_log_problems": problems,
        "database": prepared.db.where,
        "data_dir": str(prepared.db.disk) if prepared.db.disk else None,
    }
    if earlier is not None:
        result["compare"] = against(args.compare, earlier, result)
    return result


def main(argv: list[str] | None = None) -> int:
    return run_and_report(readable(run), parse_args(argv, description=__doc__))


if __name__ == "__main__":
    sys.exit(main())
