"""How an instance's agent reaches the server, for the instance page: what it reports with (docs/ingest-protocol.md,
"Authentication"), and the batches its spool set aside or dropped in the window (agent events)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Integer, cast, func, select
from sqlalchemy.orm import Session

from ..models import ApiToken, Event, Instance


@dataclass(frozen=True)
class Delivery:
    reports_with: str
    """What may report this instance, in words."""
    bound: bool
    """True when only this instance's own identity or token may report it; False for any fleet-wide ingest token."""
    set_aside: int
    """Batches the agent set aside in the window (the server kept failing on them), count."""
    set_aside_now: int | None
    """Batches waiting aside at the agent's latest report of one, count; None if it never reported one."""
    dropped: int
    """Batches the agent's spool dropped in the window (size or age bound), count."""


def delivery(session: Session, instance_pk: int, instance_id: str, *, since: datetime, until: datetime) -> Delivery:
    account = session.scalar(select(Instance.identity_account_id).where(Instance.id == instance_pk))
    tokens = list(
        session.scalars(
            select(ApiToken.name)
            .where(ApiToken.instance_id == instance_id, ApiToken.revoked_at.is_(None))
            .order_by(ApiToken.id)
        )
    )
    if account is not None:
        words, bound = f"its signed EC2 instance identity (account {account})", True
    elif tokens:
        words, bound = "its own ingest token " + ", ".join(repr(t) for t in tokens), True
    else:
        words, bound = "any fleet-wide ingest token", False
    in_window = (Event.instance_pk == instance_pk, Event.ts >= since, Event.ts < until)
    aside = session.execute(
        select(func.count(), func.max(Event.ts)).where(Event.kind == "batch_set_aside", *in_window)
    ).one()
    now_aside = None
    if aside[0]:
        latest = session.scalar(
            select(Event.details["set_aside_now"].as_integer())
            .where(Event.kind == "batch_set_aside", *in_window)
            .order_by(Event.ts.desc())
            .limit(1)
        )
        now_aside = int(latest) if latest is not None else None
    dropped = session.scalar(
        select(func.coalesce(func.sum(cast(Event.details["count"].astext, Integer)), 0)).where(
            Event.kind == "agent_dropped_batches", *in_window
        )
    )
    return Delivery(words, bound, int(aside[0]), now_aside, int(dropped or 0))
