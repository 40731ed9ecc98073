"""The daily digest's content and its payload per channel (docs/alerts.md, "Daily digest"): what
app/alerts/digest.py works out for a target, and how Slack, the webhook and email carry it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from ..analyse.window import Window


@dataclass(frozen=True)
class WasteRow:
    """One instance's figures within a target's scopes; USD over the window."""

    instance_id: str
    instance_name: str
    instance_type: str | None
    gpus: int
    cost_usd: float
    waste_usd: float
    idle_share: float | None = None
    """Idle and idle-held GPU-hours over GPU-hours with data, 0-1; None without data."""
    users: tuple[str, ...] = ()
    """Empty: the whole instance; else only what these users held (rules scoped to users)."""


@dataclass(frozen=True)
class Stretch:
    """An incident of one of the target's rules, as its last evaluation described it."""

    rule: str
    condition: str
    subject: str
    what: str
    where: str
    since: datetime
    opened_at: datetime
    closed_at: datetime | None
    usd_so_far: float | None
    usd_per_day: float | None


@dataclass
class Digest:
    day: date
    window: Window
    rules: list[str]
    url: str
    cost_usd: float = 0.0
    waste_usd: float = 0.0
    unpriced_gpu_hours: float = 0.0
    top: list[WasteRow] = field(default_factory=list)
    opened: list[Stretch] = field(default_factory=list)
    closed: list[Stretch] = field(default_factory=list)
    opened_count: int = 0
    closed_count: int = 0


def _usd(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.2f}"


def _z(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _summary(d: Digest) -> str:
    return (
        f"{_usd(d.waste_usd)} wasted (idle or idle-held) of {_usd(d.cost_usd)} spent, "
        f"{d.window.start:%Y-%m-%d %H:%M} to {d.window.end:%Y-%m-%d %H:%M} UTC"
    )


def _row_line(r: WasteRow) -> str:
    share = "" if r.idle_share is None else f", {r.idle_share:.0%} idle"
    who = f", held by {', '.join(r.users)}" if r.users else ""
    gpus = f"{r.gpus} GPU" + ("s" if r.gpus != 1 else "")
    what = f"{r.instance_name} ({r.instance_id}, {r.instance_type or 'unknown type'}, {gpus})"
    return f"{what}: {_usd(r.waste_usd)} wasted{share}{who}"


def _stretch_line(s: Stretch, ended: bool) -> str:
    where = f" on {s.where}" if s.where else ""
    money = [f"{_usd(s.usd_so_far)} {'in all' if ended else 'so far'}"] if s.usd_so_far is not None else []
    if s.usd_per_day is not None and not ended:
        money.append(f"{_usd(s.usd_per_day)}/day")
    when = f"{s.since:%Y-%m-%d %H:%M}" + (f" to {s.closed_at:%Y-%m-%d %H:%M} UTC" if ended and s.closed_at else " UTC")
    tail = f" ({', '.join(money)})" if money else ""
    return f"{s.what}{where}, since {when}{tail} [{s.rule}]"


def _sections(d: Digest) -> list[tuple[str, list[str]]]:
    """(heading, lines) of the top waste, the incidents opened and those closed."""
    out = [(f"Top waste ({len(d.top)})", [_row_line(r) for r in d.top] or ["nothing wasted"])]
    for heading, listed, count, ended in (
        ("Opened", d.opened, d.opened_count, False),
        ("Closed", d.closed, d.closed_count, True),
    ):
        lines = [_stretch_line(s, ended) for s in listed] or ["none"]
        more = [f"... and {count - len(listed)} more"] if count > len(listed) else []
        out.append((f"{heading} ({count})", lines + more))
    return out


def _esc(s: str) -> str:
    """Text as Slack's mrkdwn shows it literally."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(d: Digest) -> dict[str, Any]:
    title = f"gpufleet daily digest {d.day.isoformat()}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _esc(_summary(d))}},
    ]
    for heading, lines in _sections(d):
        body = f"*{_esc(heading)}*\n" + "\n".join(f"• {_esc(line)}" for line in lines)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}})
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"<{d.url}|Open the dashboard>"}})
    return {"text": f"{title}: {_summary(d)}", "blocks": blocks}


def email_payload(d: Digest) -> dict[str, Any]:
    parts = [_summary(d) + ".", f"Rules: {', '.join(d.rules)}."]
    for heading, lines in _sections(d):
        parts.append(heading + ":\n" + "\n".join(f"- {line}" for line in lines))
    parts.append(f"Dashboard: {d.url}")
    return {
        "subject": f"gpufleet daily digest {d.day.isoformat()}: {_usd(d.waste_usd)} wasted",
        "text": "\n\n".join(parts) + "\n",
    }


def _json(item: WasteRow | Stretch) -> dict[str, Any]:
    """A row or an incident as JSON: times in UTC with Z, dollars to the cent, shares to 0.01 %."""
    out = asdict(item)
    for key, value in out.items():
        if isinstance(value, datetime):
            out[key] = _z(value)
        elif isinstance(value, float):
            out[key] = round(value, 4 if key == "idle_share" else 2)
        elif isinstance(value, tuple):
            out[key] = list(value)
    return out


def webhook_payload(d: Digest) -> dict[str, Any]:
    """The JSON object of docs/alerts.md, "Daily digest"; the sender adds `message_id`."""
    return {
        "kind": "digest",
        "text": _summary(d),
        "date": d.day.isoformat(),
        "start": _z(d.window.start),
        "end": _z(d.window.end),
        "rules": d.rules,
        "cost_usd": round(d.cost_usd, 2),
        "waste_usd": round(d.waste_usd, 2),
        "unpriced_gpu_hours": round(d.unpriced_gpu_hours, 3),
        "top_waste": [_json(r) for r in d.top],
        "opened_count": d.opened_count,
        "closed_count": d.closed_count,
        "opened": [_json(s) for s in d.opened],
        "closed": [_json(s) for s in d.closed],
        "url": d.url,
    }


def payload(d: Digest, channel: str) -> dict[str, Any]:
    return {"slack": slack_payload, "webhook": webhook_payload, "email": email_payload}[channel](d)


# Queuing ----------------------------------------------------------------------------------------------------------
