"""The login form, sessions and logout over HTTP, as a browser on the server's own host would use them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from ipaddress import ip_network
from typing import Any

import httpx2
import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

from app.auth import revoke_token
from app.db import session_scope
from app.main import create_app
from app.models import WebSession
from app.passwords import hash_password
from app.sessions import SESSION_COOKIE
from app.settings import Settings
from app.state import AppState
from app.web import login as login_module
from app.web.csrf import LOGIN_CSRF_COOKIE
from tests.conftest import make_token

LOOPBACK = ("127.0.0.1", 50000)


def _client(settings: Settings, peer: tuple[str, int] = LOOPBACK, **kw: Any) -> TestClient:
    return TestClient(create_app(settings), client=peer, follow_redirects=False, **kw)


@pytest.fixture(scope="module")
def web(settings: Settings, engine: Any) -> Iterator[TestClient]:
    """A browser on the server's host: plain HTTP from 127.0.0.1, so the cookies carry no Secure flag."""
    with _client(settings) as c:
        yield c


@pytest.fixture(autouse=True)
def _fresh(web: TestClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(login_module, "FAILED_LOGIN_DELAY_S", 0.0)
    yield
    web.cookies.clear()
    state(web).failed_logins.clear()


def state(c: TestClient) -> AppState:
    app_state: AppState = c.app.state.gpufleet  # type: ignore[attr-defined]
    return app_state


def doc_of(r: httpx2.Response) -> BeautifulSoup:
    return BeautifulSoup(r.text, "html.parser")


def csrf_of(doc: BeautifulSoup, form: str = "#token-login") -> str:
    field = doc.select_one(f"{form} input[name=csrf_token]")
    assert field is not None, doc
    return str(field["value"])


def log_in(c: TestClient, next_path: str | None = None, **fields: str) -> httpx2.Response:
    """Open the login form as a browser would, then post it with `fields` (token or password)."""
    form = c.get("/login", params={"next": next_path} if next_path else None)
    assert form.status_code == 200, form.text
    which = "#password-login" if "password" in fields else "#token-login"
    data = {"csrf_token": csrf_of(doc_of(form), which), "next": next_path or "/", **fields}
    return c.post("/login", data=data)


def set_cookies(r: httpx2.Response) -> dict[str, Any]:
    jar: SimpleCookie = SimpleCookie()
    for header in r.headers.get_list("set-cookie"):
        jar.load(header)
    return dict(jar)


def test_a_page_without_credentials_goes_to_the_login_form(web: TestClient) -> None:
    r = web.get("/waste?window=24h&tag=team:a")
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=%2Fwaste%3Fwindow%3D24h%26tag%3Dteam%3Aa"
    form = web.get(r.headers["location"])
    assert form.status_code == 200
    doc = doc_of(form)
    assert doc.select_one("#token-login input[name=next]")["value"] == "/waste?window=24h&tag=team:a"  # type: ignore[index]
    assert doc.select_one("#password-login") is None  # no admin password configured
    assert doc.select_one("nav.nav") is None and doc.select_one("#account") is None
    csrf_cookie = set_cookies(form)[LOGIN_CSRF_COOKIE]
    assert csrf_cookie.value == csrf_of(doc)
    assert csrf_cookie["httponly"] and csrf_cookie["samesite"] == "strict" and csrf_cookie["path"] == "/login"


def test_an_htmx_request_gets_401_and_hx_redirect_to_the_page_it_came_from(web: TestClient) -> None:
    r = web.get("/mig", headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/mig?window=6h&sort=util"})
    assert r.status_code == 401
    assert r.headers["HX-Redirect"] == "/login?next=%2Fmig%3Fwindow%3D6h%26sort%3Dutil"
    assert r.text == ""


def test_a_read_token_logs_in_and_the_header_shows_who(web: TestClient, sessions: sessionmaker[Session]) -> None:
    token = make_token(sessions, "read", name="alice-laptop")
    r = log_in(web, "/gpus/idle?window=7d", token=token)
    assert r.status_code == 303
    assert r.headers["location"] == "/gpus/idle?window=7d"
    cookie = set_cookies(r)[SESSION_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "lax" and cookie["path"] == "/"
    assert not cookie["secure"]  # plain HTTP from loopback: a laptop must be able to log in
    assert int(cookie["max-age"]) == 12 * 3600
    # The database holds the cookie's hash, never the cookie.
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM web_sessions WHERE id_sha256 = :v"), {"v": cookie.value}) == 0
        assert s.scalar(text("SELECT count(*) FROM web_sessions")) == 1

    page = web.get("/gpus/idle?window=7d")
    assert page.status_code == 200
    account = doc_of(page).select_one("#account")
    assert account is not None and account["data-via"] == "session"
    assert account.select_one(".who").get_text() == "alice-laptop"  # type: ignore[union-attr]
    logout = account.select_one("form.logout")
    assert logout is not None and logout["method"] == "post" and logout["action"] == "/logout"
    assert logout.select_one("input[name=csrf_token]")["value"]  # type: ignore[index]
    # Signed in already: the login page sends the browser straight on.
    again = web.get("/login?next=/mig")
    assert again.status_code == 303 and again.headers["location"] == "/mig"


def test_an_admin_token_logs_in(web: TestClient, sessions: sessionmaker[Session]) -> None:
    r = log_in(web, token=make_token(sessions, "admin"))
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert web.get("/").status_code == 200


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("gpf_not-a-real-token", "Unknown or revoked token."),
        ("ingest", "This token may not read"),
        ("revoked", "Unknown or revoked token."),
        ("", "Enter a token."),
    ],
)
def test_a_failed_login_shows_the_form_again_with_why(
    web: TestClient, sessions: sessionmaker[Session], secret: str, message: str
) -> None:
    if secret == "ingest":
        secret = make_token(sessions, "ingest")
    elif secret == "revoked":
        secret = make_token(sessions, "read", name="gone")
        with session_scope(sessions) as s:
            revoke_token(s, "gone", now=datetime.now(UTC))
    r = log_in(web, "/mig", token=secret)
    assert r.status_code == 401
    assert SESSION_COOKIE not in set_cookies(r)
    doc = doc_of(r)
    error = doc.select_one("#login-error")
    assert error is not None and error.get_text().startswith(message)
    assert doc.select_one("#token-login input[name=next]")["value"] == "/mig"  # type: ignore[index]
    assert web.get("/").status_code == 303


def test_the_login_form_needs_its_own_csrf_token(web: TestClient, sessions: sessionmaker[Session]) -> None:
    token = make_token(sessions, "read")
    web.get("/login")
    # A cross-site form post: the field does not match the cookie (or the cookie is missing).
    r = web.post("/login", data={"csrf_token": "x" * 43, "token": token})
    assert r.status_code == 400
    assert "expired" in doc_of(r).select_one("#login-error").get_text()  # type: ignore[union-attr]
    web.cookies.clear()
    r = web.post("/login", data={"csrf_token": "x" * 43, "token": token})
    assert r.status_code == 400 and SESSION_COOKIE not in set_cookies(r)
    # The form shown again works.
    retry = web.post("/login", data={"csrf_token": csrf_of(doc_of(r)), "token": token})
    assert retry.status_code == 303


def test_a_login_post_must_be_a_form(web: TestClient) -> None:
    r = web.post("/login", json={"token": "x"})
    assert r.status_code == 400
    assert "x-www-form-urlencoded" in doc_of(r).select_one("#login-error").get_text()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "evil",
    [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "/\t/evil.example",
        "evil.example",
        "/login",
        "/logout",
    ],
)
def test_next_is_a_local_path_only(web: TestClient, sessions: sessionmaker[Session], evil: str) -> None:
    r = log_in(web, evil, token=make_token(sessions, "read"))
    assert r.status_code == 303
    assert r.headers["location"] == "/"


def test_logout_needs_the_session_csrf_token_and_ends_the_session(
    web: TestClient, sessions: sessionmaker[Session]
) -> None:
    log_in(web, token=make_token(sessions, "read"))
    page = web.get("/")
    token = csrf_of(doc_of(page), "form.logout")
    cookie = web.cookies[SESSION_COOKIE]

    forged = web.post("/logout", data={"csrf_token": "y" * 43})
    assert forged.status_code == 403
    assert web.get("/").status_code == 200  # still logged in

    r = web.post("/logout", data={"csrf_token": token})
    assert r.status_code == 303 and r.headers["location"] == "/login?ended=1"
    assert set_cookies(r)[SESSION_COOKIE]["max-age"] == "0"
    notice = doc_of(web.get(r.headers["location"])).select_one("p.notice")
    assert notice is not None and notice.get_text() == "You are logged out."
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM web_sessions")) == 0
    # The old cookie, replayed, opens nothing.
    web.cookies.clear()
    assert web.get("/", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}).status_code == 303


def test_an_htmx_logout_may_send_the_token_as_a_header(web: TestClient, sessions: sessionmaker[Session]) -> None:
    log_in(web, token=make_token(sessions, "read"))
    token = csrf_of(doc_of(web.get("/")), "form.logout")
    r = web.post("/logout", headers={"X-CSRF-Token": token, "HX-Request": "true"})
    assert r.status_code == 303
    assert web.get("/").status_code == 303


def test_revoking_the_token_ends_its_sessions(web: TestClient, sessions: sessionmaker[Session]) -> None:
    log_in(web, token=make_token(sessions, "read", name="contractor"))
    assert web.get("/").status_code == 200
    with session_scope(sessions) as s:
        revoke_token(s, "contractor", now=datetime.now(UTC))
    r = web.get("/instances")
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=%2Finstances&expired=1"
    assert set_cookies(r)[SESSION_COOKIE]["max-age"] == "0"
    notice = doc_of(web.get(r.headers["location"])).select_one("p.notice")
    assert notice is not None and "session has ended" in notice.get_text()


def test_an_expired_session_goes_back_to_the_login_form(web: TestClient, sessions: sessionmaker[Session]) -> None:
    log_in(web, token=make_token(sessions, "read"))
    with session_scope(sessions) as s:
        s.execute(update(WebSession).values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    r = web.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login?expired=1"
    # A new login removes the expired row.
    log_in(web, token=make_token(sessions, "read"))
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM web_sessions")) == 1


def test_logging_in_again_ends_the_previous_session(web: TestClient, sessions: sessionmaker[Session]) -> None:
    # A form opened in a second tab before the first login, posted after it.
    form = web.get("/login")
    log_in(web, token=make_token(sessions, "read"))
    first = web.cookies[SESSION_COOKIE]
    r = web.post("/login", data={"csrf_token": csrf_of(doc_of(form)), "token": make_token(sessions, "read")})
    assert r.status_code == 303
    assert web.cookies[SESSION_COOKIE] != first
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM web_sessions")) == 1


def test_repeated_failures_from_one_address_must_wait(web: TestClient, sessions: sessionmaker[Session]) -> None:
    limiter = state(web).failed_logins
    for _ in range(limiter.limit):
        assert log_in(web, token="gpf_wrong").status_code == 401
    r = log_in(web, token=make_token(sessions, "read"))
    assert r.status_code == 429
    assert 0 < int(r.headers["Retry-After"]) <= limiter.window_s
    assert "Too many failed logins" in doc_of(r).select_one("#login-error").get_text()  # type: ignore[union-attr]
    assert SESSION_COOKIE not in set_cookies(r)


def test_a_failed_login_answers_late(web: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login_module, "FAILED_LOGIN_DELAY_S", 0.3)
    start = time.monotonic()
    assert log_in(web, token="gpf_wrong").status_code == 401
    assert time.monotonic() - start >= 0.3


@pytest.fixture(scope="module")
def with_password(settings: Settings, engine: Any) -> Iterator[TestClient]:
    # The lowest cost scrypt accepts, so the tests stay quick; the default is 32 times that.
    configured = settings.model_copy(update={"admin_password_hash": hash_password("correct horse", n=2**10)})
    with _client(configured) as c:
        yield c


def test_the_admin_password_logs_in(with_password: TestClient, sessions: sessionmaker[Session]) -> None:
    c = with_password
    c.cookies.clear()
    form = doc_of(c.get("/login"))
    assert form.select_one("#password-login input[type=password][name=password]") is not None
    wrong = log_in(c, password="wrong horse")
    assert wrong.status_code == 401
    assert doc_of(wrong).select_one("#login-error").get_text() == "Wrong password."  # type: ignore[union-attr]
    r = log_in(c, "/waste", password="correct horse")
    assert r.status_code == 303 and r.headers["location"] == "/waste"
    account = doc_of(c.get("/waste")).select_one("#account .who")
    assert account is not None and account.get_text() == "admin"
    c.cookies.clear()
    state(c).failed_logins.clear()


def test_a_new_password_ends_the_sessions_of_the_old_one(
    with_password: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    with_password.cookies.clear()
    log_in(with_password, password="correct horse")
    cookie = with_password.cookies[SESSION_COOKIE]
    with_password.cookies.clear()
    changed = settings.model_copy(update={"admin_password_hash": hash_password("battery staple", n=2**10)})
    with _client(changed) as c:
        assert c.get("/", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}).status_code == 303
    # Without a configured password, no password session holds, and the form says there is none.
    with _client(settings) as c:
        assert c.get("/", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}).status_code == 303
        web_form = c.get("/login")
        r = c.post("/login", data={"csrf_token": csrf_of(doc_of(web_form)), "password": "correct horse"})
        assert r.status_code == 401
        assert "no admin password" in doc_of(r).select_one("#login-error").get_text()  # type: ignore[union-attr]


def test_bearer_tokens_read_pages_too(web: TestClient, sessions: sessionmaker[Session]) -> None:
    r = web.get("/", headers={"Authorization": f"Bearer {make_token(sessions, 'read', name='script')}"})
    assert r.status_code == 200
    account = doc_of(r).select_one("#account")
    assert account is not None and account["data-via"] == "token" and account.select_one("form") is None
    denied = web.get("/", headers={"Authorization": f"Bearer {make_token(sessions, 'ingest')}"})
    assert denied.status_code == 403
    assert denied.json()["error"] == "token scope 'ingest' does not allow 'read'"


@pytest.mark.parametrize(
    ("peer", "base_url", "mode", "secure"),
    [
        (LOOPBACK, "http://testserver", "auto", False),
        (("10.1.2.3", 40000), "http://testserver", "auto", True),
        (LOOPBACK, "https://testserver", "auto", True),
        (LOOPBACK, "http://testserver", "on", True),
        (("10.1.2.3", 40000), "https://testserver", "off", False),
    ],
)
def test_the_secure_flag(
    settings: Settings,
    sessions: sessionmaker[Session],
    peer: tuple[str, int],
    base_url: str,
    mode: str,
    secure: bool,
) -> None:
    configured = settings.model_copy(update={"cookie_secure": mode})
    with _client(configured, peer, base_url=base_url) as c:
        form = c.get("/login")
        assert bool(set_cookies(form)[LOGIN_CSRF_COOKIE]["secure"]) is secure
        r = c.post(
            "/login",
            data={"csrf_token": csrf_of(doc_of(form)), "token": make_token(sessions, "read")},
            headers={"Cookie": f"{LOGIN_CSRF_COOKIE}={csrf_of(doc_of(form))}"},
        )
        assert r.status_code == 303, r.text
        assert bool(set_cookies(r)[SESSION_COOKIE]["secure"]) is secure


def test_the_form_warns_when_the_cookie_cannot_stick(settings: Settings) -> None:
    with _client(settings, ("10.1.2.3", 40000), base_url="http://gpufleet.internal:8000") as c:
        assert doc_of(c.get("/login")).select_one("#insecure") is not None
    with _client(settings, ("10.1.2.3", 40000), base_url="https://gpufleet.internal") as c:
        assert doc_of(c.get("/login")).select_one("#insecure") is None


def test_with_auth_off_there_is_nothing_to_log_in_to(settings: Settings) -> None:
    with _client(settings.model_copy(update={"auth": "off"})) as c:
        r = c.get("/login?next=/mig")
        assert r.status_code == 303 and r.headers["location"] == "/mig"
        page = c.get("/")
        assert page.status_code == 200
        account = doc_of(page).select_one("#account .auth-off")
        assert account is not None and account.get_text() == "Auth off"
        assert c.post("/login", data={"token": "x"}).status_code == 303


def test_a_trusted_proxy_user_is_shown_and_signs_out_at_the_proxy(settings: Settings) -> None:
    configured = settings.model_copy(
        update={"trusted_proxies": [ip_network("127.0.0.1/32")], "proxy_user_header": "x-amzn-oidc-identity"}
    )
    with _client(configured) as c:
        r = c.get("/mig", headers={"X-Amzn-Oidc-Identity": "9f1c-user-sub"})
        assert r.status_code == 200
        account = doc_of(r).select_one("#account")
        assert account is not None and account["data-via"] == "proxy"
        assert account.select_one(".who").get_text() == "9f1c-user-sub"  # type: ignore[union-attr]
        assert account.select_one("form.logout") is None
        assert c.get("/login", headers={"X-Amzn-Oidc-Identity": "9f1c-user-sub"}).status_code == 303
        # A header given twice may be one the client sent and one the proxy added: neither is believed.
        twice = c.get("/", headers=[("X-Amzn-Oidc-Identity", "me"), ("X-Amzn-Oidc-Identity", "admin")])
        assert twice.status_code == 303
        assert c.get("/", headers={"X-Amzn-Oidc-Identity": "  "}).status_code == 303
