"""Bearer tokens: made by `gpufleet token create`, stored as SHA-256, checked on every API call."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .errors import ApiError
from .models import SCOPES, ApiToken

TOKEN_PREFIX = "gpf_"
# last_used_at is a hint for operators; writing it on every request would cost a row update per batch.
_LAST_USED_GRANULARITY = timedelta(minutes=1)


@dataclass(frozen=True)
class Caller:
    token_id: int
    name: str
    scope: str


def hash_secret(secret: str) -> str:
    # The secret carries 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, *, name: str, scope: str) -> tuple[ApiToken, str]:
    """A new token and its secret; the secret is not stored and cannot be shown again."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    if not name.strip() or len(name) > 100:
        raise ValueError("a token name is 1 to 100 characters")
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise ValueError(f"a token named {name!r} already exists")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(name=name, scope=scope, secret_sha256=hash_secret(secret), hint=secret[:8])
    session.add(token)
    session.flush()
    return token, secret


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, name_or_id: str, *, now: datetime) -> ApiToken | None:
    query = select(ApiToken).where(ApiToken.name == name_or_id)
    if name_or_id.isdigit():
        query = select(ApiToken).where((ApiToken.name == name_or_id) | (ApiToken.id == int(name_or_id)))
    token = session.scalars(query).first()
    if token is not None and token.revoked_at is None:
        token.revoked_at = now
        session.flush()
    return token


def allows(scope: str, needed: str) -> bool:
    return scope == needed or scope == "admin"


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="gpufleet"'})


def authenticate(session: Session, authorization: str | None, *, needed: str, now: datetime) -> Caller:
    """The caller behind an `Authorization: Bearer ...` header, if its token is live and has the scope."""
    if not authorization:
        raise _unauthorized("missing Authorization header (expected: Bearer <token>)")
    kind, _, secret = authorization.partition(" ")
    if kind.lower() != "bearer" or not secret.strip():
        raise _unauthorized("Authorization header must be: Bearer <token>")
    row = session.execute(
        select(ApiToken.id, ApiToken.name, ApiToken.scope, ApiToken.revoked_at, ApiToken.last_used_at).where(
            ApiToken.secret_sha256 == hash_secret(secret.strip())
        )
    ).first()
    if row is None:
        raise _unauthorized("unknown token")
    if row.revoked_at is not None:
        raise _unauthorized("token revoked")
    if not allows(row.scope, needed):
        raise ApiError(403, f"token scope {row.scope!r} does not allow {needed!r}")
    if row.last_used_at is None or now - row.last_used_at > _LAST_USED_GRANULARITY:
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return Caller(token_id=row.id, name=row.name, scope=row.scope)
