"""Who may see the dashboard: the dependency every page takes, the way to the login form, the session cookie.

A page needs a reader (app.auth.require_read). Without credentials, or with a session cookie that no longer
holds, a request for a page's JSON (`Accept: application/json`) gets the API's 401; a full-page request is sent
to `/login?next=<its path>` (303) and an htmx request gets 401 with an `HX-Redirect` header to the same place,
so htmx loads the login page instead of swapping in a fragment. A bad bearer token is a script's mistake and
gets the API's 401 or 403 answer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..auth import LoginRequired, NotAdmin, Reader, is_loopback, require_admin, require_read
from ..deps import SessionDep, SettingsDep
from ..sessions import SESSION_COOKIE
from ..state import app_state
from .csrf import use_token
from .errors import wants_json
from .templating import is_htmx

LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"


class ToLogin(Exception):
    """Raised by `page_reader` and `admin_page_reader`; `to_login` answers it."""

    def __init__(self, *, stale_cookie: bool, next_path: str | None = None) -> None:
        super().__init__("login required")
        self.stale_cookie = stale_cookie
        self.next_path = next_path
        """Where to come back to after the login; None: the request's own page."""


def page_reader(request: Request, session: SessionDep, settings: SettingsDep) -> Reader:
    """The dependency of every dashboard page: the reader, also kept in `request.state.reader` for templates.
    It shares the request's database session with the page (app/deps.py)."""
    try:
        reader = require_read(session, request, settings, now=datetime.now(UTC), dashboard=True)
    except LoginRequired as err:
        if wants_json(request):
            raise  # a script asking for a page's JSON gets the API's 401, not the login form
        raise ToLogin(stale_cookie=SESSION_COOKIE in request.cookies) from err
    request.state.reader = reader
    if reader.session is not None:
        use_token(request, reader.session.csrf_secret)
    return reader


def admin_page_reader(request: Request, session: SessionDep, settings: SettingsDep) -> Reader:
    """The dependency of the admin pages (/alerts): an admin (app.auth.require_admin), also kept in
    `request.state.reader`. Without a login a browser goes to the login form, to come back to the page it posted
    from; a login that may only read, or a user of a trusted proxy, gets the 403 error page. With
    GPUFLEET_AUTH=off the page is shown, read only, on this host: there is no login to make changes with."""
    reading = request.method in ("GET", "HEAD")
    try:
        reader = require_admin(session, request, settings, now=datetime.now(UTC), reading=reading, dashboard=True)
    except LoginRequired as err:
        if wants_json(request):
            raise
        if settings.auth == "off":
            raise HTTPException(403, err.error) from None
        back = None if reading else urlsplit(request.headers.get("referer", "")).path or "/"
        raise ToLogin(stale_cookie=SESSION_COOKIE in request.cookies, next_path=back) from err
    except NotAdmin as err:
        if wants_json(request):
            raise
        raise HTTPException(403, err.error) from None
    request.state.reader = reader
    if reader.session is not None:
        use_token(request, reader.session.csrf_secret)
    return reader


def safe_next(value: str | None) -> str:
    """Where to go after logging in: a path on this server, else `/`. Another site (`https://...`, `//host`,
    `/\\host`), control characters and the login and logout paths themselves all become `/`."""
    if not value or len(value) > 2000 or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or parts.path in (LOGIN_PATH, LOGOUT_PATH):
        return "/"
    return value


def login_url(next_path: str = "/", **flags: bool) -> str:
    """The login page, to come back to `next_path`; `flags` (`expired`, `ended`) choose a notice on it."""
    params = [("next", next_path)] if next_path != "/" else []
    params += [(name, "1") for name, on in flags.items() if on]
    return f"{LOGIN_PATH}?{urlencode(params)}" if params else LOGIN_PATH


def _return_path(request: Request) -> str:
    url = request.url
    if is_htmx(request):
        # A fragment's own URL may not be a page: come back to the page the browser shows.
        current = request.headers.get("HX-Current-URL")
        if current:
            url_parts = urlsplit(current)
            return safe_next(url_parts.path + (f"?{url_parts.query}" if url_parts.query else ""))
    return safe_next(url.path + (f"?{url.query}" if url.query else ""))


async def to_login(request: Request, exc: Exception) -> Response:
    """303 to the login page, or for htmx 401 with `HX-Redirect`; a stale session cookie is dropped."""
    stale = isinstance(exc, ToLogin) and exc.stale_cookie
    back = exc.next_path if isinstance(exc, ToLogin) and exc.next_path else None
    target = login_url(safe_next(back) if back else _return_path(request), expired=stale)
    response: Response
    if is_htmx(request):
        response = Response(status_code=401, headers={"HX-Redirect": target})
    else:
        response = RedirectResponse(target, status_code=303)
    response.headers["Cache-Control"] = "no-store"
    response.headers.add_vary_header("HX-Request")
    if stale:
        clear_session_cookie(response, request)
    return response


def cookie_secure(conn: Request) -> bool:
    """Whether cookies get the Secure flag: GPUFLEET_COOKIE_SECURE on or off, or by default (auto) always except
    on a plain-HTTP request from this host, so that `http://127.0.0.1:8000` can log in."""
    mode = app_state(conn).settings.cookie_secure
    if mode != "auto":
        return mode == "on"
    return not (conn.url.scheme == "http" and is_loopback(conn))


def set_session_cookie(response: Response, conn: Request, value: str, *, max_age_s: int) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=max_age_s,
        path="/",
        secure=cookie_secure(conn),
        httponly=True,
        samesite="lax",
    )


def clear_session_cookie(response: Response, conn: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", secure=cookie_secure(conn), httponly=True, samesite="lax")
