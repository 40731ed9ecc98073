"""The evaluation of alert rules (docs/alerts.md, "Incidents"): every GPUFLEET_ALERTS_CHECK_S, read the analysis
once, let each enabled rule find what holds, and bring its incidents and their messages in line
(app/alerts/incidents.py), all in one transaction.

Only one process evaluates at a time: the round starts with `pg_try_advisory_xact_lock`, and a process that does
not get it skips the round (another is doing the same work). A rule whose evaluation fails is rolled back to a
savepoint and named in the result; the other rules go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..analyse.fleet import DeviceRowsCache
from ..db import make_sessionmaker, session_scope
from ..pricing.resolve import Pricer
from ..settings import Settings
from . import findings, incidents
from .failures import FailureLog
from .findings import Finding
from .rules import Rule, list_rules

log = logging.getLogger("gpufleet.alerts")

_LOCK = 0x67706661_6576616C
"""Advisory lock key of an evaluation round ("gpfaeval")."""

Find = Callable[[Rule], Sequence[Finding]]
"""What one rule finds now."""
Finder = Callable[[Session, Settings, datetime], Find]
"""Reads what the rules look at, once per round, and gives the `Find` of that round."""


def snapshot_finder(session: Session, settings: Settings, now: datetime) -> Find:
    """The real finder: one snapshot of the analysis (app/alerts/findings.py), shared by every rule."""
    snapshot = findings.load_snapshot(session, settings, now=now)
    return lambda rule: findings.find(snapshot, rule)


def server_finder(pricer: Pricer, rows_cache: DeviceRowsCache) -> Finder:
    """`snapshot_finder` with the server's pricer and device-row cache (app/state.py), so a round neither reads the
    price file again nor keeps a second copy of the device rows."""

    def finder(session: Session, settings: Settings, now: datetime) -> Find:
        snapshot = findings.load_snapshot(session, settings, now=now, pricer=pricer, rows_cache=rows_cache)
        return lambda rule: findings.find(snapshot, rule)

    return finder


@dataclass
class Evaluation:
    """What one round did."""

    skipped: bool = False
    """Another process held the evaluation lock: this one did nothing."""
    rules: int = 0
    """Enabled rules evaluated."""
    opened: int = 0
    reminded: int = 0
    closed: int = 0
    queued: int = 0
    """Messages newly put in the outbox."""
    errors: dict[str, str] = field(default_factory=dict)
    """Rule name -> why its evaluation failed (rolled back; the others stand)."""
    seconds: float = 0.0


def _reason(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"[:300] if first else type(exc).__name__


def _add(result: Evaluation, applied: incidents.Applied) -> None:
    result.opened += len(applied.opened)
    result.reminded += len(applied.reminded)
    result.closed += len(applied.closed)
    result.queued += applied.queued


def evaluate(session: Session, settings: Settings, *, now: datetime, finder: Finder = snapshot_finder) -> Evaluation:
    """One round in the caller's transaction (no commit): every enabled rule's incidents brought in line with
    what it finds at `now`, the open incidents of rules turned off closed. `finder`: what the rules look at (the
    analysis, unless a test gives another). Skipped, doing nothing, while another transaction evaluates."""
    started = time.perf_counter()
    if not session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK}).scalar():
        return Evaluation(skipped=True)
    result = Evaluation()
    every = list_rules(session)
    enabled = [r for r in every if r.enabled]
    find = finder(session, settings, now) if enabled else None
    for rule in every:
        try:
            # A savepoint per rule: a failing rule leaves nothing half done, and the others still count.
            with session.begin_nested():
                if find is not None and rule.enabled:
                    applied = incidents.apply(session, settings, rule, find(rule), now=now)
                    result.rules += 1
                else:
                    applied = incidents.retire(session, settings, rule, now=now)
        except Exception as exc:  # a bug or bad data in one rule must not stop the others
            if isinstance(exc, SQLAlchemyError) and not session.is_active:
                raise
            log.debug("alert rule %r failed", rule.name, exc_info=True)
            result.errors[rule.name] = _reason(exc)
            continue
        _add(result, applied)
    result.seconds = time.perf_counter() - started
    return result


def evaluate_once(
    sessions: sessionmaker[Session], settings: Settings, *, finder: Finder = snapshot_finder
) -> Evaluation:
    """One round in its own transaction, committed, at the clock's time."""
    with session_scope(sessions) as session:
        return evaluate(session, settings, now=datetime.now(UTC), finder=finder)


class _Reasons(FailureLog):
    """Failures of the round and of each rule, each logged once while it lasts."""

    def __init__(self) -> None:
        super().__init__("alert evaluation")

    def round(self, result: Evaluation) -> None:
        failing = {f"rule {name!r}": reason for name, reason in result.errors.items()}
        for what in [w for w in self.last if w.startswith("rule ") and w not in failing]:
            self.worked(what)
        for what, reason in failing.items():
            self.failed(what, reason)


async def _evaluate_every(sessions: sessionmaker[Session], settings: Settings, finder: Finder) -> None:
    reasons = _Reasons()
    while True:
        try:
            result = await asyncio.to_thread(evaluate_once, sessions, settings, finder=finder)
            reasons.worked("the round")
            if not result.skipped:
                reasons.round(result)
                if result.opened or result.closed or result.reminded:
                    log.info(
                        "alert evaluation: %d opened, %d reminded, %d closed, %d messages queued (%.0f ms)",
                        result.opened,
                        result.reminded,
                        result.closed,
                        result.queued,
                        result.seconds * 1000,
                    )
        except SQLAlchemyError as exc:
            reasons.failed("the round", f"database: {_reason(exc)}")
        except Exception as exc:  # the loop must outlive a bug in one round
            log.exception("alert evaluation failed")
            reasons.failed("the round", _reason(exc))
        await asyncio.sleep(settings.alerts_check_s)


def evaluation_job(engine: Engine, settings: Settings, *, finder: Finder = snapshot_finder) -> asyncio.Task[None]:
    """Evaluate the rules now, then every `GPUFLEET_ALERTS_CHECK_S`; the caller cancels the task on shutdown."""
    return asyncio.create_task(_evaluate_every(make_sessionmaker(engine), settings, finder))
