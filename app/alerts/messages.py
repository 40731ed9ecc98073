"""The messages about an incident (docs/alerts.md, "Messages"), one payload per channel: a Slack message
`{text, blocks}`, a webhook's JSON object with stable field names, an email `{subject, text}`.

Every message says what holds, where (the instance's name and id, the GPU or slice), since when, the dollars so
far and per day, who holds it, and links to the dashboard page and (while the incident is open) to the signed
snooze link; and, when the rule stops the instance, when it will. Three kinds: `open` when the incident opens,
`reminder` while it stays open, `closed` when its condition stopped holding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from ..web.templating import hours, usd, utc
from .findings import Finding

KINDS = ("open", "reminder", "closed")

_SLACK_TEXT_MAX = 3000  # characters of one section's text, Slack's limit
_SLACK_HEADER_MAX = 150


@dataclass(frozen=True)
class About:
    """What one message tells."""

    kind: str
    """open, reminder or closed."""
    incident_id: int
    rule: str
    """The rule's name."""
    condition: str
    finding: Finding
    """The subject as last evaluated; `since` is when the incident's condition started holding."""
    at: datetime
    """When the message was made: the evaluation that opened, reminded of or closed the incident."""
    dashboard_url: str
    snooze_url: str | None = None
    """While open: the signed link that snoozes it."""
    stop_at: datetime | None = None
    """When the rule's stop action will stop the instance, unless snoozed; None: it will not."""
    stop_dry_run: bool = False
    """The stop is a dry run: recorded, nothing stopped."""
    reminder: int = 0
    """reminder: which one, from 1."""
    reason: str | None = None
    """closed: why ("the condition no longer holds", "the rule is turned off")."""


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A condition's figures as JSON takes them: dates and other values it has no type for become text."""
    plain: dict[str, Any] = orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
    return plain


def _money(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def where(about: About) -> str:
    """`train-3 (i-0abc123), GPU 0 (NVIDIA A10G)`; a tag value's subject, `tag team=ml`, when no instance."""
    f = about.finding
    parts = []
    if f.instance_id or f.instance_name:
        name, iid = f.instance_name, f.instance_id
        parts.append(f"{name} ({iid})" if name and iid and name != iid else str(iid or name))
    if f.device:
        parts.append(f.device)
    if parts:
        return ", ".join(parts)
    kind, _, rest = f.subject.partition(":")
    return f"{kind} {rest}" if rest else f.subject


def money(about: About) -> str:
    """`$12.34 so far, $24.20 a day` (closed: `in all`); `no price known` without one."""
    f = about.finding
    if f.usd_so_far is None and f.usd_per_day is None:
        return "no price known"
    spent = "in all" if about.kind == "closed" else "so far"
    so_far = f"{usd(f.usd_so_far)} {spent}" if f.usd_so_far is not None else None
    per_day = f"{usd(f.usd_per_day)} a day" if f.usd_per_day is not None else None
    return ", ".join(p for p in (so_far, per_day) if p)


def holders(about: About) -> str:
    return ", ".join(about.finding.holders) if about.finding.holders else "no one known"


def lasted(about: About) -> str:
    """How long the condition has held (closed: held), `3.0 h`."""
    return hours(max(0.0, (about.at - about.finding.since).total_seconds()) / 3600)


def since(about: About) -> str:
    """`2026-11-24 09:00 UTC (3.0 h ago)`; closed: how long it lasted."""
    if about.kind == "closed":
        return f"{utc(about.finding.since)}, lasted {lasted(about)}"
    return f"{utc(about.finding.since)} ({lasted(about)} ago)"


def stop_words(about: About) -> str | None:
    """`stops at 14:05 UTC unless snoozed`; None when no stop is planned (or the incident closed)."""
    if about.stop_at is None or about.kind == "closed":
        return None
    stop = about.stop_at.astimezone(UTC)
    when = f"{stop:%H:%M} UTC" if stop.date() == about.at.astimezone(UTC).date() else f"{stop:%Y-%m-%d %H:%M} UTC"
    if about.stop_dry_run:
        return f"would stop at {when} unless snoozed (dry run: nothing is stopped)"
    return f"stops at {when} unless snoozed"


def headline(about: About) -> str:
    """One line: what holds and where. `GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc123)`."""
    f = about.finding
    on = ""
    if f.instance_id or f.instance_name:
        name, iid = f.instance_name, f.instance_id
        on = f" on {name} ({iid})" if name and iid and name != iid else f" on {iid or name}"
    lead = {"reminder": "Still open: ", "closed": f"Over after {lasted(about)}: "}.get(about.kind, "")
    return f"{lead}{f.what}{on}"


def summary(about: About) -> str:
    """The headline with the dollars, and the planned stop: the notification line of every channel."""
    stop = stop_words(about)
    return f"{headline(about)}: {money(about)}" + (f"; {stop}" if stop else "")


def facts(about: About) -> list[tuple[str, str]]:
    """The message's fields, label and value, in the order every channel shows them."""
    out = [
        ("What", about.finding.what),
        ("Where", where(about)),
        ("Since", since(about)),
        ("Cost", money(about)),
        ("Held by", holders(about)),
        ("Rule", about.rule),
    ]
    stop = stop_words(about)
    if stop:
        out.append(("Stop", stop))
    if about.kind == "closed" and about.reason:
        out.append(("Closed", about.reason))
    return out


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(about: About) -> dict[str, Any]:
    """`{text, blocks}` for an incoming webhook; the sender adds the message id's context block."""
    text = summary(about)
    title = {"open": "Alert", "reminder": "Reminder", "closed": "Resolved"}.get(about.kind, "gpufleet")
    lines = [f"*{label}:* {_slack_escape(value)}" for label, value in facts(about)]
    links = [f"<{about.dashboard_url}|Open on the dashboard>"]
    if about.snooze_url and about.kind != "closed":
        links.append(f"<{about.snooze_url}|Snooze (1 day, 1 week)>")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{title}: {headline(about)}"[:_SLACK_HEADER_MAX]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:_SLACK_TEXT_MAX]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "  ·  ".join(links)}},
    ]
    return {"text": text, "blocks": blocks}


def webhook(about: About) -> dict[str, Any]:
    """The generic webhook's JSON object: every field always present (null when unknown); the sender adds
    `message_id`. docs/alerts.md, "Messages", lists the fields."""
    f = about.finding
    instance = {"id": f.instance_id, "name": f.instance_name} if f.instance_id or f.instance_name else None
    stop = (
        {"at": _iso(about.stop_at), "dry_run": about.stop_dry_run}
        if about.stop_at is not None and about.kind != "closed"
        else None
    )
    return {
        "kind": about.kind,
        "text": summary(about),
        "incident_id": about.incident_id,
        "rule": about.rule,
        "condition": about.condition,
        "subject": f.subject,
        "what": f.what,
        "instance": instance,
        "device": f.device,
        "since": _iso(f.since),
        "at": _iso(about.at),
        "usd_so_far": _money(f.usd_so_far),
        "usd_per_day": _money(f.usd_per_day),
        "holders": list(f.holders),
        "dashboard_url": about.dashboard_url,
        "snooze_url": about.snooze_url if about.kind != "closed" else None,
        "stop": stop,
        "reminder": about.reminder if about.kind == "reminder" else None,
        "reason": about.reason if about.kind == "closed" else None,
        "figures": _plain(f.extra),
    }


def email(about: About) -> dict[str, Any]:
    """`{subject, text}`: the subject is the headline, the body the facts and the links."""
    width = max(len(label) for label, _ in facts(about)) + 1
    body = [summary(about), ""]
    body += [f"{label + ':':<{width}} {value}" for label, value in facts(about)]
    body += ["", f"Dashboard: {about.dashboard_url}"]
    if about.snooze_url and about.kind != "closed":
        body.append(f"Snooze (1 day or 1 week, with a reason): {about.snooze_url}")
    body += ["", f"gpufleet incident {about.incident_id}"]
    return {"subject": f"[gpufleet] {headline(about)}", "text": "\n".join(body) + "\n"}


def payload(channel: str, about: About) -> Mapping[str, Any]:
    """The payload of `about` for `channel` (slack, webhook, email), as app/alerts/outbox.enqueue takes it."""
    if channel == "slack":
        return slack(about)
    if channel == "webhook":
        return webhook(about)
    if channel == "email":
        return email(about)
    raise ValueError(f"unknown channel {channel!r}")
