"""Dashboard benchmark: a synthetic fleet (bench/fleet.py) loaded through the bulk write path, then every page
timed through a real `gpufleet serve`: as a full page, as its htmx fragment and as JSON.

    .venv/bin/python -m bench.pages [--instances 300] [--days 14] [--interval-s 30] [--runs 30]
        [--data-dir DIR --keep] [--database-url URL] [--skip-load] [--load-workers 2] [--workers 1]
        [--only SUBSTRING ...] [--compare EARLIER_OUTPUT] [--alert-rules]
    (or .venv/bin/python bench/pages.py with the same options)

Loading (bench/fleet_load.py): inventory as agents' first batches make it, samples through `write_samples`, one
UTC hour of the whole fleet per transaction, then VACUUM ANALYZE. With `--data-dir DIR --keep` (or
`--database-url`) the loaded database stays for the next run, which only adds the samples of the time since
(bench/fleet_db.py).

`--alert-rules` installs bench/alerts.py's ten alert rules first, so the server evaluates them every
GPUFLEET_ALERTS_CHECK_S (60 s) while the pages are timed, as a server with rules does.

Timing: for each URL, 3 untimed requests, then `--runs` sequential ones, three ways: the full page, its htmx
fragment (`HX-Request: true`) and its figures as JSON (`Accept: application/json`; the answer's Content-Type
must start with application/json). `--only` times only the URLs holding one of its substrings. A page that
does not exist yet answers 404: its status is recorded and the run goes on.

Progress goes to stderr; the last line of stdout is one JSON object: per URL and way ("pages", "fragments",
"json") p50/p95 ms, status, bytes and Content-Type, and "checks": the slowest p95, the new pages' p95 (any
way) against the 24-hour overview's full page, the 30-day overview against the 24-hour one, and whether every
URL answered 200 in every way with a p95 under 150 ms. `--compare` reads an earlier run's output (older
versions' too, which timed pages and fragments only), prints old and new p95 of every URL and way in both to
stderr and adds "compare" with the URLs whose p95 rose by more than 10 % and 5 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import against, last_json
from bench.database import connect, database_size_mib, make_read_token
from bench.fleet import Fleet
from bench.fleet_db import parse_args, prepare, serve
from bench.harness import (
    BenchError,
    Client,
    Timing,
    log,
    log_server_problems,
    readable,
    run_and_report,
    stop_server,
    time_get,
)

URLS = (
    "/?window=24h",
    "/?window=7d",
    "/?window=30d",
    "/gpus/idle?window=24h",
    "/mig?window=24h",
    "/waste?window=24h",
    "/waste?group_by=tag:team&window=24h",
    "/waste?group_by=user&window=30d",
    "/instances?window=24h",
    "/instances/{id}?window=24h",
    "/heatmap?window=7d",
    "/heatmap?rows=gpu&window=7d",
    "/heatmap?rows=tag:team&window=7d",
    "/heatmap?window=30d",
    "/heatmap/week?window=30d",
)
"""Every page timed; {id} is an instance of the fleet (see `pick_instance`)."""
NEW_URLS = frozenset(u for u in URLS if u.startswith("/heatmap"))
"""The pages held against the overview in "checks"."""
OVERVIEW = "/?window=24h"
MONTH_OVERVIEW = "/?window=30d"
WAYS: tuple[tuple[str, dict[str, str]], ...] = (
    ("pages", {}),
    ("fragments", {"HX-Request": "true"}),
    ("json", {"Accept": "application/json"}),
)
"""Timing table of the result line -> the headers that ask for that way."""
LIMIT_MS = 150.0


def page_urls(instance_id: str | None, only: list[str]) -> list[str]:
    """The URLs to time: those holding one of `only`'s substrings (all without any); the instance page only if
    there is an instance."""
    urls = [u.replace("{id}", instance_id) if instance_id else u for u in URLS]
    return [u for u in urls if "{id}" not in u and (not only or any(s in u for s in only))]


def pick_instance(fleet: Fleet | None, url: str) -> str | None:
    """The busiest page of one instance: an 8-GPU host with MIG GPUs, one reconfigured if there is one."""
    if fleet is not None:
        mig = [i for i in fleet.instances if any(g.mig for g in i.gpus) and i.gone_at is None]
        best = [i for i in mig if i.reconfigured_at is not None] or mig or list(fleet.instances)
        return best[0].instance_id if best else None
    with connect(url) as conn:
        row = conn.execute("SELECT instance_id FROM instances ORDER BY last_seen DESC LIMIT 1").fetchone()
    return str(row[0]) if row else None


def json_problem(timing: Timing) -> str | None:
    """Why a 200 answer to `Accept: application/json` is not the page's JSON, if it is not."""
    if timing.status != 200:
        return None
    if not timing.content_type.lower().startswith("application/json"):
        return f"Content-Type {timing.content_type or '(none)'}"
    try:
        json.loads(timing.last_body)
    except ValueError:
        return "the body is not JSON"
    return None


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str = "p95_ms") -> float | None:
    """a[key] / b[key] of two answered (200) timings."""
    if not a or not b or a["status"] != 200 or b["status"] != 200 or b[key] <= 0:
        return None
    return round(float(a[key]) / float(b[key]), 3)


def checks(tables: dict[str, dict[str, dict[str, Any]]], problems: list[str]) -> dict[str, Any]:
    """The result line's "checks" over the timing tables ("pages", "fragments", "json")."""
    entries = [(url, figures) for table in tables.values() for url, figures in table.items()]
    answered = [figures["p95_ms"] for _url, figures in entries if figures["status"] == 200]
    overview = tables["pages"].get(OVERVIEW)
    new = [figures for url, figures in entries if url in NEW_URLS]
    ratios = [r for r in (_ratio(figures, overview) for figures in new) if r is not None]
    return {
        "slowest_p95_ms": max(answered, default=None),
        "new_vs_overview_max_ratio": max(ratios, default=None),
        "month_vs_day_overview": _ratio(tables["pages"].get(MONTH_OVERVIEW), overview),
        "all_under_150ms": bool(entries)
        and all(figures["status"] == 200 and figures["p95_ms"] < LIMIT_MS for _url, figures in entries),
        "problems": problems,
    }


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    earlier = last_json(args.compare) if args.compare else None  # a bad file fails now, not after the load
    if not page_urls("i-0", args.only):
        raise BenchError(f"no URL holds any of {args.only}")
    prepared = prepare(args, stack)
    db, fleet, figures, url = prepared.db, prepared.fleet, prepared.figures, prepared.db.url
    if args.alert_rules:
        from app.db import make_sessionmaker
        from bench.alerts import install_rules

        log(f"{len(install_rules(make_sessionmaker(prepared.engine), stack))} alert rules evaluated by the server")
    proc, port, log_path = serve(prepared, args.workers, stack)

    client = Client(port, make_read_token(url, f"bench-pages-{secrets.token_hex(4)}"))
    stack.callback(client.close)
    urls = page_urls(pick_instance(fleet, url), args.only)
    log(f"timing {len(urls)} URLs three ways, {args.runs} runs each")
    tables: dict[str, dict[str, dict[str, Any]]] = {way: {} for way, _headers in WAYS}
    problems: list[str] = []
    for path in urls:
        prepared.refresh()
        line = [path + ":"]
        for way, headers in WAYS:
            timing = time_get(client, path, headers, runs=args.runs)
            tables[way][path] = timing.figures()
            line.append(f"{way} {timing.status} p50 {timing.p50_ms} p95 {timing.p95_ms} ms {timing.size} B;")
            if timing.status != 200:
                problems.append(f"{path} ({way}): status {timing.status}")
            elif way == "json" and (why := json_problem(timing)):
                problems.append(f"{path} (json): {why}")
                log(f"WARNING: {path} as JSON: {why}")
        log(" ".join(line).rstrip(";"))
    stop_server(proc)
    log_problems = log_server_problems(log_path)

    pages, fragments = tables["pages"], tables["fragments"]
    ok = [v["p95_ms"] for v in (*pages.values(), *fragments.values()) if v["status"] == 200]
    load = {k: figures.get(k) for k in ("instances", "gpus", "mig_gpus", "slices", "devices", "rows")}
    load.update({k: figures.get(k) for k in ("load_s", "rows_per_s", "inventory_s", "vacuum_s", "load_workers")})
    result: dict[str, Any] = {
        **load,
        "db_size_mib": database_size_mib(url),
        "reused": prepared.reused,
        "days": fleet.days if fleet else args.days,
        "interval_s": fleet.interval_s if fleet else args.interval_s,
        "data_until": prepared.data_until(),
        "topup_rows": prepared.topped,
        "runs": args.runs,
        "workers": args.workers,
        "only": args.only,
        "alert_rules": args.alert_rules,
        **tables,
        "checks": checks(tables, problems),
        "overview_30d_over_1d": _ratio(pages.get(MONTH_OVERVIEW), pages.get(OVERVIEW), "p50_ms"),
        "pages_p95_max_ms": max(ok) if ok else None,
        "server_log_problems": log_problems,
        "database": db.where,
        "data_dir": str(db.disk) if db.disk else None,
    }
    if earlier is not None:
        result["compare"] = against(args.compare, earlier, result)
    return result


def main(argv: list[str] | None = None) -> int:
    return run_and_report(readable(run), parse_args(argv, description=__doc__))


if __name__ == "__main__":
    sys.exit(main())
