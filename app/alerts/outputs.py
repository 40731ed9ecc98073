"""Alert rules as the API answers them (`/api/v1/alerts`): durations as strings that read back the same, webhook
secrets never shown, only whether one is stored."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from .fields import format_duration
from .rules import Rule, Target


class TargetOut(BaseModel):
    """A destination, with its secret hidden."""

    slack: str | None = None
    webhook: str | None = None
    secret_set: bool | None = Field(default=None, description="webhook: whether a signing secret is stored.")
    email: list[str] | None = None


class RouteOut(TargetOut):
    owner: bool | None = None
    fallback: TargetOut | None = None


class StopOut(BaseModel):
    dry_run: bool
    grace: str
    spot: bool
    capacity_block: bool


class ScopeOut(BaseModel):
    regions: list[str]
    instance_types: list[str]
    lifecycles: list[str]
    tags: dict[str, str]
    users: list[str]


class RuleOut(BaseModel):
    """A stored rule; durations as strings that read back the same."""

    model_config = ConfigDict(populate_by_name=True)

    id: int
    name: str
    condition: str
    for_: str | None = Field(default=None, alias="for")
    usd_per_day: float | None = None
    tag: str | None = None
    scope: ScopeOut
    route: RouteOut
    quiet: str
    remind: str | None = None
    stop: StopOut | None = None
    enabled: bool
    source: str = Field(description="Where it was made: api, page or file (changed in the file only).")
    created_at: datetime
    updated_at: datetime
    updated_by: str | None = None


class RulesOut(BaseModel):
    rules: list[RuleOut]


def _target_out(target: Target) -> TargetOut:
    if target.channel == "email":
        return TargetOut(email=list(target.to))
    if target.channel == "webhook":
        return TargetOut(webhook=target.url, secret_set=bool(target.secret))
    return TargetOut(slack=target.url)


def rule_out(rule: Rule) -> RuleOut:
    route = rule.route
    if route.owner:
        route_out = RouteOut(owner=True, fallback=_target_out(route.target) if route.target else None)
    else:
        assert route.target is not None
        route_out = RouteOut(**_target_out(route.target).model_dump())
    stop = rule.stop
    assert rule.id is not None and rule.created_at is not None and rule.updated_at is not None
    return RuleOut(
        id=rule.id,
        name=rule.name,
        condition=rule.condition,
        for_=format_duration(rule.for_s) if rule.for_s is not None else None,
        usd_per_day=rule.usd_per_day,
        tag=rule.tag_key,
        scope=ScopeOut(
            regions=list(rule.scope.regions),
            instance_types=list(rule.scope.instance_types),
            lifecycles=list(rule.scope.lifecycles),
            tags=dict(rule.scope.tags),
            users=list(rule.scope.users),
        ),
        route=route_out,
        quiet=format_duration(rule.quiet_s),
        remind=format_duration(rule.remind_s) if rule.remind_s is not None else None,
        stop=StopOut(
            dry_run=stop.dry_run,
            grace=format_duration(stop.grace_s),
            spot=stop.spot,
            capacity_block=stop.capacity_block,
        )
        if stop
        else None,
        enabled=rule.enabled,
        source=rule.source,
        created_at=rule.created_at,
        updated_at=rule.updated_at,
        updated_by=rule.updated_by,
    )
