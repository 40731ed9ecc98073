"""The outbox (docs/alerts.md, "Delivery"): a message is written in the same transaction as the incident it is
about, then sent by `send_due` with retries, each message through its own channel to its own target.

- Claim: due unsent messages are leased (`leased_until`) in one short transaction, `FOR UPDATE SKIP LOCKED`, so
  server processes that send at once never take the same message.
- Send: outside any transaction, one thread per target, so a slow target costs the others nothing.
- Record: each outcome in its own short transaction. A failure sets `due_at` by exponential backoff with jitter
  (or the receiver's `Retry-After`) and defers that target's other messages of the round; other targets go on.
- A process that dies between a send and its record leaves the lease to expire: the message is sent again with
  the same message id, which receivers deduplicate by. Delivery is at least once; no message is ever dropped.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..db import make_sessionmaker, session_scope
from ..settings import Settings
from . import channels
from .channels import SendResult, display_target
from .failures import FailureLog
from .tables import alert_outbox

log = logging.getLogger("gpufleet.alerts")

LEASE_S = 120.0
"""How long a claim keeps a message from other senders, s. A round starts no send after half of it."""
BACKOFF_FIRST_S = 15.0
"""Wait after a message's first failed send, s; each further failure doubles it..."""
BACKOFF_MAX_S = 3600.0
"""...up to this, s; also the longest `Retry-After` obeyed."""
SEND_THREADS = 8
"""Targets sent to at once."""

_NAMESPACE = uuid.UUID("6f1d3a52-4c1e-5b8e-9a57-3f0c2d7e8b41")


def message_id(*parts: object) -> uuid.UUID:
    """A message id that depends only on what the message is: the same parts (incident id, kind, target,
    reminder number ...) give the same id, so evaluating again never queues a message twice."""
    return uuid.uuid5(_NAMESPACE, "\x1f".join(str(p) for p in parts))


@dataclass(frozen=True)
class Message:
    """One message to queue. `payload`: slack `{text, blocks?}`, webhook any JSON object (sent with `message_id`
    added), email `{subject, text, html?}`. `target`: the URL or email address."""

    message_id: uuid.UUID
    incident_id: int | None
    kind: str
    channel: str
    target: str
    secret: str | None
    payload: Mapping[str, Any]
    due_at: datetime | None = None


ENQUEUE_CHUNK = 1000
"""Messages per INSERT: nine parameters each, well under PostgreSQL's 65,535 per statement."""


def enqueue_many(session: Session, messages: Sequence[Message]) -> int:
    """Queue messages in the caller's transaction (no commit), one statement per `ENQUEUE_CHUNK`; how many were
    new (a message whose id is queued already is left as it is)."""
    new = 0
    for first in range(0, len(messages), ENQUEUE_CHUNK):
        rows = [
            {
                "message_id": m.message_id,
                "incident_id": m.incident_id,
                "kind": m.kind,
                "channel": m.channel,
                "target": m.target,
                "secret": m.secret,
                "payload": dict(m.payload),
                "due_at": m.due_at if m.due_at is not None else func.now(),
            }
            for m in messages[first : first + ENQUEUE_CHUNK]
        ]
        stmt = (
            insert(alert_outbox)
            .values(rows)
            .on_conflict_do_nothing(index_elements=[alert_outbox.c.message_id])
            .returning(alert_outbox.c.id)
        )
        new += len(session.execute(stmt).all())
    return new


def enqueue(
    session: Session,
    *,
    message_id: uuid.UUID,
    incident_id: int | None,
    kind: str,
    channel: str,
    target: str,
    secret: str | None,
    payload: Mapping[str, Any],
    due_at: datetime | None = None,
) -> bool:
    """Queue one message (`Message` says what each field holds) in the caller's transaction (no commit); True
    when new, False when its id is queued already."""
    message = Message(message_id, incident_id, kind, channel, target, secret, payload, due_at)
    return enqueue_many(session, [message]) == 1


def backoff_s(attempts: int, retry_after_s: float | None = None, *, rng: random.Random | None = None) -> float:
    """Wait before the next try after `attempts` failed ones, s: the receiver's `Retry-After` when it gave one,
    else 15 s doubling per failure with jitter (half to all of it, so messages that failed together spread
    out), at most an hour."""
    if retry_after_s is not None:
        return min(BACKOFF_MAX_S, max(1.0, retry_after_s))
    full = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** max(0, min(attempts - 1, 20)))
    draw = rng.random() if rng is not None else random.random()
    return full * (0.5 + 0.5 * draw)


@dataclass(frozen=True)
class Claimed:
    """A message this sender holds until `leased_until`."""

    id: int
    message_id: uuid.UUID
    channel: str
    target: str
    secret: str | None
    payload: dict[str, Any]
    attempts: int
    due_at: datetime
    leased_until: datetime


def claim(
    sessions: sessionmaker[Session], *, now: datetime, batch: int = 50, lease_s: float = LEASE_S
) -> list[Claimed]:
    """Lease up to `batch` due unsent messages, oldest due first, and commit the lease."""
    o = alert_outbox.c
    due = (
        select(o.id)
        .where(o.sent_at.is_(None), o.due_at <= now, or_(o.leased_until.is_(None), o.leased_until < now))
        .order_by(o.due_at, o.id)
        .limit(batch)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    stmt = (
        update(alert_outbox)
        .where(o.id.in_(select(due.c.id)))
        .values(leased_until=now + timedelta(seconds=lease_s))
        .returning(o.id, o.message_id, o.channel, o.target, o.secret, o.payload, o.attempts, o.due_at, o.leased_until)
    )
    with session_scope(sessions) as session:
        rows = session.execute(stmt).all()
    return sorted((Claimed(*row) for row in rows), key=lambda c: (c.due_at, c.id))


def record_sent(sessions: sessionmaker[Session], item: Claimed, at: datetime) -> None:
    """Mark a message sent; whoever holds it now, it must not go again."""
    o = alert_outbox.c
    stmt = (
        update(alert_outbox)
        .where(o.id == item.id)
        .values(sent_at=func.coalesce(o.sent_at, at), attempts=o.attempts + 1, last_error=None, leased_until=None)
    )
    with session_scope(sessions) as session:
        session.execute(stmt)


def record_failed(sessions: sessionmaker[Session], item: Claimed, reason: str, due_at: datetime) -> None:
    """Count a failed try and set the next; only while this sender's lease holds, so a late record never undoes
    what a later sender did."""
    o = alert_outbox.c
    stmt = (
        update(alert_outbox)
        .where(o.id == item.id, o.sent_at.is_(None), o.leased_until == item.leased_until)
        .values(attempts=o.attempts + 1, last_error=reason[:1000], due_at=due_at, leased_until=None)
    )
    with session_scope(sessions) as session:
        session.execute(stmt)


def release(sessions: sessionmaker[Session], items: Sequence[Claimed], not_before: datetime | None) -> None:
    """Give back messages not tried this round, no sooner than `not_before` when given (their target failed)."""
    if not items:
        return
    o = alert_outbox.c
    values: dict[str, Any] = {"leased_until": None}
    if not_before is not None:
        values["due_at"] = func.greatest(o.due_at, not_before)
    stmt = (
        update(alert_outbox)
        .where(o.id.in_([i.id for i in items]), o.sent_at.is_(None), o.leased_until == items[0].leased_until)
        .values(**values)
    )
    with session_scope(sessions) as session:
        session.execute(stmt)


@dataclass
class SendReport:
    """What one round did. `failures`: each target that failed (as `display_target` shows it) and why."""

    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    working: set[str] = field(default_factory=set)
    """Targets that took at least one message."""


def _send_one(settings: Settings, item: Claimed, timeout_s: float) -> SendResult:
    try:
        return channels.send(
            settings,
            channel=item.channel,
            target=item.target,
            secret=item.secret,
            message_id=item.message_id,
            payload=item.payload,
            timeout_s=timeout_s,
        )
    except Exception as exc:  # a bug in a channel must not stop the others, nor lose the message
        log.exception("alert channel %s failed unexpectedly", item.channel)
        return SendResult(delivered=False, reason=f"unexpected {type(exc).__name__} (see the server log)")


def _send_target(
    sessions: sessionmaker[Session],
    settings: Settings,
    items: list[Claimed],
    *,
    now: datetime | None,
    deadline: float,
    timeout_s: float,
) -> SendReport:
    report = SendReport(claimed=len(items))
    shown = display_target(items[0].target)
    for i, item in enumerate(items):
        if time.monotonic() > deadline:  # the lease must outlast every send started under it
            release(sessions, items[i:], None)
            report.deferred += len(items) - i
            break
        result = _send_one(settings, item, timeout_s)
        at = now or datetime.now(UTC)
        if result.delivered:
            record_sent(sessions, item, at)
            report.delivered += 1
            report.working.add(shown)
            continue
        reason = result.reason or "failed"
        due = at + timedelta(seconds=backoff_s(item.attempts + 1, result.retry_after_s))
        record_failed(sessions, item, reason, due)
        release(sessions, items[i + 1 :], due)
        report.failed += 1
        report.deferred += len(items) - i - 1
        report.failures[shown] = reason
        break
    return report


def send_due(
    sessions: sessionmaker[Session],
    settings: Settings,
    *,
    now: datetime | None = None,
    batch: int = 50,
    lease_s: float = LEASE_S,
    timeout_s: float = channels.TIMEOUT_S,
) -> SendReport:
    """One round: claim up to `batch` due messages, send them (targets concurrently, each target's in due order)
    and record each outcome. `now`: the time the round takes as current (tests); the clock unless given.
    Raises SQLAlchemyError when the database cannot be reached; what was claimed then waits out its lease."""
    started = time.monotonic()
    claimed = claim(sessions, now=now or datetime.now(UTC), batch=batch, lease_s=lease_s)
    report = SendReport(claimed=len(claimed))
    if not claimed:
        return report
    by_target: dict[str, list[Claimed]] = defaultdict(list)
    for item in claimed:
        by_target[item.target].append(item)
    deadline = started + lease_s / 2
    with ThreadPoolExecutor(max_workers=min(SEND_THREADS, len(by_target)), thread_name_prefix="alert-send") as pool:
        futures = [
            pool.submit(_send_target, sessions, settings, items, now=now, deadline=deadline, timeout_s=timeout_s)
            for items in by_target.values()
        ]
    errors = [exc for f in futures if (exc := f.exception()) is not None]
    for f in futures:
        if f.exception() is None:
            part = f.result()
            report.delivered += part.delivered
            report.failed += part.failed
            report.deferred += part.deferred
            report.failures.update(part.failures)
            report.working |= part.working
    if errors:
        raise errors[0]
    return report


async def _send_every(sessions: sessionmaker[Session], settings: Settings) -> None:
    reasons = FailureLog("alert sending", retried=True)
    while True:
        try:
            report = await asyncio.to_thread(send_due, sessions, settings)
            reasons.worked("the outbox")
            for target, reason in report.failures.items():
                reasons.failed(target, reason)
            for target in report.working - report.failures.keys():
                reasons.worked(target)
        except SQLAlchemyError as exc:
            reasons.failed("the outbox", f"database: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        except Exception as exc:  # the loop must outlive a bug in one round
            log.exception("alert sending failed")
            reasons.failed("the outbox", type(exc).__name__)
        await asyncio.sleep(settings.alerts_send_s)


def sender_job(engine: Engine, settings: Settings) -> asyncio.Task[None]:
    """Send due messages every `GPUFLEET_ALERTS_SEND_S`; the caller cancels the task on shutdown."""
    return asyncio.create_task(_send_every(make_sessionmaker(engine), settings))


@dataclass(frozen=True)
class TargetStatus:
    """One target's queue, for the dashboard; `target` as `display_target` shows it."""

    channel: str
    target: str
    queued: int
    """Messages not sent yet."""
    oldest_due: datetime | None
    """The earliest `due_at` of those: when the next try is due."""
    waiting_since: datetime | None
    """When the oldest of those was queued."""
    last_error: str | None
    """Why they wait: the error of the queued message tried most often."""
    sent_last_day: int
    last_sent_at: datetime | None


_STATUS = text(
    """
    SELECT channel, target,
           count(*) FILTER (WHERE sent_at IS NULL),
           min(due_at) FILTER (WHERE sent_at IS NULL),
           min(created_at) FILTER (WHERE sent_at IS NULL),
           (array_agg(last_error ORDER BY attempts DESC, due_at DESC)
               FILTER (WHERE sent_at IS NULL AND last_error IS NOT NULL))[1],
           count(*) FILTER (WHERE sent_at >= :since),
           max(sent_at)
    FROM alert_outbox
    WHERE sent_at IS NULL OR sent_at >= :since
    GROUP BY channel, target
    """
)


def outbox_status(session: Session, *, now: datetime | None = None) -> list[TargetStatus]:
    """Per target: what is queued, since when, why it waits, and what was sent in the last day (to `now`).
    Targets with nothing queued and nothing sent in that day are left out; those with an error come first."""
    since = (now or datetime.now(UTC)) - timedelta(days=1)
    rows = session.execute(_STATUS, {"since": since}).all()
    out = [
        TargetStatus(
            channel=r[0],
            target=display_target(r[1]),
            queued=r[2],
            oldest_due=r[3],
            waiting_since=r[4],
            last_error=r[5],
            sent_last_day=r[6],
            last_sent_at=r[7],
        )
        for r in rows
    ]
    return sorted(out, key=lambda s: (s.last_error is None, -s.queued, s.channel, s.target))
