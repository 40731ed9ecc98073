"""Alert rules (docs/alerts.md, "Rules"): the rule as the server works with it, and the functions that keep rules in
`alert_rules`. Requests are checked by app/alerts/schemas.py, answers made by app/alerts/outputs.py, durations,
URLs and addresses read by app/alerts/fields.py.

The functions take the caller's session and never commit: a request's session dependency does, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import null, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..analyse.window import Filters
from ..errors import ApiError, FieldProblem
from .tables import alert_rules

NEEDS_FOR = ("gpu_idle", "slice_underused", "mig_unpartitioned", "agent_offline")
"""Conditions that must hold `for` a while before an incident opens."""
MAY_STOP = NEEDS_FOR
"""Conditions about one instance, which the stop action may act on."""
HELD = ("gpu_idle", "slice_underused", "agent_offline", "spot_interruption")
"""Conditions about a GPU, a slice or an instance, which processes hold: those whose scope may name users."""
FILE = "file"

# The rule --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One fixed destination: a Slack incoming webhook, a signed generic webhook, or email addresses."""

    channel: str
    """slack, webhook or email."""
    url: str | None = None
    """slack and webhook."""
    to: tuple[str, ...] = ()
    """email: the addresses."""
    secret: str | None = None
    """webhook: the HMAC-SHA256 signing secret. Never shown once stored."""

    def as_json(self) -> dict[str, Any]:
        if self.channel == "email":
            return {"channel": "email", "to": list(self.to)}
        out: dict[str, Any] = {"channel": self.channel, "url": self.url}
        if self.channel == "webhook":
            out["secret"] = self.secret
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Target:
        return cls(str(data["channel"]), data.get("url"), tuple(data.get("to") or ()), data.get("secret"))

    @property
    def shown(self) -> str:
        """What the page shows: the URL, or the addresses comma-separated."""
        return ", ".join(self.to) if self.channel == "email" else self.url or ""


@dataclass(frozen=True)
class Route:
    """Where a rule's messages go. `owner` False: always to `target`. `owner` True: to the instance's owner (an
    owner tag, or the holder's user through GPUFLEET_USER_EMAILS), else to the team tag's route, else to `target`
    (the fallback; None: nowhere)."""

    target: Target | None
    owner: bool = False

    @property
    def kind(self) -> str:
        """owner, or the fixed target's channel."""
        return "owner" if self.owner else self.target.channel if self.target else "none"

    def as_json(self) -> dict[str, Any]:
        if self.owner:
            return {"owner": True, "fallback": self.target.as_json() if self.target else None}
        assert self.target is not None
        return self.target.as_json()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Route:
        if data.get("owner"):
            fallback = data.get("fallback")
            return cls(Target.from_json(fallback) if fallback else None, owner=True)
        return cls(Target.from_json(data))


@dataclass(frozen=True)
class Scope:
    """Which instances and holders a rule watches, as the dashboard's filters; empty: the whole fleet."""

    regions: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    lifecycles: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs; an instance must carry all of them."""
    users: tuple[str, ...] = ()
    """The users holding the GPU (as the holders' grouping names them); empty: anyone or no one."""

    def filters(self) -> Filters:
        """The instance filters of the analysis (`users` is matched on holders, apart)."""
        return Filters(self.regions, self.instance_types, self.lifecycles, self.tags)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("regions", "instance_types", "lifecycles"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        if self.tags:
            out["tags"] = dict(self.tags)
        if self.users:
            out["holders"] = {"user": list(self.users)}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scope:
        holders = data.get("holders") or {}
        return cls(
            regions=tuple(data.get("regions") or ()),
            instance_types=tuple(data.get("instance_types") or ()),
            lifecycles=tuple(data.get("lifecycles") or ()),
            tags=tuple((str(k), str(v)) for k, v in (data.get("tags") or {}).items()),
            users=tuple(holders.get("user") or ()),
        )


@dataclass(frozen=True)
class Stop:
    """The optional stop action: EC2 StopInstances after the notice and `grace_s`, unless snoozed."""

    dry_run: bool = True
    grace_s: int = 3600
    """Seconds between the notice and the stop."""
    spot: bool = False
    """Also stop spot instances."""
    capacity_block: bool = False
    """Also stop instances in a Capacity Block for ML."""

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "grace_s": self.grace_s,
            "spot": self.spot,
            "capacity_block": self.capacity_block,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stop:
        return cls(bool(data["dry_run"]), int(data["grace_s"]), bool(data["spot"]), bool(data["capacity_block"]))


@dataclass(frozen=True)
class Origin:
    """Where a rule of the rule file is written: the file and the line of its `[[rule]]` header."""

    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Rule:
    """One rule, checked (app/alerts/schemas.py `to_rule`)."""

    name: str
    condition: str
    route: Route
    for_hours: float | None = None
    """How long the condition must hold before an incident opens, h."""
    usd_per_day: float | None = None
    """tag_waste: waste above this per day, USD."""
    tag_key: str | None = None
    """tag_waste: the tag whose values are compared."""
    scope: Scope = field(default_factory=Scope)
    quiet_s: int = 0
    """No new incident for a subject this long after one closed, s."""
    remind_s: int | None = None
    """A reminder after an incident has stayed open this long, s; None: none."""
    stop: Stop | None = None
    enabled: bool = True
    source: str = "api"
    id: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    updated_by: str | None = None
    origin: Origin | None = field(default=None, compare=False)
    """File rules: where in the file; not stored."""

    @property
    def for_s(self) -> int | None:
        return None if self.for_hours is None else round(self.for_hours * 3600)

    def same_content(self, other: Rule) -> bool:
        """The same rule, whoever made it and whenever."""
        return _content(self) == _content(other)


def _content(rule: Rule) -> dict[str, Any]:
    return {
        "name": rule.name,
        "condition": rule.condition,
        "for_hours": rule.for_hours,
        "usd_per_day": rule.usd_per_day,
        "tag_key": rule.tag_key,
        "scope": rule.scope.as_json(),
        "route": rule.route.as_json(),
        "quiet_s": rule.quiet_s,
        "remind_s": rule.remind_s,
        "stop": rule.stop.as_json() if rule.stop else None,
        "enabled": rule.enabled,
    }


def _values(rule: Rule) -> dict[str, Any]:
    """The columns a rule sets; a rule without a stop action stores SQL NULL, not JSON null."""
    values = _content(rule)
    if values["stop"] is None:
        values["stop"] = null()
    return values


def _from_row(row: Row[Any]) -> Rule:
    m = row._mapping
    return Rule(
        id=m["id"],
        name=m["name"],
        condition=m["condition"],
        for_hours=m["for_hours"],
        usd_per_day=m["usd_per_day"],
        tag_key=m["tag_key"],
        scope=Scope.from_json(m["scope"] or {}),
        route=Route.from_json(m["route"]),
        quiet_s=m["quiet_s"],
        remind_s=m["remind_s"],
        stop=Stop.from_json(m["stop"]) if m["stop"] else None,
        enabled=m["enabled"],
        source=m["source"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        updated_by=m["updated_by"],
    )


# Keeping them ----------------------------------------------------------------------------------------------------


def list_rules(session: Session) -> list[Rule]:
    """Every rule, by name."""
    return [_from_row(r) for r in session.execute(select(alert_rules).order_by(alert_rules.c.name))]


def get_rule(session: Session, key: int | str) -> Rule | None:
    """The rule of that name; else, for a number, of that id."""
    row = session.execute(select(alert_rules).where(alert_rules.c.name == str(key))).first()
    if row is None and (isinstance(key, int) or key.isdigit()) and int(key) < 2**31:
        row = session.execute(select(alert_rules).where(alert_rules.c.id == int(key))).first()
    return _from_row(row) if row is not None else None


def _taken(name: str) -> ApiError:
    return ApiError(409, "a rule of that name exists", [FieldProblem("name", f"{name!r} is taken: choose another")])


def _from_file(rule: Rule) -> ApiError:
    return ApiError(
        409,
        f"rule {rule.name!r} comes from the rule file (GPUFLEET_ALERTS_FILE): change it there",
        [FieldProblem("name", "a rule from the rule file is changed in the file, then `gpufleet serve` restarted")],
    )


def _existing(session: Session, name: str) -> Rule:
    rule = get_rule(session, name)
    if rule is None:
        raise ApiError(404, "no such rule", [FieldProblem("name", f"no rule named {name!r}")])
    if rule.source == FILE:
        raise _from_file(rule)
    return rule


def create_rule(session: Session, rule: Rule, *, by: str, now: datetime) -> Rule:
    """Store a new rule; 409 naming `name` if one of that name exists."""
    stored = session.execute(
        insert(alert_rules)
        .values(**_values(rule), source=rule.source, created_at=now, updated_at=now, updated_by=by)
        .on_conflict_do_nothing(index_elements=[alert_rules.c.name])
        .returning(*alert_rules.c)
    ).first()
    if stored is None:
        raise _taken(rule.name)
    return _from_row(stored)


def replace_rule(session: Session, name: str, rule: Rule, *, by: str, now: datetime) -> Rule:
    """Replace the rule called `name` (it may be renamed); it keeps its id, source and incidents. 404 if there is
    none, 409 if it comes from the rule file or the new name is taken."""
    old = _existing(session, name)
    statement = (
        alert_rules.update()
        .where(alert_rules.c.id == old.id)
        .values(**_values(rule), updated_at=now, updated_by=by)
        .returning(*alert_rules.c)
    )
    try:
        with session.begin_nested():
            row = session.execute(statement).one()
    except IntegrityError:
        raise _taken(rule.name) from None
    return _from_row(row)


def delete_rule(session: Session, name: str) -> Rule:
    """Delete the rule called `name`, its incidents with it; the rule as it was. 404 / 409 as `replace_rule`."""
    old = _existing(session, name)
    session.execute(alert_rules.delete().where(alert_rules.c.id == old.id))
    return old


def set_enabled(session: Session, name: str, enabled: bool, *, by: str, now: datetime) -> Rule:
    """Turn the rule called `name` on or off. 404 / 409 as `replace_rule`."""
    old = _existing(session, name)
    if old.enabled == enabled:
        return old
    row = session.execute(
        alert_rules.update()
        .where(alert_rules.c.id == old.id)
        .values(enabled=enabled, updated_at=now, updated_by=by)
        .returning(*alert_rules.c)
    ).one()
    return _from_row(row)


def store_file_rules(
    session: Session, rules: Sequence[Rule], *, by: str, now: datetime
) -> tuple[list[str], list[str], list[str]]:
    """Make the file rules in the database those of `rules` (already checked against other sources): the names
    created, replaced and deleted."""
    stored = {r.name: r for r in list_rules(session) if r.source == FILE}
    created, replaced = [], []
    for rule in rules:
        old = stored.pop(rule.name, None)
        if old is None:
            create_rule(session, replace(rule, source=FILE), by=by, now=now)
            created.append(rule.name)
        elif not old.same_content(rule):
            session.execute(
                alert_rules.update()
                .where(alert_rules.c.id == old.id)
                .values(**_values(rule), updated_at=now, updated_by=by)
            )
            replaced.append(rule.name)
    if stored:
        session.execute(alert_rules.delete().where(alert_rules.c.id.in_([r.id for r in stored.values()])))
    return created, replaced, sorted(stored)
