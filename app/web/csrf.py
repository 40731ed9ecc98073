"""CSRF protection for the dashboard's forms that change state: login, logout, and any later one.

A logged-in session has a secret of its own (`web_sessions.csrf_secret`). Every form that changes state carries
it in the field `csrf_token` (in a template: `{{ csrf_field(request) }}`; an htmx request may send the header
`X-CSRF-Token` instead), and its handler checks it with `csrf_ok` before doing anything. The login form has no
session yet: it repeats a random value that the server also put in an HttpOnly cookie (double submit).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Mapping

from markupsafe import Markup
from starlette.requests import HTTPConnection

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
LOGIN_CSRF_COOKIE = "gpufleet_login_csrf"

_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{40,64}")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def well_formed(token: str | None) -> bool:
    return token is not None and _TOKEN_SHAPE.fullmatch(token) is not None


def use_token(conn: HTTPConnection, token: str) -> None:
    """The token that `csrf_field` puts in this request's forms."""
    conn.state.csrf_token = token


def csrf_field(conn: HTTPConnection) -> Markup:
    """The hidden input every form that changes state carries (a Jinja global)."""
    token = getattr(conn.state, "csrf_token", None)
    if not token:
        raise RuntimeError("no CSRF token for this request: forms that change state need a logged-in session")
    return Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, token)


def csrf_ok(expected: str | None, form: Mapping[str, str], headers: Mapping[str, str]) -> bool:
    """True when the form (or the X-CSRF-Token header) carries `expected`; compared in constant time."""
    given = form.get(CSRF_FIELD) or headers.get(CSRF_HEADER) or ""
    return bool(expected) and hmac.compare_digest(given.encode(), (expected or "").encode())
