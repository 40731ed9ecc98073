"""The stop action (docs/alerts.md, "The stop action"): EC2 `StopInstances` on an incident's instance after the notice
and the rule's grace period, unless the incident is snoozed or closes meanwhile. Every step is a row of
`alert_actions`: who (the rule, or who cancelled), what (stop, which instance, dry run or not), when, what came of it.

- `plan_stop`, when an incident opens: `pending`, due after the grace, or `cancelled` naming the guard that held.
- `cancel_pending`, when the incident is snoozed or closes.
- `run_due`: each due row in a transaction of its own holding the row (`FOR UPDATE SKIP LOCKED`) until its outcome
  is recorded, one or two EC2 calls later (bounded by the client's timeouts). Other server processes skip the row
  meanwhile; a snooze arriving mid-stop waits, then finds nothing pending rather than "cancelling" a stop already
  sent. A process that dies mid-call leaves the row pending: the next round asks `DescribeInstances` first, so an
  instance it had stopped is recorded `done`, not stopped twice.

A real stop sends no `DryRun=True` first: that would repeat the permission check the real call makes anyway (a
refusal, UnauthorizedOperation, changes nothing). Dry-run rules use it, so the record says whether the real stop
would work. A plain stop: no hibernation, no forced stop (the OS shuts down as on `shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as EndpointUnreachable
from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..billing.spot import ClientFactory, ec2_clients
from ..db import make_sessionmaker, session_scope
from ..models import Instance
from ..settings import Settings
from .findings import Finding
from .rules import Rule, Stop
from .tables import alert_actions, alert_incidents, alert_rules

log = logging.getLogger("gpufleet.alerts")

ACTION = "stop"
EVERY_S = 30.0
"""Longest wait between rounds of `action_job`, s (shorter when GPUFLEET_ALERTS_CHECK_S is): a stop comes at most
this long after its grace period ends."""
RETRY_S = 60.0
"""Wait before asking EC2 again after throttling, a 5xx answer or an unreachable endpoint, s."""
GIVE_UP_S = 24 * 3600.0
"""How long after it first fell due a stop is still asked again, s; then it is `failed` with the last reason: a
stop a day late surprises whoever reads its notice."""
BATCH = 20
"""Most actions taken per round; the rest wait for the next."""
ATTEMPTS = 2
"""Tries per EC2 call, first included (botocore's standard retries: throttling, 5xx, connection errors)."""
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
DETAIL_CHARS = 300
"""The most of an EC2 answer or error kept in `detail` (an UnauthorizedOperation carries a long encoded message)."""

_EC2_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
# https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html, and EC2's answers when it is unwell.
_LATER = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable", "Unavailable"}
)
_STOPPED = frozenset({"stopping", "stopped"})
_GONE = frozenset({"shutting-down", "terminated"})


# Planning and cancelling, in the caller's transaction ---------------------------------------------------------------


def _guard(stop: Stop, finding: Finding) -> str | None:
    """Why the finding's instance must not be stopped, from what the analysis knows; None: nothing against it."""
    if finding.lifecycle == "on-prem":
        return "an on-premises host, not an EC2 instance: nothing to stop"
    if not finding.instance_id or not _EC2_ID.fullmatch(finding.instance_id):
        return f"{finding.subject} names no EC2 instance: nothing to stop"
    if finding.lifecycle == "spot" and not stop.spot:
        return "a spot instance, and the rule's stop.spot is false"
    if finding.capacity_block and not stop.capacity_block:
        return "in a Capacity Block for ML, and the rule's stop.capacity_block is false"
    return None


def plan_stop(session: Session, rule: Rule, incident_id: int, finding: Finding, *, now: datetime) -> datetime | None:
    """Record the stop of the incident's instance, in the caller's transaction (no commit): `pending`, due `grace_s`
    after `now`, or `cancelled` with the guard that holds. Returns when it will stop (a dry run: when it would),
    None if it will not. Once per incident: a second call records nothing and answers as the first row stands.
    A rule without `stop` records nothing."""
    if rule.stop is None:
        return None
    if rule.id is None:
        raise ValueError("the rule must be stored: an action names its rule by id")
    # The incident's row lock makes a concurrent call for the same incident wait, then see this one's row.
    locked = session.execute(
        select(alert_incidents.c.id).where(alert_incidents.c.id == incident_id).with_for_update()
    ).first()
    if locked is None:
        raise ValueError(f"no incident {incident_id}")
    a = alert_actions.c
    first = session.execute(
        select(a.status, a.due_at).where(a.incident_id == incident_id, a.action == ACTION).order_by(a.id).limit(1)
    ).first()
    if first is not None:
        return first.due_at if first.status == "pending" else None
    values: dict[str, Any] = {
        "rule_id": rule.id,
        "incident_id": incident_id,
        "instance_id": finding.instance_id or "",
        "action": ACTION,
        "dry_run": rule.stop.dry_run,
        "by": rule.name,
        "created_at": now,
    }
    reason = _guard(rule.stop, finding)
    if reason is not None:
        session.execute(
            insert(alert_actions).values(**values, status="cancelled", due_at=now, done_at=now, detail=reason)
        )
        return None
    due = now + timedelta(seconds=rule.stop.grace_s)
    session.execute(insert(alert_actions).values(**values, status="pending", due_at=due))
    return due


def cancel_pending(session: Session, incident_id: int, *, by: str, reason: str, now: datetime | None = None) -> int:
    """Cancel the incident's pending stop, in the caller's transaction (no commit); returns how many rows (0 or 1).
    A stop being sent at that moment holds its row: this waits for its outcome (seconds at most) and then finds
    nothing pending. `now`: the time recorded; the transaction's start unless given."""
    a = alert_actions.c
    result = session.execute(
        update(alert_actions)
        .where(a.incident_id == incident_id, a.action == ACTION, a.status == "pending")
        .values(status="cancelled", by=by[:200], detail=reason[:DETAIL_CHARS], done_at=now or func.now())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# Taking due actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What became of one due action: `status` done, dry-run, cancelled, failed, or pending again (`retry_at`)."""

    status: str
    detail: str
    retry_at: datetime | None = None


@dataclass(frozen=True)
class Acted:
    """One action a round took up, and its outcome."""

    id: int
    instance_id: str
    by: str
    outcome: Outcome


@dataclass
class StopReport:
    """What one `run_due` round did, in the order it did it."""

    acted: list[Acted] = field(default_factory=list)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 3] + "..."


def _fails(reason: str, dry_run: bool) -> Outcome:
    """A stop that cannot be made; in a dry run, one that would fail (still a dry run: nothing to retry)."""
    return Outcome("dry-run", _one_line(f"would fail: {reason}")) if dry_run else Outcome("failed", _one_line(reason))


@dataclass(frozen=True)
class _Due:
    """A due action this transaction holds."""

    id: int
    rule_id: int | None
    incident_id: int | None
    instance_id: str
    dry_run: bool
    by: str
    created_at: datetime
    """When it was planned: its notice's time."""


def _claim(session: Session, now: datetime) -> _Due | None:
    a = alert_actions.c
    row = session.execute(
        select(a.id, a.rule_id, a.incident_id, a.instance_id, a.dry_run, a.by, a.created_at)
        .where(a.status == "pending", a.action == ACTION, a.due_at <= now)
        .order_by(a.due_at, a.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).first()
    return _Due(*row) if row is not None else None


def _still_wanted(session: Session, row: _Due, now: datetime) -> tuple[str | None, Stop | None]:
    """Why the stop must not go ahead now (None: it may), and the rule's stop action as it stands now. The incident
    is read, not locked: a snooze locks it and then waits for this row, so a lock here could deadlock."""
    i, r = alert_incidents.c, alert_rules.c
    # An id of NULL (the incident or rule deleted) matches nothing.
    incident = session.execute(select(i.closed_at, i.snoozed_until).where(i.id == row.incident_id)).first()
    if incident is None:
        return "its incident is gone (the rule was deleted)", None
    if incident.closed_at is not None:
        return f"the incident closed at {incident.closed_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC", None
    if incident.snoozed_until is not None and incident.snoozed_until > now:
        return f"the incident is snoozed until {incident.snoozed_until.astimezone(UTC):%Y-%m-%d %H:%M} UTC", None
    rule = session.execute(select(r.enabled, r.stop).where(r.id == row.rule_id)).first()
    if rule is None:
        return "its rule is gone", None
    if rule.stop is None:
        return "the rule no longer stops instances", None
    if not rule.enabled:
        return "the rule is turned off", None
    return None, Stop.from_json(rule.stop)


def _region(session: Session, instance_id: str) -> str | None:
    """The instance's region as its agent reported it; else its zone's, the zone less its letter."""
    found = session.execute(
        select(Instance.region, Instance.availability_zone).where(Instance.instance_id == instance_id)
    ).first()
    if found is None:
        return None
    if found.region:
        return str(found.region)
    zone = found.availability_zone or ""
    return zone[:-1] if len(zone) > 1 else None


def _state_of(answer: Mapping[str, Any], instance_id: str) -> Mapping[str, Any] | None:
    for reservation in answer.get("Reservations", []):
        for instance in reservation.get("Instances", []):
            if instance.get("InstanceId") == instance_id:
                return dict(instance)
    return None


def _ask_ec2(client: Any, instance_id: str, region: str, stop: Stop, dry_run: bool, now: datetime) -> Outcome:
    """Check the instance with EC2, then stop it (or, in a dry run, ask EC2 whether it may). Raises what botocore
    raises."""
    where = f"{instance_id} in {region}"
    instance = _state_of(client.describe_instances(InstanceIds=[instance_id]), instance_id)
    if instance is None:
        return _fails(f"EC2 does not know {where}", dry_run)
    # EC2's word on the kind of instance wins over what the agent reported when the stop was planned. The values
    # of InstanceLifecycle ("spot", "scheduled", "capacity-block"; absent for on-demand): EC2 API Reference,
    # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html
    lifecycle = instance.get("InstanceLifecycle")
    if lifecycle == "spot" and not stop.spot:
        return Outcome("cancelled", f"EC2 says {instance_id} is a spot instance, and the rule's stop.spot is false")
    if lifecycle == "capacity-block" and not stop.capacity_block:
        return Outcome(
            "cancelled", f"EC2 says {instance_id} runs in a Capacity Block, and the rule's stop.capacity_block is false"
        )
    state = str((instance.get("State") or {}).get("Name") or "unknown")
    if state in _STOPPED:
        # Stopped by hand, or by an earlier round that died before it recorded: either way, what the rule wanted.
        return Outcome("dry-run" if dry_run else "done", f"{where} is {state} already: StopInstances not sent")
    if state in _GONE:
        return Outcome("cancelled", f"{where} is {state}")
    if state == "pending":
        return Outcome("pending", f"{where} is starting", now + timedelta(seconds=RETRY_S))
    if dry_run:
        try:
            client.stop_instances(InstanceIds=[instance_id], DryRun=True)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "DryRunOperation":
                return Outcome("dry-run", f"would stop {where} ({state}); EC2 allows it (DryRunOperation)")
            raise
        return Outcome("dry-run", f"would stop {where} ({state}); EC2 answered the dry run without DryRunOperation")
    answer = client.stop_instances(InstanceIds=[instance_id])
    for change in answer.get("StoppingInstances", []):
        if change.get("InstanceId") == instance_id:
            before = (change.get("PreviousState") or {}).get("Name", "?")
            after = (change.get("CurrentState") or {}).get("Name", "?")
            return Outcome("done", f"EC2 StopInstances {where}: {before} -> {after}")
    return Outcome("done", f"EC2 StopInstances {where}: sent; the answer did not name the instance")


def _error(exc: Exception, dry_run: bool, now: datetime) -> Outcome:
    """An EC2 call that raised: again later (throttling, EC2 unwell, unreachable) or failed, in one line."""
    later = False
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        reason = f"{code or f'HTTP {status}'}: {error.get('Message') or exc}"
        later = code in _LATER or status >= 500
    elif isinstance(exc, NoCredentialsError):
        reason = "no AWS credentials found (environment, shared config, container or instance role)"
    elif isinstance(exc, BotoCoreError):
        reason = f"{type(exc).__name__}: {exc}"
        later = isinstance(exc, EndpointUnreachable | HTTPClientError)
    else:
        reason = f"unexpected {type(exc).__name__} (see the server log)"
    if later:
        return Outcome("pending", _one_line(reason), now + timedelta(seconds=RETRY_S))
    return _fails(reason, dry_run)


def _act(session: Session, row: _Due, now: datetime, clients: ClientFactory) -> Outcome:
    why_not, stop = _still_wanted(session, row, now)
    if why_not is not None or stop is None:
        return Outcome("cancelled", why_not or "no stop action")
    # A stop planned as a dry run stays one: its notice said nothing would be stopped.
    dry_run = bool(row.dry_run) or stop.dry_run
    region = _region(session, row.instance_id)
    if region is None:
        return _fails(f"no region known for {row.instance_id}: its agent reported neither region nor zone", dry_run)
    try:
        outcome = _ask_ec2(clients(region), row.instance_id, region, stop, dry_run, now)
    except (BotoCoreError, ClientError) as exc:
        outcome = _error(exc, dry_run, now)
    except Exception as exc:  # a surprise in one action must not stop the others, nor be lost
        log.exception("stop action %s on %s failed unexpectedly", row.id, row.instance_id)
        outcome = _error(exc, dry_run, now)
    first_due = row.created_at + timedelta(seconds=stop.grace_s)
    if outcome.retry_at is not None and outcome.retry_at > first_due + timedelta(seconds=GIVE_UP_S):
        return _fails(f"still not done {GIVE_UP_S / 3600:g} h after it was due: {outcome.detail}", dry_run)
    return outcome


def _record(session: Session, row: _Due, outcome: Outcome, now: datetime) -> None:
    values: dict[str, Any] = {"status": outcome.status, "detail": _one_line(outcome.detail)}
    if outcome.retry_at is not None:
        when = outcome.retry_at.astimezone(UTC)
        values.update(
            due_at=outcome.retry_at, detail=_one_line(f"asking EC2 again at {when:%H:%M:%S} UTC: {outcome.detail}")
        )
    else:
        values["done_at"] = now
    session.execute(update(alert_actions).where(alert_actions.c.id == row.id).values(**values))


def run_due(
    sessions: sessionmaker[Session],
    settings: Settings,
    *,
    now: datetime,
    clients: ClientFactory | None = None,
    batch: int = BATCH,
) -> StopReport:
    """Take up to `batch` actions due by `now` (UTC-aware), oldest first, each in its own transaction holding its
    row. Each is checked again (the incident still open and not snoozed, the rule still stopping), then the
    instance with EC2 in its region, then stopped, or in a dry run checked with `DryRun=True`. Outcomes: `done`
    with EC2's answer, `dry-run` with what would have happened, `cancelled` or `failed` with why, or pending again
    a minute later when EC2 throttles, is unwell or cannot be reached. AWS errors are recorded, never raised;
    database errors are raised (the row stays pending). `clients`: EC2 clients by region; `ec2_clients()` (the
    server's credentials) unless given."""
    assert now.tzinfo is not None, "now must be timezone-aware"
    report = StopReport()
    for _ in range(batch):
        with session_scope(sessions) as session:
            row = _claim(session, now)
            if row is None:
                break
            if clients is None:
                clients = ec2_clients(
                    attempts=ATTEMPTS, connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S
                )
            outcome = _act(session, row, now, clients)
            _record(session, row, outcome, now)
        report.acted.append(Acted(row.id, row.instance_id, row.by, outcome))
    return report


def _log(report: StopReport, last_retry: dict[int, str]) -> None:
    for acted in report.acted:
        status, detail = acted.outcome.status, acted.outcome.detail
        if status == "pending":
            # Throttling can last: say so once per reason, not every round.
            if last_retry.get(acted.id) != detail:
                log.warning(
                    "stop action %d (rule %s) on %s waits a minute: %s", acted.id, acted.by, acted.instance_id, detail
                )
            last_retry[acted.id] = detail
            continue
        last_retry.pop(acted.id, None)
        level = logging.WARNING if status == "failed" else logging.INFO
        log.log(level, "stop action %d (rule %s) on %s: %s: %s", acted.id, acted.by, acted.instance_id, status, detail)


async def _act_every(sessions: sessionmaker[Session], settings: Settings) -> None:
    every = min(EVERY_S, settings.alerts_check_s)
    last_retry: dict[int, str] = {}
    last_error: str | None = None
    while True:
        try:
            report = await asyncio.to_thread(run_due, sessions, settings, now=datetime.now(UTC))
            _log(report, last_retry)
            if last_error is not None:
                log.info("stop actions: working again")
            last_error = None
        except SQLAlchemyError as exc:
            reason = f"database: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            if reason != last_error:
                log.warning("stop actions: round failed, will retry: %s", reason)
            last_error = reason
        except Exception as exc:  # the loop must outlive a bug in one round
            reason = type(exc).__name__
            if reason != last_error:
                log.exception("stop actions: round failed unexpectedly")
            last_error = reason
        await asyncio.sleep(every)


def action_job(engine: Engine, settings: Settings) -> asyncio.Task[None]:
    """Take due stop actions every 30 s (or GPUFLEET_ALERTS_CHECK_S, when shorter); the caller cancels the task on
    shutdown."""
    return asyncio.create_task(_act_every(make_sessionmaker(engine), settings))
