"""Every route of the app against every kind of caller, generated from the route table.

Each route says who may call it: a dashboard page by the router dependency `page_reader`, any other route by
its OpenAPI security declaration (`app.auth.requires`); FastAPI's own documentation routes and the static mount
are listed here. A route that says nothing fails `test_every_route_says_who_may_call_it`, so a new route cannot
be left out of the matrix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Mount, Route

from app.auth import BEARER, revoke_token
from app.db import session_scope
from app.main import create_app
from app.models import ApiToken, WebSession
from app.sessions import SESSION_COOKIE, open_session
from app.settings import Settings
from app.web.access import admin_page_reader, page_reader
from app.web.csrf import CSRF_HEADER
from tests.conftest import make_token

PUBLIC = "public"
PAGE = "page"  # read access; without it a browser is sent to the login form
READ = "read"
INGEST = "ingest"
ADMIN = "admin"  # the alert rules' API: an admin token or an admin login
ADMIN_PAGE = "admin page"  # /alerts and its forms: an admin; without a login a browser is sent to the login form
PAGES = (PAGE, ADMIN_PAGE)
ADMINS = (ADMIN, ADMIN_PAGE)

# FastAPI's own routes: the API description is public (docs/security.md).
FRAMEWORK = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
MOUNTS = {"/static": "/static/app.css"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    """With a sample value for each path parameter."""
    access: str

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def access_of(route: RouteContext) -> str | None:
    if any(dep.call is page_reader for dep in route.dependant.dependencies):
        return PAGE
    if any(dep.call is admin_page_reader for dep in route.dependant.dependencies):
        return ADMIN_PAGE
    security = (route.openapi_extra or {}).get("security")
    if security is None:
        return None
    if security == []:
        return PUBLIC
    scopes = {scope for requirement in security for scope in requirement.get(BEARER, [])}
    return {frozenset({"read"}): READ, frozenset({"ingest"}): INGEST, frozenset({"admin"}): ADMIN}.get(
        frozenset(scopes)
    )


def route_table(app: FastAPI) -> tuple[list[Endpoint], list[str]]:
    """Every (method, path) with its access, and the routes that do not say theirs."""
    endpoints: list[Endpoint] = []
    unclassified: list[str] = []
    # Included routers are flattened: each route as served, with its router's dependencies and prefix.
    for route in iter_route_contexts(app.routes):
        original, path = route.original_route, route.path or ""
        methods = sorted((route.methods or {"GET"}) - {"HEAD"})
        if isinstance(original, Mount):
            if path in MOUNTS:
                endpoints.append(Endpoint("GET", MOUNTS[path], PUBLIC))
            else:
                unclassified.append(f"mount {path}")
        elif isinstance(original, APIRoute):
            access = access_of(route)
            if access is None:
                unclassified.append(f"{methods} {path}")
                continue
            endpoints += [Endpoint(m, re.sub(r"\{[^}]+\}", "x", path), access) for m in methods]
        elif isinstance(original, Route) and path in FRAMEWORK:
            endpoints += [Endpoint(m, path, PUBLIC) for m in methods]
        else:
            unclassified.append(f"{type(original).__name__} {path}")
    return endpoints, unclassified


_APP = create_app(Settings(database_url="postgresql://unused@localhost/unused", data_dir=Path("/nonexistent")))
ENDPOINTS, UNCLASSIFIED = route_table(_APP)
PROTECTED = [e for e in ENDPOINTS if e.access != PUBLIC]


def test_every_route_says_who_may_call_it() -> None:
    assert UNCLASSIFIED == [], "routes without an access declaration (app.auth.requires or page_reader)"
    kinds = {e.access for e in ENDPOINTS}
    assert kinds == {PUBLIC, PAGE, READ, INGEST, ADMIN, ADMIN_PAGE}
    assert Endpoint("POST", "/api/v1/ingest", INGEST) in ENDPOINTS
    assert Endpoint("GET", "/api/v1/report", READ) in ENDPOINTS
    assert Endpoint("GET", "/", PAGE) in ENDPOINTS
    assert Endpoint("GET", "/healthz", PUBLIC) in ENDPOINTS
    assert Endpoint("POST", "/logout", PUBLIC) in ENDPOINTS
    assert Endpoint("PUT", "/api/v1/alerts/x", ADMIN) in ENDPOINTS
    assert Endpoint("GET", "/alerts", ADMIN_PAGE) in ENDPOINTS
    assert Endpoint("POST", "/alerts/x/delete", ADMIN_PAGE) in ENDPOINTS


def test_the_openapi_description_names_the_scopes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"][BEARER] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"][BEARER]["description"],
    }
    assert spec["paths"]["/api/v1/ingest"]["post"]["security"] == [{BEARER: ["ingest"]}]
    assert {BEARER: ["read"]} in spec["paths"]["/api/v1/report"]["get"]["security"]
    assert spec["paths"]["/healthz"]["get"]["security"] == []
    assert {BEARER: ["admin"]} in spec["paths"]["/api/v1/alerts"]["post"]["security"]


@dataclass
class Callers:
    """Credentials of every kind, made for one test."""

    sessions: sessionmaker[Session]

    def token(self, scope: str) -> str:
        return make_token(self.sessions, scope)

    def revoked(self, scope: str) -> str:
        secret = make_token(self.sessions, scope, name=f"revoked-{scope}")
        with session_scope(self.sessions) as s:
            revoke_token(s, f"revoked-{scope}", now=datetime.now(UTC))
        return secret

    def session(self, *, expired: bool = False, revoked: bool = False, scope: str = "read") -> str:
        return self.session_and_csrf(expired=expired, revoked=revoked, scope=scope)[0]

    def session_and_csrf(self, *, expired: bool = False, revoked: bool = False, scope: str = "read") -> tuple[str, str]:
        name = f"session-{scope}-{'expired' if expired else 'revoked' if revoked else 'live'}"
        make_token(self.sessions, scope, name=name)
        now = datetime.now(UTC)
        with session_scope(self.sessions) as s:
            token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == name))
            cookie, live = open_session(s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=1), now=now)
            if expired:
                s.execute(update(WebSession).where(WebSession.token_id == token_id).values(expires_at=now))
        if revoked:
            with session_scope(self.sessions) as s:
                s.execute(update(ApiToken).where(ApiToken.name == name).values(revoked_at=now))
        return cookie, live.csrf_secret


@pytest.fixture
def callers(sessions: sessionmaker[Session]) -> Callers:
    return Callers(sessions)


@pytest.fixture(scope="module")
def anon(settings: Settings, engine: Any) -> Iterator[TestClient]:
    """A client of its own, which never keeps a cookie between requests and never follows a redirect."""
    with TestClient(create_app(settings), follow_redirects=False) as c:
        yield c


def call(c: TestClient, e: Endpoint, *, bearer: str | None = None, cookie: str | None = None, **headers: str) -> Any:
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    if cookie:
        headers["Cookie"] = f"{SESSION_COOKIE}={cookie}"
    c.cookies.clear()
    return c.request(e.method, e.path, headers=headers)


def assert_denied(r: Any, e: Endpoint, status: int, *, expired: bool = False) -> None:
    """`status` for the API; a page sends a browser without credentials to the login form instead of 401."""
    if e.access in PAGES and status == 401:
        assert r.status_code == 303, (str(e), r.status_code, r.text[:300])
        location = r.headers["location"]
        assert location.startswith("/login"), location
        assert ("expired=1" in location) is expired
        return
    assert r.status_code == status, (str(e), r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]
    if status == 401:
        assert r.headers["WWW-Authenticate"].startswith("Bearer")


def assert_allowed(r: Any, e: Endpoint) -> None:
    assert r.status_code not in (401, 403), (str(e), r.status_code, r.text[:300])
    assert not (r.status_code == 303 and r.headers["location"].startswith("/login")), str(e)


@pytest.mark.parametrize("endpoint", [e for e in ENDPOINTS if e.access == PUBLIC], ids=str)
def test_public_routes_need_nothing(anon: TestClient, endpoint: Endpoint) -> None:
    r = call(anon, endpoint)
    assert r.status_code not in (401, 403), (str(endpoint), r.status_code, r.text[:300])


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_without_credentials(anon: TestClient, endpoint: Endpoint) -> None:
    assert_denied(call(anon, endpoint), endpoint, 401)
    if endpoint.access in PAGES:
        htmx = call(anon, endpoint, **{"HX-Request": "true"})
        assert htmx.status_code == 401
        assert htmx.headers["HX-Redirect"].startswith("/login")
        # A page asked for its JSON answers as the API does: 401 with the error shape, no redirect.
        data = call(anon, endpoint, Accept="application/json")
        assert data.status_code == 401 and data.headers["content-type"].startswith("application/json")
        assert data.json()["error"]


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_a_token_of_another_scope_is_forbidden(anon: TestClient, callers: Callers, endpoint: Endpoint) -> None:
    other = "read" if endpoint.access == INGEST else "ingest"
    assert_denied(call(anon, endpoint, bearer=callers.token(other)), endpoint, 403)
    if endpoint.access in ADMINS:
        assert_denied(call(anon, endpoint, bearer=callers.token("read")), endpoint, 403)


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_a_revoked_or_unknown_token_is_refused(anon: TestClient, callers: Callers, endpoint: Endpoint) -> None:
    right = INGEST if endpoint.access == INGEST else "read"
    for secret in (callers.revoked(right), "gpf_unknown"):
        r = call(anon, endpoint, bearer=secret)
        # A bad bearer token is a script's mistake: pages answer it as the API does, not with the login form.
        assert r.status_code == 401, (str(endpoint), r.status_code)
        assert r.json()["error"] in ("token revoked", "unknown token")


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_an_expired_or_ended_session_is_refused(anon: TestClient, callers: Callers, endpoint: Endpoint) -> None:
    for cookie in (callers.session(expired=True), callers.session(revoked=True), "not-a-session"):
        r = call(anon, endpoint, cookie=cookie)
        # The ingest route takes no cookies at all, so it only sees a missing token.
        assert_denied(r, endpoint, 401, expired=endpoint.access in PAGES)
        if endpoint.access in PAGES:
            assert f'{SESSION_COOKIE}=""' in r.headers["set-cookie"]


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_the_right_credentials_pass(anon: TestClient, callers: Callers, endpoint: Endpoint) -> None:
    if endpoint.access == INGEST:
        for scope in ("ingest", "admin"):
            assert_allowed(call(anon, endpoint, bearer=callers.token(scope)), endpoint)
        # A dashboard session never writes, whatever its token may do.
        assert_denied(call(anon, endpoint, cookie=callers.session()), endpoint, 401)
        return
    if endpoint.access in ADMINS:
        assert_allowed(call(anon, endpoint, bearer=callers.token("admin")), endpoint)
        cookie, csrf = callers.session_and_csrf(scope="admin")
        # A login's changes also carry its CSRF token (app/web/csrf.py), as the page's forms and scripts send it.
        assert_allowed(call(anon, endpoint, cookie=cookie, **{CSRF_HEADER: csrf}), endpoint)
        # Who may only read may not manage alert rules: a page answers with its error page, the API with JSON.
        r = call(anon, endpoint, cookie=callers.session())
        assert r.status_code == 403, (str(endpoint), r.status_code)
        assert r.headers["content-type"].startswith(
            "text/html" if endpoint.access == ADMIN_PAGE else "application/json"
        )
        return
    for scope in ("read", "admin"):
        assert_allowed(call(anon, endpoint, bearer=callers.token(scope)), endpoint)
    assert_allowed(call(anon, endpoint, cookie=callers.session()), endpoint)


@pytest.fixture(scope="module")
def auth_off(settings: Settings, engine: Any) -> Iterator[TestClient]:
    with TestClient(
        create_app(settings.model_copy(update={"auth": "off"})), client=("127.0.0.1", 50000), follow_redirects=False
    ) as c:
        yield c


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_with_auth_off_reading_is_open_on_loopback_and_writing_is_not(
    auth_off: TestClient, settings: Settings, callers: Callers, endpoint: Endpoint
) -> None:
    r = call(auth_off, endpoint)
    if endpoint.access == INGEST or (endpoint.access in ADMINS and endpoint.method != "GET"):
        # Changing alert rules needs an admin token: there is no login to make the changes with.
        if endpoint.access == ADMIN_PAGE:
            assert r.status_code == 403 and "GPUFLEET_AUTH=off" in r.text, (str(endpoint), r.status_code)
        else:
            assert_denied(r, endpoint, 401)
        assert_denied(call(auth_off, endpoint, bearer=callers.token("read")), endpoint, 403)
        right = "ingest" if endpoint.access == INGEST else "admin"
        assert_allowed(call(auth_off, endpoint, bearer=callers.token(right)), endpoint)
        return
    assert_allowed(r, endpoint)
    # Another host never reads without credentials, even if the server was started some other way than
    # `gpufleet serve`, which refuses a non-loopback address with auth off.
    remote = TestClient(auth_off.app, client=("192.0.2.7", 50000), follow_redirects=False)
    denied = call(remote, endpoint)
    assert denied.status_code == 403, (str(endpoint), denied.status_code)
    assert "GPUFLEET_AUTH=off" in denied.json()["error"]


@pytest.fixture(scope="module")
def behind_proxy(settings: Settings, engine: Any) -> Iterator[TestClient]:
    configured = settings.model_copy(
        update={
            "trusted_proxies": [ip_network("10.0.0.0/24"), ip_network("::1")],
            "proxy_user_header": "X-Auth-Request-Email",
        }
    )
    with TestClient(create_app(configured), client=("10.0.0.9", 50000), follow_redirects=False) as c:
        yield c


@pytest.mark.parametrize("endpoint", PROTECTED, ids=str)
def test_a_trusted_proxy_user_reads_pages_and_nobody_else_claims_to_be_one(
    behind_proxy: TestClient, endpoint: Endpoint
) -> None:
    user = {"X-Auth-Request-Email": "ada@example.com"}
    r = call(behind_proxy, endpoint, **user)
    if endpoint.access == ADMIN_PAGE:
        # The proxy names a reader, not an admin.
        assert r.status_code == 403 and r.headers["content-type"].startswith("text/html"), (
            str(endpoint),
            r.status_code,
        )
        elsewhere = TestClient(behind_proxy.app, client=("10.0.1.9", 50000), follow_redirects=False)
        assert_denied(call(elsewhere, endpoint, **user), endpoint, 401)
        return
    if endpoint.access != PAGE:
        # The API takes tokens only: a proxy may pass API paths through without a login.
        assert_denied(r, endpoint, 401)
        return
    assert_allowed(r, endpoint)
    elsewhere = TestClient(behind_proxy.app, client=("10.0.1.9", 50000), follow_redirects=False)
    assert_denied(call(elsewhere, endpoint, **user), endpoint, 401)
