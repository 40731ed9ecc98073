"""The /alerts page: the rules (secrets hidden), the recent incidents, the recent actions and the delivery per target;
and the rule form, its values as the browser sends them and its problems by form field."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import and_, func, select, true
from sqlalchemy.orm import Session

from ...alerts.fields import format_duration
from ...alerts.outbox import TargetStatus, outbox_status
from ...alerts.rules import NEEDS_FOR, Rule, Target, list_rules
from ...alerts.snooze import Snooze, recent_snoozes
from ...alerts.tables import alert_actions, alert_incidents, alert_rules, alert_snoozes
from ..templating import usd

RECENT = 20
"""Incidents, actions and snoozes shown."""

CONDITION_TEXT = {
    "gpu_idle": "GPU idle or idle-held",
    "slice_underused": "MIG slice under-used",
    "mig_unpartitioned": "MIG capacity unpartitioned",
    "agent_offline": "agent offline while the instance runs",
    "tag_waste": "a tag value's waste per day",
    "spot_interruption": "spot interruption notice",
}


@dataclass(frozen=True)
class TargetView:
    channel: str
    """slack, webhook or email."""
    target: str
    """The URL, or the addresses comma-separated."""
    secret_set: bool
    """webhook: a signing secret is stored (it is never shown)."""

    @classmethod
    def of(cls, target: Target) -> TargetView:
        return cls(target.channel, target.shown, bool(target.secret))


@dataclass(frozen=True)
class RuleRow:
    name: str
    condition: str
    condition_text: str
    """The condition in words, with its duration or threshold."""
    scope: list[str]
    """The scope's filters in words, such as `region us-east-1`; empty: the whole fleet."""
    route_kind: str
    """slack, webhook, email, or owner (the instance's owner, else the team tag's route, else `target`)."""
    target: TargetView | None
    """Where messages go; for an owner route the fallback (None: none)."""
    quiet: str
    remind: str | None
    stop: str | None
    """The stop action in words; None: none."""
    source: str
    """api, page or file: a rule from the rule file is changed in the file."""
    enabled: bool
    updated_at: datetime | None
    updated_by: str | None


@dataclass(frozen=True)
class IncidentRow:
    id: int
    rule: str
    subject: str
    """What it is about: gpu:<uuid>, slice:<uuid>, instance:<id> or tag:<key>=<value>."""
    since: datetime
    """When the condition started holding."""
    opened_at: datetime
    closed_at: datetime | None
    """None: still open."""
    snoozed_until: datetime | None
    """Until when the latest snooze holds it (it may have passed)."""
    snoozed: bool
    """Open and snoozed now: no messages, no stop."""
    snoozed_by: str | None
    """Who made the latest snooze (a name given on the snooze page, `snooze link` without one)."""
    snooze_reason: str | None
    """The latest snooze's reason."""
    snoozed_at: datetime | None
    """When the latest snooze was made."""
    stop_at: datetime | None
    """When a pending stop action is due, unless the incident is snoozed first; None: none pending."""


@dataclass(frozen=True)
class ActionRow:
    id: int
    rule: str | None
    """None: the rule has been deleted."""
    instance_id: str
    action: str
    dry_run: bool
    status: str
    """pending, cancelled, done, dry-run or failed."""
    due_at: datetime
    done_at: datetime | None
    by: str
    detail: str | None


@dataclass(frozen=True)
class AlertsView:
    rules: list[RuleRow]
    incidents: list[IncidentRow]
    """The most recently opened first."""
    actions: list[ActionRow]
    """The most recently created first."""
    rule_file: str | None
    """GPUFLEET_ALERTS_FILE, where file rules are changed; None: not set."""
    delivery: list[TargetStatus] = field(default_factory=list)
    """The outbox per target, failing ones first."""
    snoozes: list[Snooze] = field(default_factory=list)
    """The most recent snoozes first: who, until when, why."""


def _condition_text(rule: Rule) -> str:
    text = CONDITION_TEXT.get(rule.condition, rule.condition)
    if rule.condition in NEEDS_FOR and rule.for_s is not None:
        return f"{text} for {format_duration(rule.for_s)}"
    if rule.condition == "tag_waste":
        return f"waste per {rule.tag_key} value over {usd(rule.usd_per_day)} a day"
    return text


def _scope(rule: Rule) -> list[str]:
    s = rule.scope
    words = [f"region {', '.join(s.regions)}"] if s.regions else []
    words += [f"type {', '.join(s.instance_types)}"] if s.instance_types else []
    words += [f"lifecycle {', '.join(s.lifecycles)}"] if s.lifecycles else []
    words += [f"tag {k}={v}" for k, v in s.tags]
    words += [f"user {', '.join(s.users)}"] if s.users else []
    return words


def _stop(rule: Rule) -> str | None:
    stop = rule.stop
    if stop is None:
        return None
    also = [w for w, on in (("spot", stop.spot), ("Capacity Block", stop.capacity_block)) if on]
    words = f"stop after {format_duration(stop.grace_s)}" + (" (dry run)" if stop.dry_run else "")
    return words + (f", also {' and '.join(also)} instances" if also else "")


def rule_row(rule: Rule) -> RuleRow:
    return RuleRow(
        name=rule.name,
        condition=rule.condition,
        condition_text=_condition_text(rule),
        scope=_scope(rule),
        route_kind=rule.route.kind,
        target=TargetView.of(rule.route.target) if rule.route.target else None,
        quiet=format_duration(rule.quiet_s),
        remind=format_duration(rule.remind_s) if rule.remind_s is not None else None,
        stop=_stop(rule),
        source=rule.source,
        enabled=rule.enabled,
        updated_at=rule.updated_at,
        updated_by=rule.updated_by,
    )


def build_alerts(session: Session, *, rule_file: str | None) -> AlertsView:
    r, a, s = alert_rules.c, alert_actions.c, alert_snoozes.c
    # The newest incidents first, then each one's latest snooze and next pending stop (by index, 20 times).
    recent = (
        select(alert_incidents).order_by(alert_incidents.c.opened_at.desc(), alert_incidents.c.id.desc()).limit(RECENT)
    ).subquery("recent")
    i = recent.c
    latest = (
        select(s.by, s.reason, s.created_at)
        .where(s.incident_id == i.id)
        .order_by(s.created_at.desc(), s.id.desc())
        .limit(1)
        .lateral("latest")
    )
    stop = (
        select(func.min(a.due_at).label("due_at")).where(a.incident_id == i.id, a.status == "pending").lateral("stop")
    )
    incidents = session.execute(
        select(
            i.id,
            r.name.label("rule"),
            i.subject,
            i.since,
            i.opened_at,
            i.closed_at,
            i.snoozed_until,
            and_(i.closed_at.is_(None), i.snoozed_until > func.now()).is_(true()).label("snoozed"),
            latest.c.by.label("snoozed_by"),
            latest.c.reason.label("snooze_reason"),
            latest.c.created_at.label("snoozed_at"),
            stop.c.due_at.label("stop_at"),
        )
        .select_from(recent)
        .join(alert_rules, r.id == i.rule_id)
        .outerjoin(latest, true())
        .outerjoin(stop, true())
        .order_by(i.opened_at.desc(), i.id.desc())
    )
    actions = session.execute(
        select(
            a.id,
            r.name.label("rule"),
            a.instance_id,
            a.action,
            a.dry_run,
            a.status,
            a.due_at,
            a.done_at,
            a.by,
            a.detail,
        )
        .outerjoin(alert_rules, r.id == a.rule_id)
        .order_by(a.created_at.desc(), a.id.desc())
        .limit(RECENT)
    )
    return AlertsView(
        rules=[rule_row(rule) for rule in list_rules(session)],
        incidents=[IncidentRow(**row._mapping) for row in incidents],
        actions=[ActionRow(**row._mapping) for row in actions],
        rule_file=rule_file,
        delivery=outbox_status(session),
        snoozes=recent_snoozes(session, limit=RECENT),
    )


@dataclass
class RuleForm:
    """The add or edit form: what it holds (as the browser sends it) and what is wrong, by form field."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    editing: str | None = None
    """The name of the rule being edited; None: a new rule."""
    secret_set: dict[str, bool] = field(default_factory=dict)
    """route_secret / fallback_secret: the edited rule has one stored, kept when the field is left empty."""

    def value(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def checked(self, name: str) -> bool:
        return self.values.get(name) in ("on", "true", "1")
