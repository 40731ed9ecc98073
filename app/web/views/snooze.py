"""The snooze page of one incident (app/web/snooze.py): what it is about, as its message said (rule, subject, since
when, where, dollars, who holds it), whether it is snoozed or about to be stopped, and its snoozes so far."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...alerts.snooze import Snooze, recent_snoozes
from ...alerts.tables import alert_actions, alert_incidents, alert_rules
from .alerts import CONDITION_TEXT

SHOWN_SNOOZES = 20


@dataclass(frozen=True)
class SnoozeView:
    incident_id: int
    rule: str
    condition: str
    condition_text: str
    subject: str
    """gpu:<uuid>, slice:<uuid>, instance:<id>, tag:<key>=<value> ..."""
    what: str | None
    """One line saying what holds, as the message said it."""
    instance: str | None
    """The instance's name and id, when the incident is about one."""
    device: str | None
    """The GPU or slice in words, when one."""
    holders: list[str]
    since: datetime
    """When the condition started holding."""
    opened_at: datetime
    closed_at: datetime | None
    """None: still open, and so it can be snoozed."""
    usd_so_far: float | None
    """What it has cost since `since`, USD, at the last evaluation; None: no price."""
    usd_per_day: float | None
    """What it costs per day while it lasts, USD/day; None: no price."""
    page: str | None
    """The dashboard path that shows it (a login is needed there)."""
    snoozed_until: datetime | None
    snoozed: bool
    """Open and snoozed now."""
    stop_at: datetime | None
    """When a pending stop action will stop the instance, unless snoozed first; None: none pending."""
    stop_dry_run: bool
    link_expires_at: datetime
    """The snooze link works until then."""
    newer_open_since: datetime | None
    """For a closed incident: when the open incident of the same rule and subject, if any, started holding."""
    snoozes: list[Snooze] = field(default_factory=list)
    """This incident's snoozes, newest first."""


def _text(details: dict[str, Any], key: str) -> str | None:
    value = details.get(key)
    return str(value) if isinstance(value, str | int | float) and str(value).strip() else None


def _usd(details: dict[str, Any], key: str) -> float | None:
    value = details.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _instance(details: dict[str, Any]) -> str | None:
    name, instance_id = _text(details, "instance_name"), _text(details, "instance_id")
    if name and instance_id and name != instance_id:
        return f"{name} ({instance_id})"
    return name or instance_id


def build_snooze(session: Session, incident_id: int, *, link_expires_at: datetime, now: datetime) -> SnoozeView | None:
    """The page of `incident_id`; None when there is no such incident."""
    i, a = alert_incidents.c, alert_actions.c
    row = session.execute(
        select(
            i.id,
            i.rule_id,
            alert_rules.c.name,
            alert_rules.c.condition,
            i.subject,
            i.since,
            i.opened_at,
            i.closed_at,
            i.snoozed_until,
            i.details,
        )
        .join(alert_rules, alert_rules.c.id == i.rule_id)
        .where(i.id == incident_id)
    ).first()
    if row is None:
        return None
    pending = session.execute(
        select(a.due_at, a.dry_run)
        .where(a.incident_id == incident_id, a.status == "pending")
        .order_by(a.due_at)
        .limit(1)
    ).first()
    newer = None
    if row.closed_at is not None:
        newer = session.scalar(
            select(i.since).where(i.rule_id == row.rule_id, i.subject == row.subject, i.closed_at.is_(None)).limit(1)
        )
    details: dict[str, Any] = row.details if isinstance(row.details, dict) else {}
    holders = details.get("holders")
    open_ = row.closed_at is None
    return SnoozeView(
        incident_id=row.id,
        rule=row.name,
        condition=row.condition,
        condition_text=CONDITION_TEXT.get(row.condition, row.condition),
        subject=row.subject,
        what=_text(details, "what"),
        instance=_instance(details),
        device=_text(details, "device"),
        holders=[str(h) for h in holders] if isinstance(holders, list) else [],
        since=row.since,
        opened_at=row.opened_at,
        closed_at=row.closed_at,
        usd_so_far=_usd(details, "usd_so_far"),
        usd_per_day=_usd(details, "usd_per_day"),
        page=page if (page := _text(details, "page")) and page.startswith("/") and not page.startswith("//") else None,
        snoozed_until=row.snoozed_until,
        snoozed=open_ and row.snoozed_until is not None and row.snoozed_until > now,
        stop_at=pending.due_at if pending is not None and open_ else None,
        stop_dry_run=bool(pending.dry_run) if pending is not None else False,
        link_expires_at=link_expires_at,
        newer_open_since=newer,
        snoozes=recent_snoozes(session, limit=SHOWN_SNOOZES, incident_id=incident_id),
    )
