"""Alert rules as they come in (the API, the /alerts page's form, the rule file): pydantic models, and the step from
a checked request to a `Rule` (app/alerts/rules.py). Answers are app/alerts/outputs.py; docs/alerts.md describes
every field.

Every problem names its field as the request spells it: `for`, `route.webhook`, `route.email[1]`, `stop.grace`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from ..analyse.window import LIFECYCLES
from ..errors import ApiError, FieldProblem
from .fields import DURATION_HELP, check_email, check_url, parse_duration_s
from .rules import HELD, MAY_STOP, NEEDS_FOR, Route, Rule, Scope, Stop, Target
from .tables import CONDITIONS

NAME_PATTERN = r"^[A-Za-z0-9_-](?:[A-Za-z0-9_ -]{0,98}[A-Za-z0-9_-])?$"
MIN_SECRET = 16
MAX_ITEMS = 50

Condition = Literal[
    "gpu_idle", "slice_underused", "mig_unpartitioned", "agent_offline", "tag_waste", "spot_interruption"
]
assert get_args(Condition) == CONDITIONS
Lifecycle = Literal["spot", "on-demand", "on-prem"]
assert get_args(Lifecycle) == LIFECYCLES


def _duration(value: object) -> str | float:
    parse_duration_s(value)
    assert isinstance(value, str | int | float)
    return value


Duration = Annotated[
    str | float,
    PlainValidator(_duration),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}], "description": f"A duration: {DURATION_HELP}."}),
]
Url = Annotated[str, AfterValidator(check_url), Field(max_length=2000)]
Email = Annotated[str, AfterValidator(check_email), Field(max_length=254)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class TargetIn(_Strict):
    """One of `slack`, `webhook` (with `secret`) or `email`."""

    slack: Url | None = Field(default=None, description="A Slack incoming webhook URL.")
    webhook: Url | None = Field(default=None, description="A URL that gets each message as a signed JSON POST.")
    secret: str | None = Field(
        default=None,
        min_length=MIN_SECRET,
        max_length=200,
        description=f"webhook: the HMAC-SHA256 signing secret, {MIN_SECRET} characters or more. Never shown back; "
        "left out when a rule is replaced with the same webhook URL, the stored one is kept.",
    )
    email: list[Email] | None = Field(default=None, min_length=1, max_length=MAX_ITEMS, description="Addresses.")

    @field_validator("secret")
    @classmethod
    def _secret_with_webhook(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A webhook that failed its own check is missing from `data`: that error is enough.
        if value is not None and "webhook" in info.data and info.data["webhook"] is None:
            raise ValueError("only a webhook route takes a secret")
        return value

    def _kinds(self) -> list[str]:
        return [k for k in ("slack", "webhook", "email") if getattr(self, k) is not None]

    @model_validator(mode="after")
    def _one_kind(self) -> TargetIn:
        if type(self) is TargetIn and len(self._kinds()) != 1:
            raise ValueError("give exactly one of slack, webhook or email")
        return self


class RouteIn(TargetIn):
    """A fixed route (`slack`, `webhook` or `email`), or `owner = true` with an optional `fallback`."""

    owner: bool | None = Field(
        default=None,
        description="true: to the instance's owner (owner tags, or the holder's user through GPUFLEET_USER_EMAILS), "
        "else to the team tag's route, else to `fallback`.",
    )
    fallback: TargetIn | None = Field(default=None, description="owner: where messages go when no owner is found.")

    @field_validator("owner")
    @classmethod
    def _owner_true(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("owner is true or left out")
        return value

    @field_validator("fallback")
    @classmethod
    def _fallback_with_owner(cls, value: TargetIn | None, info: ValidationInfo) -> TargetIn | None:
        if value is not None and "owner" in info.data and not info.data["owner"]:
            raise ValueError("only an owner route has a fallback")
        return value

    @model_validator(mode="after")
    def _one_route(self) -> RouteIn:
        kinds = self._kinds() + (["owner"] if self.owner else [])
        if len(kinds) != 1:
            raise ValueError("give exactly one of slack, webhook, email or owner")
        return self


class ScopeIn(_Strict):
    """Filters as on the dashboard; each left out or empty: any."""

    regions: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS, examples=[["us-east-1"]])
    instance_types: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS, examples=[["p4d.24xlarge"]])
    lifecycles: list[Lifecycle] = Field(default_factory=list, max_length=3)
    tags: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Tags an instance must all carry.",
        examples=[{"team": "vision"}],
    )
    users: list[Text] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Users holding the GPU (processes' owners)."
    )


class StopIn(_Strict):
    """Stop the instance (EC2 StopInstances) after the notice and a grace period, unless snoozed."""

    dry_run: bool = Field(default=True, description="true: record what would be done, stop nothing.")
    grace: Duration = Field(default="1h", description="Between the notice and the stop.")
    spot: bool = Field(default=False, description="Also stop spot instances.")
    capacity_block: bool = Field(default=False, description="Also stop instances in a Capacity Block for ML.")


class RuleIn(_Strict):
    """A rule: a condition, where it applies, where messages go."""

    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=NAME_PATTERN,
        description="Unique; letters, digits, -, _ and spaces (not at either end).",
    )
    condition: Condition
    for_: Duration | None = Field(
        default=None,
        alias="for",
        validate_default=True,
        description=f"How long the condition must hold first; required for {', '.join(NEEDS_FOR)}.",
    )
    usd_per_day: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        validate_default=True,
        description="tag_waste: waste above this per day and tag value opens an incident, USD.",
    )
    tag: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)] | None = Field(
        default=None,
        validate_default=True,
        description="tag_waste: the tag whose values are compared, such as team.",
    )
    scope: ScopeIn = Field(default_factory=ScopeIn)
    route: RouteIn
    quiet: Duration = Field(default="0", description="No new incident for a subject this long after one closed.")
    remind: Duration | None = Field(default=None, description="A reminder after an incident stays open this long.")
    stop: StopIn | None = Field(default=None, description=f"The stop action; only for {', '.join(MAY_STOP)}.")
    enabled: bool = True

    @field_validator("for_")
    @classmethod
    def _for(cls, value: str | float | None, info: ValidationInfo) -> str | float | None:
        condition = info.data.get("condition")
        if condition in NEEDS_FOR:
            if value is None:
                raise ValueError(f"required for {condition}")
            if parse_duration_s(value) == 0:
                raise ValueError("must be longer than 0")
        elif value is not None and condition is not None:
            raise ValueError(f"{condition} takes no duration")
        return value

    @field_validator("usd_per_day", "tag")
    @classmethod
    def _tag_waste(cls, value: object, info: ValidationInfo) -> Any:
        condition = info.data.get("condition")
        if condition == "tag_waste" and value is None:
            raise ValueError("required for tag_waste")
        if condition not in (None, "tag_waste") and value is not None:
            raise ValueError("only for tag_waste")
        return value

    @field_validator("remind")
    @classmethod
    def _remind(cls, value: str | float | None) -> str | float | None:
        if value is not None and parse_duration_s(value) == 0:
            raise ValueError("must be longer than 0; leave it out for no reminder")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: StopIn | None, info: ValidationInfo) -> StopIn | None:
        condition = info.data.get("condition")
        if value is not None and condition is not None and condition not in MAY_STOP:
            raise ValueError(f"{condition} is not about one instance: it cannot stop one")
        return value


class EnabledIn(_Strict):
    enabled: bool


# From a checked request to a rule -----------------------------------------------------------------------------------

BAD_RULE = "bad rule"


def field_name(loc: Iterable[object]) -> str:
    """A pydantic error location as a field name: ("route", "email", 1) -> "route.email[1]"."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            # A missing value is reported under the attribute's name, not the alias the request uses.
            name += ("." if name else "") + ("for" if part == "for_" else str(part))
    return name or "rule"


_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required",
    "string_pattern_mismatch": "letters, digits, -, _ and spaces (not at either end)",
}


def field_problems(errors: Sequence[Mapping[str, Any]], *, skip: int = 0) -> list[FieldProblem]:
    """pydantic's errors (`ValidationError.errors()`) as problems naming their fields; `skip` drops the first parts
    of each location (FastAPI's "body")."""
    problems = []
    for e in errors:
        kind = str(e.get("type", ""))
        if kind == "value_error" and "error" in (e.get("ctx") or {}):
            message = str(e["ctx"]["error"])
        else:
            message = _MESSAGES.get(kind, str(e.get("msg", "invalid")))
        problems.append(FieldProblem(field_name(tuple(e.get("loc", ()))[skip:]), message))
    return problems


def _target(data: TargetIn, where: str, keep: Target | None) -> Target:
    if data.slack is not None:
        return Target("slack", url=data.slack.strip())
    if data.webhook is not None:
        url = data.webhook.strip()
        secret = data.secret
        if secret is None and keep is not None and keep.channel == "webhook" and keep.url == url:
            secret = keep.secret
        if not secret:
            message = f"required with webhook, {MIN_SECRET} characters or more"
            raise ApiError(400, BAD_RULE, [FieldProblem(f"{where}.secret", message)])
        return Target("webhook", url=url, secret=secret)
    assert data.email is not None
    return Target("email", to=tuple(dict.fromkeys(a.strip() for a in data.email)))


def _route(data: RouteIn, keep: Route | None) -> Route:
    if data.owner:
        fallback = keep.target if keep and keep.owner else None
        return Route(_target(data.fallback, "route.fallback", fallback) if data.fallback else None, owner=True)
    return Route(_target(data, "route", keep.target if keep and not keep.owner else None))


def to_rule(data: RuleIn, *, source: str, keep: Rule | None = None) -> Rule:
    """The rule a checked request describes. `keep`: the rule it replaces, whose webhook secret stays when the
    request leaves it out for the same URL. ApiError 400 naming the field when a secret is missing, or when the scope
    names users for a condition no process holds."""
    if data.scope.users and data.condition not in HELD:
        # Such a rule would never fire: nothing a process holds is its subject.
        message = f"{data.condition} is about what no process holds; users only scope {', '.join(HELD)}"
        raise ApiError(400, BAD_RULE, [FieldProblem("scope.users", message)])
    stop = data.stop
    return Rule(
        name=data.name,
        condition=data.condition,
        for_hours=parse_duration_s(data.for_) / 3600 if data.for_ is not None else None,
        usd_per_day=data.usd_per_day,
        tag_key=data.tag,
        scope=Scope(
            regions=tuple(dict.fromkeys(data.scope.regions)),
            instance_types=tuple(dict.fromkeys(data.scope.instance_types)),
            lifecycles=tuple(dict.fromkeys(data.scope.lifecycles)),
            tags=tuple(sorted(data.scope.tags.items())),
            users=tuple(dict.fromkeys(data.scope.users)),
        ),
        route=_route(data.route, keep.route if keep else None),
        quiet_s=parse_duration_s(data.quiet),
        remind_s=parse_duration_s(data.remind) if data.remind is not None else None,
        stop=Stop(stop.dry_run, parse_duration_s(stop.grace), stop.spot, stop.capacity_block) if stop else None,
        enabled=data.enabled,
        source=source,
    )
