"""The login form (a token, or the admin password) and logout. docs/security.md describes both for operators."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..auth import authenticate, peer_address, require_read, requires
from ..deps import SessionDep, SettingsDep
from ..errors import ApiError
from ..passwords import MAX_PASSWORD_CHARS, verify_password
from ..sessions import SESSION_COOKIE, end_session, find_session, open_session
from ..settings import Settings
from ..state import app_state
from .access import (
    LOGIN_PATH,
    LOGOUT_PATH,
    clear_session_cookie,
    cookie_secure,
    login_url,
    safe_next,
    set_session_cookie,
)
from .csrf import LOGIN_CSRF_COOKIE, csrf_ok, new_token, use_token, well_formed
from .forms import FormError, read_form
from .templating import render

router = APIRouter(include_in_schema=False)

FAILED_LOGIN_DELAY_S = 0.5
"""Every failed login answers this much later: a guesser's pace is bounded even below the per-address limit."""
_MAX_TOKEN_CHARS = 200
_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")

NOTICES = {
    "expired": "Your session has ended. Log in again.",
    "ended": "You are logged out.",
}


@dataclass(frozen=True)
class Outcome:
    cookie: str | None = None
    error: str | None = None
    counts: bool = True
    """Whether a failure counts toward the address's limit (an empty form does not)."""


def _login_form(request: Request, *, next_path: str, error: str | None = None, status: int = 200) -> HTMLResponse:
    settings = app_state(request).settings
    token = request.cookies.get(LOGIN_CSRF_COOKIE)
    if not well_formed(token):
        token = new_token()
    assert token is not None
    use_token(request, token)
    notices = [text for flag, text in NOTICES.items() if request.query_params.get(flag) == "1" and not error]
    secure = cookie_secure(request)
    # The browser drops a Secure cookie that arrives over plain HTTP, except from localhost.
    dropped = secure and request.url.scheme == "http" and request.url.hostname not in _LOCAL_NAMES
    context = {
        "page": "login",
        "next": next_path,
        "error": error,
        "notices": notices,
        "password_login": settings.admin_password_hash is not None,
        "insecure": dropped,
    }
    response = render(request, "login.html", context, status_code=status)
    response.set_cookie(LOGIN_CSRF_COOKIE, token, path=LOGIN_PATH, secure=secure, httponly=True, samesite="strict")
    response.headers["Cache-Control"] = "no-store"
    return response


def _signed_in(session: Session, settings: Settings, request: Request) -> bool:
    try:
        require_read(session, request, settings, now=datetime.now(UTC), dashboard=True)
    except ApiError:
        return False
    return True


@router.get(LOGIN_PATH, openapi_extra=requires(None))
def login_page(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    """The form; someone who may read already (or anyone, with auth off) goes straight on to `next`."""
    next_path = safe_next(request.query_params.get("next"))
    if settings.auth == "off" or _signed_in(session, settings, request):
        return RedirectResponse(next_path, status_code=303)
    return _login_form(request, next_path=next_path)


def _check(session: Session, settings: Settings, form: dict[str, str], old_cookie: str | None) -> Outcome:
    """Open a session for the token or password in the form; the old session of this browser, if any, ends."""
    now = datetime.now(UTC)
    lifetime = timedelta(hours=settings.session_hours)
    token = form.get("token", "").strip()
    password = form.get("password", "")
    if not token and not password:
        return Outcome(error="Enter a token.", counts=False)
    if token:
        if len(token) > _MAX_TOKEN_CHARS:
            return Outcome(error="Unknown or revoked token.")
        try:
            caller = authenticate(session, f"Bearer {token}", needed="read", now=now)
        except ApiError as exc:
            if exc.status_code == 403:
                return Outcome(error="This token may not read: the dashboard needs a token of scope read or admin.")
            return Outcome(error="Unknown or revoked token.")
        token_id: int | None = caller.token_id
        password_hash = None
    else:
        password_hash = settings.admin_password_hash
        if password_hash is None:
            return Outcome(error="This server has no admin password: log in with a token.", counts=False)
        if len(password) > MAX_PASSWORD_CHARS or not verify_password(password, password_hash):
            return Outcome(error="Wrong password.")
        token_id = None
    if old_cookie:
        end_session(session, old_cookie)
    cookie, _live = open_session(session, token_id=token_id, password_hash=password_hash, lifetime=lifetime, now=now)
    return Outcome(cookie=cookie)


@router.post(LOGIN_PATH, openapi_extra=requires(None))
async def login(request: Request, session: SessionDep) -> Response:
    state = app_state(request)
    if state.settings.auth == "off":
        return RedirectResponse("/", status_code=303)
    address = str(peer_address(request) or (request.client.host if request.client else "-"))
    wait = state.failed_logins.wait_s(address, now=time.monotonic())
    if wait > 0:
        seconds = math.ceil(wait)
        response = _login_form(
            request,
            next_path="/",
            error=f"Too many failed logins from your address. Try again in {seconds} s.",
            status=429,
        )
        response.headers["Retry-After"] = str(seconds)
        return response
    try:
        form = await read_form(request)
    except FormError as exc:
        return _login_form(request, next_path="/", error=f"Bad form: {exc}.", status=400)
    next_path = safe_next(form.get("next"))
    if not csrf_ok(request.cookies.get(LOGIN_CSRF_COOKIE), form, {}):
        return _login_form(request, next_path=next_path, error="The login form had expired. Try again.", status=400)
    outcome = await run_in_threadpool(_check, session, state.settings, form, request.cookies.get(SESSION_COOKIE))
    if outcome.cookie is None:
        if outcome.counts:
            state.failed_logins.failed(address, now=time.monotonic())
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)
        return _login_form(request, next_path=next_path, error=outcome.error, status=401)
    done = RedirectResponse(next_path, status_code=303)
    set_session_cookie(done, request, outcome.cookie, max_age_s=round(state.settings.session_hours * 3600))
    return done


def _end(session: Session, settings: Settings, cookie: str, form: dict[str, str], headers: Headers) -> bool:
    """End the session behind `cookie` if the form carries its CSRF token; False when it does not."""
    live = find_session(session, cookie, password_hash=settings.admin_password_hash, now=datetime.now(UTC))
    if live is None:
        return True  # nothing left to end
    if not csrf_ok(live.csrf_secret, form, headers):
        return False
    end_session(session, cookie)
    return True


@router.post(LOGOUT_PATH, openapi_extra=requires(None))
async def logout(request: Request, session: SessionDep) -> Response:
    """Ends this browser's session; needs the session's CSRF token, as every form that changes state does."""
    state = app_state(request)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        try:
            form = await read_form(request)
        except FormError:
            form = {}
        if not await run_in_threadpool(_end, session, state.settings, cookie, form, request.headers):
            return render(
                request,
                "error.html",
                {
                    "title": "Forbidden",
                    "message": "The logout form had expired or came from another site. Reload the page and try again.",
                    "param": "csrf_token",
                    "back": "/",
                },
                status_code=403,
            )
    response = RedirectResponse(login_url(ended=True), status_code=303)
    clear_session_cookie(response, request)
    return response
