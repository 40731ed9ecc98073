"""The daily digest (docs/alerts.md, "Daily digest"): once per UTC day, from `GPUFLEET_ALERTS_DIGEST_HOUR`, every
fixed target of the enabled rules (an owner route's fallback included) gets the cost and waste of the 24 hours
that end at that hour within its rules' scopes, the instances that wasted most, and the incidents of its rules
opened and closed in those hours.

- The message id is made of the target and the date, so a second queuing (another server process, a restart,
  the next check) never doubles a digest, and a target first seen late in the day still gets that day's.
- The window is fixed by the date, not by when the digest is queued, so every process would write the same one.
- One analysis of the whole fleet over the window serves every target; each target's scopes pick from it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import Engine, and_, or_, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..analyse.figures import Figures
from ..analyse.fleet import InstanceInfo, load_fleet
from ..analyse.states import Thresholds
from ..analyse.waste import WasteAnalysis, analyse_waste
from ..analyse.window import Filters, Window
from ..db import make_sessionmaker, session_scope
from ..pricing.config import load_price_config
from ..pricing.resolve import Pricer
from ..settings import Settings
from . import outbox
from .digest_messages import Digest, Stretch, WasteRow, payload
from .links import page_url
from .rules import Rule, Scope, list_rules
from .tables import alert_incidents, alert_outbox, alert_rules

log = logging.getLogger("gpufleet.alerts")

CHECK_S = 300.0
"""How often the job looks for digests due, s."""
TOP = 5
"""Instances listed under "top waste"."""
LISTED = 20
"""Incidents listed per kind (opened, closed); the counts say how many there were in all."""
DAY = timedelta(days=1)
_LOCK = 0x67706664_69676573  # one process builds the digests at a time; the others find them queued


@dataclass(frozen=True)
class DigestTarget:
    """One destination of digests: a Slack or webhook URL, or one email address, with the rules that route to it."""

    channel: str
    address: str
    secret: str | None
    rules: tuple[Rule, ...]

    def message_id(self, day: date) -> uuid.UUID:
        return outbox.message_id("digest", self.channel, self.address, day.isoformat())


def digest_targets(rules: Iterable[Rule]) -> list[DigestTarget]:
    """The distinct fixed targets of the enabled rules: a fixed route's target, an owner route's fallback; a rule
    with neither has none. An email route with several addresses is a target per address (the outbox sends to one
    address a message). A webhook URL in several rules takes the secret of the first rule, by id."""
    secrets: dict[tuple[str, str], str | None] = {}
    found: dict[tuple[str, str], list[Rule]] = {}
    for rule in sorted(rules, key=lambda r: r.id or 0):
        target = rule.route.target
        if not rule.enabled or target is None:
            continue
        for address in target.to if target.channel == "email" else (target.url or "",):
            secrets.setdefault((target.channel, address), target.secret)
            found.setdefault((target.channel, address), []).append(rule)
    return [DigestTarget(ch, addr, secrets[ch, addr], tuple(rs)) for (ch, addr), rs in found.items()]


def due_day(now: datetime, hour: int) -> date | None:
    """The UTC day whose digest is due at `now`: today from `hour` on, else None (yesterday's went yesterday)."""
    now = now.astimezone(UTC)
    return now.date() if now.hour >= hour else None


def digest_window(day: date, hour: int, now: datetime) -> Window:
    """The 24 hours a day's digest covers: those that end at `hour` UTC on `day`."""
    end = datetime(day.year, day.month, day.day, hour, tzinfo=UTC)
    return Window(start=end - DAY, end=end, now=now, label="24h digest")


# Content ----------------------------------------------------------------------------------------------------------


Held = dict[str, dict[str, Figures]]
"""Per instance id, per user: what that user held over the window."""


def _held(analysis: WasteAnalysis) -> Held:
    out: Held = {}
    for v in analysis.values.sums if analysis.values is not None else ():
        out.setdefault(v.group, {})[v.key] = v.figures
    return out


def _match(filters: Filters, inst: InstanceInfo) -> bool:
    return filters.match(region=inst.region, instance_type=inst.instance_type, lifecycle=inst.lifecycle, tags=inst.tags)


def scoped_rows(analysis: WasteAnalysis, held: Held, scopes: Sequence[Scope]) -> tuple[Figures, list[WasteRow]]:
    """The totals and per-instance rows (largest waste first) within the union of `scopes`: an instance in a scope
    without users counts whole; one only in scopes with users counts what those users held on it."""
    compiled = [(s.filters(), s.users) for s in scopes]
    total = Figures()
    rows = []
    for row in analysis.by_instance.values():
        inst = row.sample.instance
        matched = [users for filters, users in compiled if _match(filters, inst)]
        if not matched:
            continue
        users: tuple[str, ...] = ()
        if all(matched):
            users = tuple(sorted({u for us in matched for u in us}))
            figures = Figures()
            for user in users:
                part = held.get(inst.instance_id, {}).get(user)
                if part is not None:
                    figures.add(part)
        else:
            figures = row.figures
        if figures.all_hours <= 0:
            continue
        total.add(figures)
        idle_h = figures.idle_h + figures.idle_held_h
        share = idle_h / figures.gpu_hours if figures.gpu_hours > 0 else None
        found = WasteRow(inst.instance_id, inst.name, inst.instance_type, len(row.gpus), figures.cost, figures.waste)
        rows.append(replace(found, idle_share=share, users=users))
    rows.sort(key=lambda r: (-r.waste_usd, -r.cost_usd, r.instance_name))
    return total, rows


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_stretches(session: Session, rule_ids: Sequence[int], window: Window) -> list[tuple[int, Stretch]]:
    """(rule id, incident) of the incidents of `rule_ids` opened or closed within the window, oldest first."""
    i, r = alert_incidents.c, alert_rules.c
    start, end = window.start, window.end
    rows = session.execute(
        select(i.rule_id, r.name, r.condition, i.subject, i.since, i.opened_at, i.closed_at, i.details)
        .join(alert_rules, r.id == i.rule_id)
        .where(
            i.rule_id.in_(rule_ids),
            or_(and_(i.opened_at >= start, i.opened_at < end), and_(i.closed_at >= start, i.closed_at < end)),
        )
        .order_by(i.opened_at, i.id)
    ).all()
    out = []
    for rule_id, rule, condition, subject, since, opened_at, closed_at, details in rows:
        d: Mapping[str, Any] = details or {}
        name, instance_id, device = d.get("instance_name"), d.get("instance_id"), d.get("device")
        where = str(name or instance_id or "")
        if instance_id and name and instance_id != name:
            where += f" ({instance_id})"
        if device:
            where = f"{device} of {where}" if where else str(device)
        stretch = Stretch(
            rule=rule,
            condition=condition,
            subject=subject,
            what=str(d.get("what") or subject),
            where=where,
            since=since,
            opened_at=opened_at,
            closed_at=closed_at,
            usd_so_far=_number(d.get("usd_so_far")),
            usd_per_day=_number(d.get("usd_per_day")),
        )
        out.append((rule_id, stretch))
    return out


def _in(t: datetime | None, window: Window) -> bool:
    return t is not None and window.start <= t < window.end


def _link(settings: Settings, scopes: Sequence[Scope], window: Window) -> str:
    """The waste page by instance over the window; with the scope's filters when the rules share one scope."""
    params = [
        ("group_by", "instance"),
        ("start", f"{window.start:%Y-%m-%dT%H:%MZ}"),
        ("end", f"{window.end:%Y-%m-%dT%H:%MZ}"),
    ]
    if len(set(scopes)) == 1:
        f = scopes[0]
        params += [("region", v) for v in f.regions] + [("instance_type", v) for v in f.instance_types]
        params += [("lifecycle", v) for v in f.lifecycles] + [("tag", f"{k}:{v}") for k, v in f.tags]
    return page_url(settings, "/waste?" + urlencode(params))


def build_digest(
    settings: Settings,
    target: DigestTarget,
    day: date,
    analysis: WasteAnalysis,
    held: Held,
    stretches: Sequence[tuple[int, Stretch]],
) -> Digest:
    """One target's digest from the fleet's analysis over the day's window and the incidents of the window."""
    scopes = [r.scope for r in target.rules]
    window = analysis.window
    total, rows = scoped_rows(analysis, held, scopes)
    ids = {r.id for r in target.rules}
    mine = [s for rule_id, s in stretches if rule_id in ids]
    opened = [s for s in mine if _in(s.opened_at, window)]
    closed = [s for s in mine if _in(s.closed_at, window)]
    return Digest(
        day=day,
        window=window,
        rules=sorted(r.name for r in target.rules),
        url=_link(settings, scopes, window),
        cost_usd=total.cost,
        waste_usd=total.waste,
        unpriced_gpu_hours=total.unpriced_gpu_hours,
        top=[r for r in rows if r.waste_usd > 0][:TOP],
        opened=opened[:LISTED],
        closed=sorted(closed, key=lambda s: s.closed_at or s.opened_at)[:LISTED],
        opened_count=len(opened),
        closed_count=len(closed),
    )


# Payloads ---------------------------------------------------------------------------------------------------------


def queue_digests(session: Session, settings: Settings, *, now: datetime, pricer: Pricer | None = None) -> int:
    """Queue today's digest of every target that has none yet, once `GPUFLEET_ALERTS_DIGEST_HOUR` has come; the
    number queued. In the caller's transaction (no commit). While another transaction builds digests this one
    queues none: that one will, or, if it fails, the next check. `pricer`: from GPUFLEET_PRICES_FILE unless given."""
    day = due_day(now, settings.alerts_digest_hour)
    if day is None:
        return 0
    targets = digest_targets(list_rules(session))
    if not targets:
        return 0
    o = alert_outbox.c
    ids = [t.message_id(day) for t in targets]
    queued = set(session.execute(select(o.message_id).where(o.message_id.in_(ids))).scalars())
    due = [(t, mid) for t, mid in zip(targets, ids, strict=True) if mid not in queued]
    if not due or not session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK}).scalar():
        return 0
    window = digest_window(day, settings.alerts_digest_hour, now)
    thresholds = Thresholds.from_settings(settings)
    pricer = pricer or Pricer(load_price_config(settings.prices_file))
    fleet = load_fleet(session, filters=Filters(), pricer=pricer, thresholds=thresholds, now=now, since=window.start)
    users = any(r.scope.users for t, _mid in due for r in t.rules)
    # What each user held per instance is read only when a rule is scoped to users.
    groups = ["instance", "user"] if users else None
    analysis = analyse_waste(session, fleet, window, thresholds, by_holder=users, holder_groups=groups)
    held = _held(analysis)
    rule_ids = sorted({r.id for t, _mid in due for r in t.rules if r.id is not None})
    stretches = load_stretches(session, rule_ids, window)
    count = 0
    for target, mid in due:
        digest = build_digest(settings, target, day, analysis, held, stretches)
        count += outbox.enqueue(
            session,
            message_id=mid,
            incident_id=None,
            kind="digest",
            channel=target.channel,
            target=target.address,
            secret=target.secret,
            payload=payload(digest, target.channel),
        )
    return count


def _queue_now(sessions: sessionmaker[Session], settings: Settings) -> int:
    with session_scope(sessions) as session:
        return queue_digests(session, settings, now=datetime.now(UTC))


async def _queue_every(sessions: sessionmaker[Session], settings: Settings, check_s: float) -> None:
    last = ""
    while True:
        try:
            n = await asyncio.to_thread(_queue_now, sessions, settings)
            if n:
                log.info("alert digests: %d queued", n)
            if last:
                log.info("alert digests work again")
            last = ""
        except Exception as exc:  # the loop must outlive a database outage or a bug in one round
            db = isinstance(exc, SQLAlchemyError)
            reason = f"database: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}" if db else repr(exc)
            if reason != last:  # a lasting failure is logged once, not every check
                log.warning("alert digests failed, will retry: %s", reason, exc_info=not db)
            last = reason
        await asyncio.sleep(check_s)


def digest_job(engine: Engine, settings: Settings, *, check_s: float = CHECK_S) -> asyncio.Task[None]:
    """Queue the daily digests when due, checking every `check_s` seconds; the caller cancels it on shutdown."""
    return asyncio.create_task(_queue_every(make_sessionmaker(engine), settings, check_s))
