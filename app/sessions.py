"""Dashboard sessions: rows in `web_sessions`. The cookie holds a random id; the database keeps its SHA-256,
the credential the session came from, its expiry and a CSRF secret.

A session is live while it has not expired and its credential still holds: its token is not revoked and may
read, or the admin password hash it was opened with is still the configured one.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .models import ApiToken, WebSession

SESSION_COOKIE = "gpufleet_session"
ADMIN_NAME = "admin"
"""The name shown for a session opened with the admin password."""
READ_SCOPES = ("read", "admin")

_COOKIE_SHAPE = re.compile(r"[A-Za-z0-9_-]{40,64}")


@dataclass(frozen=True)
class LiveSession:
    id_sha256: str
    name: str
    """The token's name, or `admin` for the admin password."""
    scope: str
    token_id: int | None
    csrf_secret: str
    expires_at: datetime


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def password_fingerprint(password_hash: str) -> str:
    """What a password session remembers of the configured hash: a new hash (a new password) ends it."""
    return _sha256(password_hash)


def delete_expired(session: Session, *, now: datetime) -> int:
    """Drop sessions past their expiry; the number dropped."""
    result = session.execute(delete(WebSession).where(WebSession.expires_at <= now))
    return int(getattr(result, "rowcount", 0) or 0)


def open_session(
    session: Session, *, token_id: int | None, password_hash: str | None, lifetime: timedelta, now: datetime
) -> tuple[str, LiveSession]:
    """A new session for a token or for the admin password; returns the cookie value, which is not stored."""
    if (token_id is None) == (password_hash is None):
        raise ValueError("a session comes from a token or from the password, not both")
    delete_expired(session, now=now)
    cookie = secrets.token_urlsafe(32)
    row = WebSession(
        id_sha256=_sha256(cookie),
        token_id=token_id,
        password_sha256=password_fingerprint(password_hash) if password_hash is not None else None,
        csrf_secret=secrets.token_urlsafe(32),
        expires_at=now + lifetime,
    )
    session.add(row)
    session.flush()
    live = find_session(session, cookie, password_hash=password_hash, now=now)
    assert live is not None
    return cookie, live


def find_session(session: Session, cookie: str, *, password_hash: str | None, now: datetime) -> LiveSession | None:
    """The live session behind a cookie value, or None (unknown, expired, or its credential no longer holds)."""
    if not _COOKIE_SHAPE.fullmatch(cookie):
        return None
    row = session.execute(
        select(
            WebSession.id_sha256,
            WebSession.token_id,
            WebSession.password_sha256,
            WebSession.csrf_secret,
            WebSession.expires_at,
            ApiToken.name,
            ApiToken.scope,
            ApiToken.revoked_at,
        )
        .outerjoin(ApiToken, ApiToken.id == WebSession.token_id)
        .where(WebSession.id_sha256 == _sha256(cookie), WebSession.expires_at > now)
    ).first()
    if row is None:
        return None
    if row.token_id is not None:
        if row.revoked_at is not None or row.scope not in READ_SCOPES:
            return None
        return LiveSession(row.id_sha256, row.name, row.scope, row.token_id, row.csrf_secret, row.expires_at)
    if password_hash is None or row.password_sha256 != password_fingerprint(password_hash):
        return None
    return LiveSession(row.id_sha256, ADMIN_NAME, "admin", None, row.csrf_secret, row.expires_at)


def end_session(session: Session, cookie: str) -> None:
    """Forget the session behind a cookie value (logout); nothing happens for an unknown one."""
    session.execute(delete(WebSession).where(WebSession.id_sha256 == _sha256(cookie)))


def end_token_sessions(session: Session, token_id: int) -> None:
    session.execute(delete(WebSession).where(WebSession.token_id == token_id))
