"""Alert evaluation benchmark: one evaluation of the alert rules (app/alerts/evaluate.py) timed in process on the
synthetic fleet of bench/pages.py: `--rule-set each`, one rule of each of the six conditions; `variants` (the
default), those and four more (gpu_idle scoped by lifecycle, type and tag, two of them routed to the owner, one
with a dry-run stop; tag_waste by a second tag), ten in all.

    .venv/bin/python -m bench.alerts [--instances 300] [--days 14] [--interval-s 30] [--runs 30]
        [--data-dir DIR --keep] [--database-url URL] [--skip-load] [--load-workers 2]
        [--rule-set each|variants]
    (or .venv/bin/python bench/alerts.py with the same options)

The fleet, its loading and these options are bench/pages.py's (bench/fleet_db.py, shared): a run on the same
`--data-dir DIR --keep` reuses the fleet the page benchmark loaded. The rules are written under names starting
with `bench-`, replaced at the start and removed at the end with their incidents and messages; their routes
point at a port nothing listens on, and no sender runs, so nothing leaves the machine.

Timing: the first evaluation (which opens every incident and queues its messages) is reported apart; then
`--runs` evaluations, each its own transaction, as the server's evaluation job runs them, with the incidents
open. Also timed: a round with every bench rule disabled (what the job costs a server without rules). Progress
goes to stderr; the last line of stdout is one JSON object: first_ms, p50/p95/max ms, the rules, incidents and
messages, and "ok": p95 under the 200 ms target.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_db import parse_args, prepare
from bench.harness import log, readable, run_and_report

TARGET_MS = 200.0
PREFIX = "bench-"
NOWHERE = "http://127.0.0.1:9/gpufleet-bench"
"""Port 9 (discard): no sender runs in the benchmark, and nothing would answer if one did."""


def bench_rules(variants: bool = True) -> list[Any]:
    """A rule of every condition, and (`variants`) the scoped and owner-routed variants a real fleet would add."""
    from app.alerts.rules import Route, Rule, Scope, Stop, Target

    hook = Route(Target("webhook", NOWHERE, secret="bench-secret-0123456789"))
    owner = Route(Target("slack", NOWHERE), owner=True)
    every = [
        Rule(f"{PREFIX}idle", "gpu_idle", hook, for_hours=2, remind_s=86400),
        Rule(f"{PREFIX}slices", "slice_underused", hook, for_hours=2),
        Rule(f"{PREFIX}unpartitioned", "mig_unpartitioned", hook, for_hours=2),
        Rule(f"{PREFIX}offline", "agent_offline", hook, for_hours=1),
        Rule(f"{PREFIX}team-waste", "tag_waste", hook, usd_per_day=50, tag_key="team"),
        Rule(f"{PREFIX}spot", "spot_interruption", hook),
    ]
    if not variants:
        return every
    return [
        *every,
        Rule(f"{PREFIX}idle-on-demand", "gpu_idle", owner, for_hours=6, scope=Scope(lifecycles=("on-demand",))),
        Rule(
            f"{PREFIX}idle-p4d-stop",
            "gpu_idle",
            hook,
            for_hours=4,
            scope=Scope(instance_types=("p4d.24xlarge",)),
            stop=Stop(dry_run=True),
        ),
        Rule(f"{PREFIX}idle-team", "gpu_idle", owner, for_hours=1, scope=Scope(tags=(("team", "ml-research"),))),
        Rule(f"{PREFIX}project-waste", "tag_waste", hook, usd_per_day=100, tag_key="project"),
    ]


def _clear(sessions: Any) -> None:
    from sqlalchemy import delete, select

    from app.alerts.tables import alert_incidents, alert_outbox, alert_rules
    from app.db import session_scope

    with session_scope(sessions) as session:
        ids = select(alert_rules.c.id).where(alert_rules.c.name.startswith(PREFIX)).scalar_subquery()
        incidents = select(alert_incidents.c.id).where(alert_incidents.c.rule_id.in_(ids)).scalar_subquery()
        session.execute(delete(alert_outbox).where(alert_outbox.c.incident_id.in_(incidents)))
        session.execute(delete(alert_rules).where(alert_rules.c.name.startswith(PREFIX)))


def install_rules(sessions: Any, stack: contextlib.ExitStack, *, variants: bool = True) -> list[Any]:
    """The bench rules, in place of any left by an earlier run; removed when `stack` closes."""
    from app.alerts.rules import create_rule
    from app.db import session_scope

    _clear(sessions)
    stack.callback(lambda: _clear(sessions))
    rules = bench_rules(variants)
    with session_scope(sessions) as session:
        for rule in rules:
            create_rule(session, rule, by="bench", now=datetime.now(UTC))
    return rules


def _evaluate_ms(sessions: Any, settings: Any) -> tuple[float, Any]:
    from app.alerts.evaluate import evaluate
    from app.db import session_scope

    t = time.perf_counter()
    with session_scope(sessions) as session:
        result = evaluate(session, settings, now=datetime.now(UTC))
    return (time.perf_counter() - t) * 1000, result


def _counts(sessions: Any) -> dict[str, int]:
    from sqlalchemy import text

    from app.db import session_scope

    with session_scope(sessions) as session:
        row = session.execute(
            text(
                "SELECT (SELECT count(*) FROM alert_incidents i JOIN alert_rules r ON r.id = i.rule_id "
                "        WHERE r.name LIKE :p AND i.closed_at IS NULL), "
                "       (SELECT count(*) FROM alert_outbox o JOIN alert_incidents i ON i.id = o.incident_id "
                "        JOIN alert_rules r ON r.id = i.rule_id WHERE r.name LIKE :p), "
                "       (SELECT count(*) FROM gpus)"
            ),
            {"p": PREFIX + "%"},
        ).one()
    return {"incidents_open": int(row[0]), "messages_queued": int(row[1]), "gpus": int(row[2])}


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    from sqlalchemy import update

    from app.alerts.tables import alert_rules
    from app.db import make_sessionmaker, session_scope
    from app.main import tune_gc
    from app.settings import Settings

    prepared = prepare(args, stack)
    tune_gc()  # as `gpufleet serve` does once started: the evaluation job runs in the server's process
    url = prepared.db.url
    settings = Settings(database_url=url, raw_retention_days=prepared.retention)
    sessions = make_sessionmaker(prepared.engine)
    rules = install_rules(sessions, stack, variants=args.rule_set == "variants")

    first_ms, _ = _evaluate_ms(sessions, settings)
    log(f"first evaluation (opens the incidents): {first_ms:.0f} ms; {_counts(sessions)}")
    times = []
    for _ in range(args.runs):
        ms, _result = _evaluate_ms(sessions, settings)
        times.append(ms)
    times.sort()
    p95 = times[max(0, round(0.95 * len(times)) - 1)]
    log(f"{args.runs} evaluations: p50 {statistics.median(times):.0f} ms, p95 {p95:.0f} ms, max {times[-1]:.0f} ms")

    with session_scope(sessions) as session:
        session.execute(update(alert_rules).where(alert_rules.c.name.startswith(PREFIX)).values(enabled=False))
    idle = sorted(_evaluate_ms(sessions, settings)[0] for _ in range(5))
    counts = _counts(sessions)
    return {
        "rule_set": args.rule_set,
        "rules": len(rules),
        "conditions": sorted({r.condition for r in rules}),
        **counts,
        "days": prepared.fleet.days if prepared.fleet else args.days,
        "first_ms": round(first_ms, 1),
        "runs": args.runs,
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(p95, 1),
        "max_ms": round(times[-1], 1),
        "no_rules_p50_ms": round(statistics.median(idle), 1),
        "target_ms": TARGET_MS,
        "ok": p95 < TARGET_MS,
        "database": prepared.db.where,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    """bench/pages.py's options, and which rules."""
    rule_set = "variants"
    if argv is None:
        argv = sys.argv[1:]
    if "--rule-set" in argv:
        at = argv.index("--rule-set")
        if at + 1 >= len(argv) or argv[at + 1] not in ("each", "variants"):
            sys.exit("bench.alerts: --rule-set takes each or variants")
        rule_set = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    args = parse_args(argv, description=__doc__)
    args.rule_set = rule_set
    return args


def main(argv: list[str] | None = None) -> int:
    return run_and_report(readable(run), parse(argv))


if __name__ == "__main__":
    sys.exit(main())
