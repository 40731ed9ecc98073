"""Who may call: bearer tokens (made by `gpufleet token create`, stored as SHA-256), and the one rule for every
route that reads (`require_read`): a token, a dashboard session, or a user named by a trusted proxy.
docs/security.md describes it for operators.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection, Request

from .errors import ApiError
from .models import SCOPES, ApiToken
from .sessions import SESSION_COOKIE, LiveSession, end_token_sessions, find_session
from .settings import Settings

TOKEN_PREFIX = "gpf_"
# last_used_at is a hint for operators; writing it on every request would cost a row update per batch.
_LAST_USED_GRANULARITY = timedelta(minutes=1)


@dataclass(frozen=True)
class Caller:
    token_id: int
    name: str
    scope: str
    instance_id: str | None = None
    """For an ingest token bound to one instance: that instance; None: fleet-wide."""


def hash_secret(secret: str) -> str:
    # The secret carries 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, *, name: str, scope: str, instance_id: str | None = None) -> tuple[ApiToken, str]:
    """A new token and its secret; the secret is not stored and cannot be shown again. `instance_id` binds an
    ingest token to the one instance it may report."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    if not name.strip() or len(name) > 100:
        raise ValueError("a token name is 1 to 100 characters")
    if instance_id is not None:
        instance_id = instance_id.strip()
        if scope != "ingest":
            raise ValueError("only an ingest token can be bound to an instance")
        if not instance_id or len(instance_id) > 128:
            raise ValueError("an instance id is 1 to 128 characters")
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise ValueError(f"a token named {name!r} already exists")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        name=name, scope=scope, secret_sha256=hash_secret(secret), hint=secret[:8], instance_id=instance_id
    )
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
        end_token_sessions(session, token.id)
        session.flush()
    return token


def allows(scope: str, needed: str) -> bool:
    return scope == needed or scope == "admin"


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gpufleet"'}


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers=dict(_CHALLENGE))


def authenticate(session: Session, authorization: str | None, *, needed: str, now: datetime) -> Caller:
    """The caller behind an `Authorization: Bearer ...` header, if its token is live and has the scope."""
    if not authorization:
        raise _unauthorized("missing Authorization header (expected: Bearer <token>)")
    kind, _, secret = authorization.partition(" ")
    if kind.lower() != "bearer" or not secret.strip():
        raise _unauthorized("Authorization header must be: Bearer <token>")
    row = session.execute(
        select(
            ApiToken.id,
            ApiToken.name,
            ApiToken.scope,
            ApiToken.revoked_at,
            ApiToken.last_used_at,
            ApiToken.instance_id,
        ).where(ApiToken.secret_sha256 == hash_secret(secret.strip()))
    ).first()
    if row is None:
        raise _unauthorized("unknown token")
    if row.revoked_at is not None:
        raise _unauthorized("token revoked")
    if not allows(row.scope, needed):
        raise ApiError(403, f"token scope {row.scope!r} does not allow {needed!r}")
    if row.last_used_at is None or now - row.last_used_at > _LAST_USED_GRANULARITY:
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return Caller(token_id=row.id, name=row.name, scope=row.scope, instance_id=row.instance_id)


# Who may call each route ----------------------------------------------------------------------------------------

BEARER = "bearerToken"
COOKIE = "sessionCookie"
SECURITY_SCHEMES: dict[str, Any] = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `gpufleet token create`. Its scope must be the one the route names, or admin.",
    },
    COOKIE: {
        "type": "apiKey",
        "in": "cookie",
        "name": SESSION_COOKIE,
        "description": "A dashboard login (`/login`): it reads; one opened with the admin password or a token of "
        "scope admin also manages alert rules, sending its CSRF token in `X-CSRF-Token` with every change.",
    },
}


def requires(scope: str | None) -> dict[str, Any]:
    """A route's `openapi_extra`: who may call it, as an OpenAPI security requirement; None: anyone.

    Every route declares one. tests/app/test_auth_matrix.py reads the declarations back from the route table and
    checks each route's answers against them, so a route that declares nothing fails the tests.
    """
    if scope is None:
        return {"security": []}
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if scope in ("read", "admin"):
        return {"security": [{BEARER: [scope]}, {COOKIE: []}]}
    return {"security": [{BEARER: [scope]}]}


@dataclass(frozen=True)
class Reader:
    """Who reads, and how they showed it: `token` (a bearer header), `session` (a dashboard login), `proxy` (the
    user header of a trusted proxy) or `open` (GPUFLEET_AUTH=off)."""

    via: str
    name: str
    session: LiveSession | None = None
    admin: bool = False
    """A token or login of scope admin: may also manage alert rules."""


class LoginRequired(ApiError):
    """401 for a request without credentials, or with a session cookie that no longer holds. A dashboard page
    answers it by sending the browser to the login form; an API route answers it as any other 401."""


def peer_address(conn: HTTPConnection) -> IPv4Address | IPv6Address | None:
    """The address of the connection's peer (IPv4-mapped IPv6 as IPv4), or None when it is not an IP address."""
    host = conn.client.host if conn.client else None
    try:
        peer = ip_address(host) if host else None
    except ValueError:
        return None
    if isinstance(peer, IPv6Address) and peer.ipv4_mapped is not None:
        return peer.ipv4_mapped
    return peer


def is_loopback(conn: HTTPConnection) -> bool:
    peer = peer_address(conn)
    return peer is not None and peer.is_loopback


def _proxy_user(conn: HTTPConnection, networks: Sequence[IPv4Network | IPv6Network], header: str) -> str | None:
    peer = peer_address(conn)
    if peer is None or not any(peer.version == net.version and peer in net for net in networks):
        return None
    # Exactly one value: a proxy that appends to a header the client already sent must not let the client choose.
    values = conn.headers.getlist(header)
    if len(values) != 1 or not values[0].strip():
        return None
    return values[0].strip()[:200]


def require_read(
    session: Session, request: Request, settings: Settings, *, now: datetime, dashboard: bool = False
) -> Reader:
    """The reader behind a request to a route that reads (dashboard pages, the report, /metrics), or ApiError.

    With GPUFLEET_AUTH=off anyone on this host reads (other peers: 403). Otherwise, in order: an `Authorization:
    Bearer` token of scope read or admin (401 unknown or revoked, 403 another scope); for a dashboard page, the
    user header sent by a trusted proxy; a live dashboard session. Without any of them: LoginRequired (401).
    `session` must be committed afterwards: a token's `last_used_at` may be updated.

    The proxy's header counts on dashboard pages only: a proxy may let API paths through without a login (agents
    and Prometheus bring tokens), and a header a client sent there must not open the API.
    """
    if settings.auth == "off":
        if not is_loopback(request):
            raise ApiError(403, "authentication is off (GPUFLEET_AUTH=off): only clients on this host may read")
        return Reader("open", "")
    authorization = request.headers.get("authorization")
    if authorization:
        caller = authenticate(session, authorization, needed="read", now=now)
        return Reader("token", caller.name, admin=caller.scope == "admin")
    user = _proxy_user(request, settings.trusted_proxies, settings.proxy_user_header) if dashboard else None
    if user is not None:
        return Reader("proxy", user)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        live = find_session(session, cookie, password_hash=settings.admin_password_hash, now=now)
        if live is None:
            raise LoginRequired(401, "session expired or ended: log in again", headers=_CHALLENGE)
        return Reader("session", live.name, live, admin=live.scope == "admin")
    raise LoginRequired(401, "log in, or send Authorization: Bearer <token> with a read token", headers=_CHALLENGE)


NOT_ADMIN = "alert rules are for admins: log in with the admin password or a token of scope admin"


class NotAdmin(ApiError):
    """403 for someone who may read but not manage alert rules: a login that may only read, or a user named by a
    trusted proxy. A dashboard page answers it with its error page."""


def require_admin(
    session: Session, request: Request, settings: Settings, *, now: datetime, reading: bool, dashboard: bool = False
) -> Reader:
    """The admin behind a request to a route that manages alert rules, or ApiError.

    An `Authorization: Bearer` token of scope admin (401 unknown or revoked, 403 another scope), or a live dashboard
    session opened with the admin password or an admin token (403 for one that may only read). A user named by a
    trusted proxy may read the dashboard, not manage it (403 on dashboard pages). Without credentials:
    LoginRequired (401). With GPUFLEET_AUTH=off, a request that only reads (`reading`) from this host needs
    nothing and gets the `open` reader, which may not change anything; a change still needs an admin token.
    """
    authorization = request.headers.get("authorization")
    if authorization:
        caller = authenticate(session, authorization, needed="admin", now=now)
        return Reader("token", caller.name, admin=True)
    if settings.auth == "off" and reading:
        if not is_loopback(request):
            raise ApiError(403, "authentication is off (GPUFLEET_AUTH=off): only clients on this host may read")
        return Reader("open", "")
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        live = find_session(session, cookie, password_hash=settings.admin_password_hash, now=now)
        if live is None:
            raise LoginRequired(401, "session expired or ended: log in again", headers=_CHALLENGE)
        if live.scope != "admin":
            raise NotAdmin(403, f"{NOT_ADMIN} (this login, {live.name}, may only read)")
        return Reader("session", live.name, live, admin=True)
    if dashboard and _proxy_user(request, settings.trusted_proxies, settings.proxy_user_header) is not None:
        raise NotAdmin(403, f"{NOT_ADMIN} (a user signed in at the proxy may only read)")
    if settings.auth == "off":
        raise LoginRequired(
            401,
            "authentication is off (GPUFLEET_AUTH=off): changing alert rules needs Authorization: Bearer <token> "
            "with a token of scope admin",
            headers=_CHALLENGE,
        )
    raise LoginRequired(
        401, "log in as admin, or send Authorization: Bearer <token> with an admin token", headers=_CHALLENGE
    )
