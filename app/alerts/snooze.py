"""Snoozes (docs/alerts.md, "Snooze"): the signed, expiring token of a snooze link, the key that signs it, and
recording a snooze.

A link's token is `<incident id>.<expiry, Unix s>.<signature>`, the signature being HMAC-SHA256 over both numbers,
keyed with GPUFLEET_ALERTS_SIGNING_KEY or, unset, with a key made by the first process that needs one and kept in
`alert_signing_key`. The link is the credential: whoever holds it may snooze that one incident until it expires,
without a login. Nothing else can be read or changed with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ..settings import Settings
from .stop import cancel_pending
from .tables import alert_incidents, alert_rules, alert_signing_key, alert_snoozes

LINK_TTL = timedelta(days=7)
"""How long a snooze link works, from the message that carries it."""
CHOICES = {"1d": timedelta(days=1), "1w": timedelta(weeks=1)}
"""What a snooze lasts, from when it is recorded: the form's choices."""
MAX_REASON = 500
"""Longest reason kept, characters."""
MAX_BY = 200
"""Longest `by` kept, characters."""
KEY_BYTES = 32

_PURPOSE = b"gpufleet snooze link v1"
# Numbers without leading zeros, so that each incident and expiry has exactly one token; 43 characters are the
# 32 bytes of an HMAC-SHA256 in unpadded base64url.
_TOKEN = re.compile(r"([1-9][0-9]{0,17})\.([1-9][0-9]{0,11})\.([A-Za-z0-9_-]{43})")
MAX_TOKEN_CHARS = 80


@dataclass(frozen=True)
class LinkToken:
    incident_id: int
    expires_at: datetime
    """The link works until this moment (UTC, whole seconds)."""


class BadLink(Exception):
    """A token that is not one this server signed: cut short, changed, or signed with another key."""


class ExpiredLink(Exception):
    """A token this server signed whose time is over."""

    def __init__(self, token: LinkToken) -> None:
        super().__init__(f"the snooze link expired at {token.expires_at:%Y-%m-%d %H:%M} UTC")
        self.token = token


class CannotSnooze(Exception):
    """The incident cannot be snoozed; nothing was recorded."""

    def __init__(self, incident_id: int, message: str) -> None:
        super().__init__(message)
        self.incident_id = incident_id


class UnknownIncident(CannotSnooze):
    """No such incident (its rule may have been deleted, and its incidents with it)."""

    def __init__(self, incident_id: int) -> None:
        super().__init__(incident_id, f"there is no incident {incident_id}: its rule may have been deleted")


class IncidentClosed(CannotSnooze):
    """The incident is closed: its condition stopped holding, so there is nothing to snooze."""

    def __init__(self, incident_id: int, closed_at: datetime) -> None:
        super().__init__(
            incident_id, f"incident {incident_id} closed at {closed_at:%Y-%m-%d %H:%M} UTC: there is nothing to snooze"
        )
        self.closed_at = closed_at


# The key ---------------------------------------------------------------------------------------------------------


def signing_key(session: Session, settings: Settings) -> bytes:
    """The key that signs snooze links: GPUFLEET_ALERTS_SIGNING_KEY, else the one kept in the database, made now
    if there is none yet. Several processes making one at once keep the first (the others' INSERT waits for it
    and does nothing), and all read the same. Made in the caller's transaction, so a key is kept exactly when the
    first message signed with it is."""
    if settings.alerts_signing_key:
        return settings.alerts_signing_key.encode()
    key = session.scalar(select(alert_signing_key.c.key).where(alert_signing_key.c.id == 1))
    if key is None:
        session.execute(
            insert(alert_signing_key)
            .values(id=1, key=secrets.token_bytes(KEY_BYTES))
            .on_conflict_do_nothing(index_elements=["id"])
        )
        # A new statement sees the row of whichever process won, committed by now.
        key = session.scalar(select(alert_signing_key.c.key).where(alert_signing_key.c.id == 1))
    assert key is not None
    return bytes(key)


# Tokens ----------------------------------------------------------------------------------------------------------


def _signature(key: bytes, incident_id: int, expires: int) -> str:
    message = b"\x1f".join((_PURPOSE, str(incident_id).encode(), str(expires).encode()))
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(key: bytes, incident_id: int, *, now: datetime, ttl: timedelta = LINK_TTL) -> str:
    """A token that snoozes `incident_id` until `now + ttl`."""
    if incident_id <= 0:
        raise ValueError("an incident id is a positive number")
    expires = int((now + ttl).timestamp())
    return f"{incident_id}.{expires}.{_signature(key, incident_id, expires)}"


def verify(key: bytes, token: str, *, now: datetime) -> LinkToken:
    """The incident and expiry a token carries, if `key` signed it and it has not expired; else BadLink or
    ExpiredLink. The signature is checked first, so a forged token learns nothing about expiry."""
    match = _TOKEN.fullmatch(token) if len(token) <= MAX_TOKEN_CHARS else None
    if match is None:
        raise BadLink("not a snooze link")
    incident, expires, given = int(match[1]), int(match[2]), match[3]
    if not hmac.compare_digest(given.encode(), _signature(key, incident, expires).encode()):
        raise BadLink("the snooze link's signature does not match")
    try:
        expires_at = datetime.fromtimestamp(expires, UTC)
    except (OverflowError, OSError, ValueError):
        raise BadLink("not a snooze link") from None
    parsed = LinkToken(incident, expires_at)
    if expires_at <= now:
        raise ExpiredLink(parsed)
    return parsed


# Snoozing --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snooze:
    """One recorded snooze."""

    id: int
    incident_id: int
    rule: str
    subject: str
    until: datetime
    reason: str | None
    by: str | None
    created_at: datetime


@dataclass(frozen=True)
class Snoozed:
    snooze: Snooze
    cancelled_actions: int
    """Pending stop actions of the incident that the snooze cancelled."""


def snooze_incident(
    session: Session, incident_id: int, *, until: datetime, reason: str | None, by: str, now: datetime
) -> Snoozed:
    """Snooze an open incident until `until`: record it in `alert_snoozes`, set the incident's `snoozed_until`
    (the latest snooze wins, shorter or longer than the one before) and cancel its pending stop actions. A closed
    or unknown incident raises IncidentClosed or UnknownIncident and nothing is written. Does not commit.

    The incident's row is locked first, so a snooze and the evaluation closing the incident happen one after
    the other: a snooze never lands on an incident that closed meanwhile."""
    if until <= now:
        raise ValueError("a snooze ends after it starts")
    reason = (reason or "").strip()[:MAX_REASON] or None
    by = by.strip()[:MAX_BY]
    i = alert_incidents.c
    row = session.execute(
        select(i.closed_at, i.subject, alert_rules.c.name)
        .join(alert_rules, alert_rules.c.id == i.rule_id)
        .where(i.id == incident_id)
        .with_for_update(of=alert_incidents)
    ).first()
    if row is None:
        raise UnknownIncident(incident_id)
    if row.closed_at is not None:
        raise IncidentClosed(incident_id, row.closed_at)
    snooze_id = session.execute(
        insert(alert_snoozes)
        .values(incident_id=incident_id, until=until, reason=reason, by=by, created_at=now)
        .returning(alert_snoozes.c.id)
    ).scalar_one()
    session.execute(update(alert_incidents).where(i.id == incident_id).values(snoozed_until=until))
    why = f"snoozed until {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC" + (f": {reason}" if reason else "")
    cancelled = cancel_pending(session, incident_id, by=by, reason=why, now=now)
    snooze = Snooze(snooze_id, incident_id, row.name, row.subject, until, reason, by, now)
    return Snoozed(snooze, cancelled)


def recent_snoozes(session: Session, *, limit: int, incident_id: int | None = None) -> list[Snooze]:
    """The newest snoozes first, of one incident or of all."""
    s, i = alert_snoozes.c, alert_incidents.c
    query = (
        select(s.id, s.incident_id, alert_rules.c.name.label("rule"), i.subject, s.until, s.reason, s.by, s.created_at)
        .join(alert_incidents, i.id == s.incident_id)
        .join(alert_rules, alert_rules.c.id == i.rule_id)
        .order_by(s.created_at.desc(), s.id.desc())
        .limit(limit)
    )
    if incident_id is not None:
        query = query.where(s.incident_id == incident_id)
    return [Snooze(**row._mapping) for row in session.execute(query)]
