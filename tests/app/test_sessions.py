"""Dashboard sessions in the database: opened, found while their credential holds, ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.auth import create_token, revoke_token
from app.models import WebSession
from app.sessions import delete_expired, end_session, find_session, open_session

H = timedelta(hours=1)
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _count(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(WebSession)) or 0)


def test_a_token_session_lives_until_it_expires(session: Session) -> None:
    token, _secret = create_token(session, name="alice", scope="read")
    cookie, live = open_session(session, token_id=token.id, password_hash=None, lifetime=H, now=NOW)
    assert live.name == "alice" and live.scope == "read" and live.expires_at == NOW + H
    assert len(live.csrf_secret) >= 40 and live.csrf_secret != cookie
    assert session.scalar(select(WebSession.id_sha256)) != cookie  # only the hash is kept
    assert find_session(session, cookie, password_hash=None, now=NOW + H - timedelta(seconds=1)) == live
    assert find_session(session, cookie, password_hash=None, now=NOW + H) is None
    assert delete_expired(session, now=NOW + H) == 1 and _count(session) == 0


def test_revoking_the_token_ends_its_sessions(session: Session) -> None:
    token, _secret = create_token(session, name="bob", scope="admin")
    cookie, _ = open_session(session, token_id=token.id, password_hash=None, lifetime=H, now=NOW)
    revoke_token(session, "bob", now=NOW)
    assert find_session(session, cookie, password_hash=None, now=NOW) is None
    assert _count(session) == 0


def test_a_password_session_holds_while_the_password_does(session: Session) -> None:
    cookie, live = open_session(session, token_id=None, password_hash="scrypt:hash-a", lifetime=H, now=NOW)
    assert live.name == "admin" and live.scope == "admin"
    assert find_session(session, cookie, password_hash="scrypt:hash-a", now=NOW) == live
    assert find_session(session, cookie, password_hash="scrypt:hash-b", now=NOW) is None
    assert find_session(session, cookie, password_hash=None, now=NOW) is None


def test_unknown_and_malformed_cookies_find_nothing(session: Session) -> None:
    assert find_session(session, "x" * 43, password_hash=None, now=NOW) is None
    assert find_session(session, "short", password_hash=None, now=NOW) is None
    assert find_session(session, "a;b" * 20, password_hash=None, now=NOW) is None


def test_logout_ends_one_session_and_a_login_clears_expired_ones(session: Session) -> None:
    token, _secret = create_token(session, name="carol", scope="read")
    old, _ = open_session(session, token_id=token.id, password_hash=None, lifetime=H, now=NOW - 2 * H)
    mine, _ = open_session(session, token_id=token.id, password_hash=None, lifetime=H, now=NOW)
    assert _count(session) == 1  # the old one had expired
    other, _ = open_session(session, token_id=token.id, password_hash=None, lifetime=H, now=NOW)
    end_session(session, mine)
    assert find_session(session, mine, password_hash=None, now=NOW) is None
    assert find_session(session, other, password_hash=None, now=NOW) is not None
    assert old != mine


def test_a_session_has_exactly_one_credential(session: Session) -> None:
    with pytest.raises(ValueError):
        open_session(session, token_id=None, password_hash=None, lifetime=H, now=NOW)
    with pytest.raises(ValueError):
        open_session(session, token_id=1, password_hash="x", lifetime=H, now=NOW)
