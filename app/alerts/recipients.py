"""Who hears of an incident (docs/alerts.md, "Owner routing"): the targets a rule's route names for one finding.

A fixed route names its targets. An owner route looks, in this order, for
1. the first owner tag of the instance (GPUFLEET_OWNER_TAGS) that holds an email address;
2. the addresses of the users holding the GPU (GPUFLEET_USER_EMAILS);
3. the route of the instance's team tag (GPUFLEET_TEAM_TAG, its value looked up in GPUFLEET_TEAM_ROUTES);
4. the rule's fallback.
The first step that finds anyone decides; when none does, the incident is still recorded, and says why no one
was told (`no_one_told`).
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parseaddr

from ..settings import Settings
from . import rules
from .channels import display_target
from .fields import check_email, check_url
from .findings import Finding

SLACK_PREFIX = "https://hooks.slack.com/"
"""Team routes take Slack incoming webhooks only: no other URL reaches Slack, and a generic webhook needs a
secret a setting of comma-separated pairs has no room for."""


@dataclass(frozen=True)
class Target:
    """One destination of one message: an outbox row each."""

    channel: str
    """slack, webhook or email."""
    to: str
    """The URL, or one email address: the outbox's `target`."""
    secret: str | None = None
    """webhook: the signing secret."""
    via: str = "route"
    """Why it was chosen: "route", "owner tag Owner", "user asmith", "team ml", "fallback"."""

    @property
    def shown(self) -> str:
        """As it may be shown and logged: a URL without its secret path."""
        return display_target(self.to)


def fixed(target: rules.Target, via: str) -> list[Target]:
    """A rule's fixed target as one outbox target per URL or address."""
    if target.channel == "email":
        return [Target("email", address, None, via) for address in target.to]
    if target.url is None:
        return []
    return [Target(target.channel, target.url, target.secret if target.channel == "webhook" else None, via)]


def team_target(team: str, value: str) -> Target:
    """A team route's target: an email address, or a Slack incoming webhook URL. ValueError naming the team (never
    the value: it may be a webhook's secret URL) for anything else."""
    if "@" in value and "://" not in value:
        try:
            return Target("email", check_email(value), None, f"team {team}")
        except ValueError:
            raise ValueError(f"team {team[:40]!r}: not an email address") from None
    if value.startswith(SLACK_PREFIX):
        try:
            return Target("slack", check_url(value), None, f"team {team}")
        except ValueError:
            pass
    raise ValueError(
        f"team {team[:40]!r}: expected an email address or a Slack incoming webhook URL ({SLACK_PREFIX}...)"
    )


def _address(value: str) -> str | None:
    """The email address a tag value holds ("ada@example.com", "Ada Lovelace <ada@example.com>"), or None."""
    for candidate in (value, parseaddr(value)[1]):
        try:
            return check_email(candidate)
        except ValueError:
            continue
    return None


def _owner_tag(settings: Settings, finding: Finding) -> list[Target]:
    for key in settings.owner_tags:
        value = finding.tags.get(key)
        address = _address(value) if value else None
        if address is not None:
            return [Target("email", address, None, f"owner tag {key}")]
    return []


def _holders(settings: Settings, finding: Finding) -> list[Target]:
    out: list[Target] = []
    for user in finding.holders:
        address = settings.user_emails.get(user)
        if address and all(t.to != address for t in out):
            out.append(Target("email", address, None, f"user {user}"))
    return out


def team_of(settings: Settings, finding: Finding) -> str | None:
    """The value of the team tag: the instance's tag, or, for a tag_waste finding about that tag, its value."""
    value = finding.tags.get(settings.team_tag)
    if value:
        return value
    prefix = f"tag:{settings.team_tag}="
    if not finding.subject.startswith(prefix):
        return None
    return finding.subject[len(prefix) :] or None


def _team(settings: Settings, finding: Finding) -> list[Target]:
    team = team_of(settings, finding)
    if team is None:
        return []
    # Checked at start (Settings); a value that fails here was given some other way, and is skipped.
    out: list[Target] = []
    for value in settings.team_routes.get(team, []):
        try:
            out.append(team_target(team, value))
        except ValueError:
            continue
    return out


def targets(settings: Settings, rule: rules.Rule, finding: Finding) -> list[Target]:
    """Where the messages about `finding` go under `rule`'s route; empty: nowhere."""
    route = rule.route
    if not route.owner:
        return fixed(route.target, "route") if route.target is not None else []
    for step in (_owner_tag, _holders, _team):
        found = step(settings, finding)
        if found:
            return found
    return fixed(route.target, "fallback") if route.target is not None else []


def no_one_told(settings: Settings, rule: rules.Rule, finding: Finding) -> str:
    """Why `targets` found no one, as the incident's details say it."""
    if not rule.route.owner:
        return "no one was told: the rule's route names no target"
    team = team_of(settings, finding)
    team_words = (
        f"no route for {settings.team_tag}={team} in GPUFLEET_TEAM_ROUTES"
        if team is not None
        else f"no {settings.team_tag} tag"
    )
    holders = ", ".join(finding.holders) if finding.holders else "no holder known"
    return (
        f"no one was told: no owner tag ({', '.join(settings.owner_tags) or 'none set'}) holds an email address, "
        f"no address in GPUFLEET_USER_EMAILS for the holders ({holders}), {team_words}, and the rule has no fallback"
    )
