"""Incidents (docs/alerts.md, "Incidents"): one per stretch of time a rule's condition holds for a subject, and the
messages about it, queued in the outbox in the same transaction as the incident's change.

`apply` takes what a rule finds now and brings the rule's incidents in line with it:
- a subject found with no open incident opens one (unless one closed less than the rule's `quiet_s` ago), queues
  an `open` message to each target and, for a rule with a stop action, plans the stop;
- an open incident whose subject is still found keeps it, with the figures of this evaluation, and queues a
  `reminder` every `remind_s` while it is not snoozed;
- an open incident whose subject is no longer found closes, queues a `closed` message and cancels a pending stop.

Nothing is sent twice: the open incident of a rule and subject is unique (an index; `INSERT ... ON CONFLICT DO
NOTHING`), a reminder or a close happens only if the row is still as it was read (another process's change wins),
and every message's id is derived from the incident, the kind, the reminder's number and the target, so
evaluating again queues nothing new. Nothing is committed here: the caller's transaction holds the incidents and
their messages together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, literal, or_, select, text, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.orm import Session

from ..settings import Settings
from . import links, messages, outbox, recipients, snooze, stop
from .details import FIGURES, details_of, finding_of
from .findings import Finding
from .rules import Rule
from .tables import alert_actions, alert_incidents

GONE = "the condition no longer holds"
TURNED_OFF = "the rule is turned off"
INSERT_CHUNK = 5000
"""Incidents per INSERT: seven parameters each, under PostgreSQL's 65,535 per statement."""
REFRESH_ROUNDS = 5
"""An open incident's kept figures (dollars so far, holders, names) follow its finding every this many rounds: each
round keeps those of the fifth of a rule's open incidents whose figures are oldest. Keeping all of them every round
was most of an evaluation's cost with thousands open (bench/alerts.py)."""


@dataclass
class Applied:
    """What one `apply` did."""

    opened: list[int] = field(default_factory=list)
    updated: int = 0
    """Open incidents whose figures were refreshed."""
    reminded: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    quiet: list[str] = field(default_factory=list)
    """Subjects found but held back: an incident of theirs closed less than `quiet_s` ago."""
    queued: int = 0
    """Messages newly put in the outbox."""
    untold: list[int] = field(default_factory=list)
    """Incidents opened with no one to tell."""


# Slotted, not frozen: thousands are read per evaluation, and a frozen dataclass's __init__ costs several times more.
@dataclass(slots=True)
class _Open:
    """An open incident as an evaluation reads it; its details are read only where needed (closing)."""

    id: int
    subject: str
    since: datetime
    opened_at: datetime
    reminded_at: datetime | None
    snoozed_until: datetime | None
    reminders: int
    """Reminders queued so far."""
    untold: bool
    """No one was told when it opened."""
    figures_at: float | None
    """When its figures were last kept (Unix s); None: when it opened, before figures had a time."""


def _told(settings: Settings, rule: Rule, finding: Finding, targets: Sequence[recipients.Target]) -> dict[str, Any]:
    if not targets:
        return {"told": [], "not_told": recipients.no_one_told(settings, rule, finding)}
    return {"told": [{"channel": t.channel, "to": t.shown, "via": t.via} for t in targets], "not_told": None}


def _merged(values: Mapping[str, Any]) -> ColumnElement[Any]:
    """The incident's details with `values` set (jsonb `||`)."""
    return alert_incidents.c.details.op("||")(literal(dict(values), JSONB))


class _Links:
    """The links of the messages of one `apply`; the signing key is read once, and only when a link needs it."""

    def __init__(self, session: Session, settings: Settings, now: datetime) -> None:
        self._session, self._settings, self._now = session, settings, now
        self._key: bytes | None = None

    def page(self, finding: Finding) -> str:
        path = finding.page if finding.page.startswith("/") and not finding.page.startswith("//") else "/"
        return links.page_url(self._settings, path)

    def snooze(self, incident_id: int) -> str:
        if self._key is None:
            self._key = snooze.signing_key(self._session, self._settings)
        return links.snooze_url(self._settings, self._key, incident_id, now=self._now)


def _messages(
    targets: Sequence[recipients.Target],
    about: messages.About,
    *parts: object,
) -> list[outbox.Message]:
    """`about` to each target; the message id is the incident, `parts` (the kind, a reminder's number) and the
    target, so the same message is never queued twice."""
    return [
        outbox.Message(
            message_id=outbox.message_id("incident", about.incident_id, *parts, t.channel, t.to),
            incident_id=about.incident_id,
            kind=about.kind,
            channel=t.channel,
            target=t.to,
            secret=t.secret,
            payload=messages.payload(t.channel, about),
        )
        for t in targets
    ]


_OPEN = text(
    """
    SELECT id, subject, since, opened_at, reminded_at, snoozed_until,
           coalesce((details->>'reminders')::int, 0),
           coalesce(jsonb_array_length(details->'told'), 0) = 0,
           (details->>'figures_at')::float8
    FROM alert_incidents
    WHERE rule_id = :rule_id AND closed_at IS NULL
    ORDER BY id
    """
)


def _open_incidents(session: Session, rule_id: int) -> dict[str, _Open]:
    # Not locked: every change below is conditional on what was read (closed_at still NULL, reminded_at still as
    # read), so a process that changed the row meanwhile wins and this one does nothing.
    return {r[1]: _Open(*r) for r in session.execute(_OPEN, {"rule_id": rule_id}).all()}


def _pending_stop(session: Session, incident_id: int) -> datetime | None:
    a = alert_actions.c
    due: datetime | None = session.scalar(
        select(func.min(a.due_at)).where(a.incident_id == incident_id, a.status == "pending", a.action == stop.ACTION)
    )
    return due


def _in_quiet(session: Session, rule: Rule, subjects: Sequence[str], now: datetime) -> set[str]:
    if rule.quiet_s <= 0 or not subjects:
        return set()
    i = alert_incidents.c
    rows = session.execute(
        select(i.subject)
        .distinct()
        .where(
            i.rule_id == rule.id,
            i.subject.in_(subjects),
            i.closed_at.is_not(None),
            i.closed_at > now - timedelta(seconds=rule.quiet_s),
        )
    )
    return set(rows.scalars())


def _open(
    session: Session, settings: Settings, rule: Rule, found: Sequence[Finding], now: datetime, applied: Applied
) -> None:
    if not found:
        return
    routed = {f.subject: recipients.targets(settings, rule, f) for f in found}
    by_subject = {f.subject: f for f in found}
    rows = [
        {
            "rule_id": rule.id,
            "subject": f.subject,
            "instance_pk": f.instance_pk,
            "device_id": f.device_id,
            "since": f.since,
            "opened_at": now,
            "details": {**details_of(f), **_told(settings, rule, f, routed[f.subject]), "figures_at": now.timestamp()},
        }
        for f in found
    ]
    i = alert_incidents.c
    # A process that opened the same incident meanwhile wins; this one then has nothing to add.
    opened: list[Any] = []
    for first in range(0, len(rows), INSERT_CHUNK):
        stmt = (
            insert(alert_incidents)
            .values(rows[first : first + INSERT_CHUNK])
            .on_conflict_do_nothing(index_elements=[i.rule_id, i.subject], index_where=i.closed_at.is_(None))
            .returning(i.id, i.subject)
        )
        opened += session.execute(stmt).all()
    link = _Links(session, settings, now)
    queue: list[outbox.Message] = []
    for incident_id, subject in sorted(opened):
        f = by_subject[subject]
        stop_at = stop.plan_stop(session, rule, incident_id, f, now=now) if rule.stop is not None else None
        if stop_at is not None:
            session.execute(
                update(alert_incidents)
                .where(i.id == incident_id)
                .values(details=_merged({"stop_at": stop_at.isoformat()}))
            )
        targets = routed[subject]
        about = messages.About(
            kind="open",
            incident_id=incident_id,
            rule=rule.name,
            condition=rule.condition,
            finding=f,
            at=now,
            dashboard_url=link.page(f),
            snooze_url=link.snooze(incident_id),
            stop_at=stop_at,
            stop_dry_run=bool(rule.stop and rule.stop.dry_run),
        )
        queue += _messages(targets, about, "open")
        applied.opened.append(incident_id)
        if not targets:
            applied.untold.append(incident_id)
    applied.queued += outbox.enqueue_many(session, queue)


_REFRESH = text(
    """
    UPDATE alert_incidents AS i SET details = i.details || d.details
    FROM jsonb_to_recordset(:rows) AS d(id bigint, details jsonb)
    WHERE i.id = d.id AND i.details || d.details IS DISTINCT FROM i.details
    """
).bindparams(bindparam("rows", type_=JSONB))


def _refresh(
    session: Session, settings: Settings, rule: Rule, still: Sequence[tuple[_Open, Finding]], now: datetime
) -> int:
    """Keep this evaluation's figures (dollars, holders, names) in the open incidents whose turn it is
    (`REFRESH_ROUNDS`), in one statement. Open and reminder messages are written from the finding itself; the
    closed message, written when the finding is gone, reads these, `REFRESH_ROUNDS` rounds old at most."""
    if not still:
        return 0
    now_s = now.timestamp()
    oldest_first = sorted(still, key=lambda pair: -1.0 if pair[0].figures_at is None else pair[0].figures_at)
    due = oldest_first[: -(-len(still) // REFRESH_ROUNDS)]
    rows = []
    for inc, f in due:
        kept = details_of(f)
        details = {key: kept[key] for key in FIGURES} | {"figures_at": now_s}
        if inc.untold:
            # No one was told when it opened: say so with this evaluation's reason, which may have changed.
            details["not_told"] = recipients.no_one_told(settings, rule, f)
        rows.append({"id": inc.id, "details": details})
    result = session.execute(_REFRESH, {"rows": rows})
    return int(getattr(result, "rowcount", 0) or 0)


def _reminder_due(rule: Rule, inc: _Open, now: datetime) -> bool:
    if rule.remind_s is None or rule.remind_s <= 0:
        return False
    if inc.snoozed_until is not None and inc.snoozed_until > now:
        return False
    return now >= (inc.reminded_at or inc.opened_at) + timedelta(seconds=rule.remind_s)


def _remind(
    session: Session, settings: Settings, rule: Rule, inc: _Open, f: Finding, now: datetime, link: _Links
) -> int | None:
    """Queue the incident's next reminder; how many messages were new, None when another process reminded it."""
    n = inc.reminders + 1
    i = alert_incidents.c
    # Only if no one reminded, snoozed or closed it since it was read; else that process's change stands.
    claimed = session.execute(
        update(alert_incidents)
        .where(
            i.id == inc.id,
            i.closed_at.is_(None),
            i.reminded_at.is_(None) if inc.reminded_at is None else i.reminded_at == inc.reminded_at,
            or_(i.snoozed_until.is_(None), i.snoozed_until <= now),
        )
        .values(reminded_at=now, details=_merged({"reminders": n}))
        .returning(i.id)
    ).first()
    if claimed is None:
        return None
    f = replace(f, since=inc.since)
    about = messages.About(
        kind="reminder",
        incident_id=inc.id,
        rule=rule.name,
        condition=rule.condition,
        finding=f,
        at=now,
        dashboard_url=link.page(f),
        snooze_url=link.snooze(inc.id),
        stop_at=_pending_stop(session, inc.id),
        stop_dry_run=bool(rule.stop and rule.stop.dry_run),
        reminder=n,
    )
    return outbox.enqueue_many(session, _messages(recipients.targets(settings, rule, f), about, "reminder", n))


def _close(
    session: Session,
    settings: Settings,
    rule: Rule,
    gone: Sequence[_Open],
    now: datetime,
    reason: str,
    applied: Applied,
) -> None:
    if not gone:
        return
    i = alert_incidents.c
    # Only those still open: a process that closed one meanwhile has sent its message.
    closed = session.execute(
        update(alert_incidents)
        .where(i.id.in_([inc.id for inc in gone]), i.closed_at.is_(None))
        .values(closed_at=now, details=_merged({"closed_reason": reason}))
        .returning(i.id, i.subject, i.since, i.instance_pk, i.device_id, i.details)
    ).all()
    link = _Links(session, settings, now)
    queue: list[outbox.Message] = []
    for incident_id, subject, since, instance_pk, device_id, details in sorted(closed):
        stop.cancel_pending(
            session, incident_id, by=f"rule {rule.name}", reason=f"the incident closed: {reason}", now=now
        )
        f = finding_of(subject, since, instance_pk, device_id, details)
        about = messages.About(
            kind="closed",
            incident_id=incident_id,
            rule=rule.name,
            condition=rule.condition,
            finding=f,
            at=now,
            dashboard_url=link.page(f),
            reason=reason,
        )
        queue += _messages(recipients.targets(settings, rule, f), about, "closed")
        applied.closed.append(incident_id)
    applied.queued += outbox.enqueue_many(session, queue)


def apply(session: Session, settings: Settings, rule: Rule, findings: Sequence[Finding], *, now: datetime) -> Applied:
    """Bring `rule`'s incidents in line with what it finds now (`findings`, one per subject), in the caller's
    transaction: open, refresh, remind, close, and queue their messages. `now`: the evaluation's time."""
    assert rule.id is not None, "a stored rule"
    applied = Applied()
    found = {f.subject: f for f in findings}
    current = _open_incidents(session, rule.id)
    _close(session, settings, rule, [inc for s, inc in current.items() if s not in found], now, GONE, applied)
    still = [(inc, found[s]) for s, inc in current.items() if s in found]
    applied.updated = _refresh(session, settings, rule, still, now)
    link = _Links(session, settings, now)
    for inc, f in still:
        if _reminder_due(rule, inc, now):
            queued = _remind(session, settings, rule, inc, f, now, link)
            if queued is not None:
                applied.queued += queued
                applied.reminded.append(inc.id)
    new = [f for s, f in found.items() if s not in current]
    quiet = _in_quiet(session, rule, [f.subject for f in new], now)
    applied.quiet = sorted(quiet)
    _open(session, settings, rule, [f for f in new if f.subject not in quiet], now, applied)
    return applied


def retire(session: Session, settings: Settings, rule: Rule, *, now: datetime, reason: str = TURNED_OFF) -> Applied:
    """Close every open incident of `rule` (turned off), with its `closed` message and its pending stop cancelled."""
    assert rule.id is not None, "a stored rule"
    applied = Applied()
    _close(session, settings, rule, list(_open_incidents(session, rule.id).values()), now, reason, applied)
    return applied
