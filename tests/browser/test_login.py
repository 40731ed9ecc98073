"""Logging in through the real form with a token, and out again; a session that ends under an open page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect
from sqlalchemy import delete, select

from app.db import session_scope
from app.models import ApiToken, WebSession
from app.sessions import SESSION_COOKIE, open_session

from .conftest import Dashboard, Tab

pytestmark = pytest.mark.browser


def test_log_in_with_a_token_see_the_overview_and_log_out(guest: Tab, dashboard: Dashboard) -> None:
    page = guest.page
    page.goto("/waste?window=24h")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fwaste%3Fwindow%3D24h$"))
    expect(page.locator("h1")).to_have_text("Log in")
    expect(page.locator("nav.nav")).to_have_count(0)
    guest.shot("login")

    page.fill("#token-login input[name=token]", "gpf_wrong")
    page.click("#token-login button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("Unknown or revoked token.")
    guest.errors.clear()  # the 401 of the failed login is the point of this step

    page.fill("#token-login input[name=token]", dashboard.read_token)
    page.click("#token-login button[type=submit]")
    expect(page).to_have_url(f"{dashboard.url}/waste?window=24h")
    expect(page.locator("#account .who")).to_have_text("browser-reader")
    cookie = next(c for c in page.context.cookies() if c["name"] == SESSION_COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/"

    page.click("nav a[href='/']")
    expect(page.locator("h1")).to_have_text("Fleet overview")
    assert page.locator("[data-figure=instances]").inner_text().strip() == "3"
    guest.shot("logged-in")

    page.click("#account form.logout button[type=submit]")
    expect(page).to_have_url(f"{dashboard.url}/login?ended=1")
    expect(page.locator("p.notice")).to_have_text("You are logged out.")
    assert all(c["name"] != SESSION_COOKIE for c in page.context.cookies())
    page.goto("/mig")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fmig$"))
    guest.assert_clean()


def test_a_session_ended_under_an_open_page_leads_to_the_login_form(guest: Tab, dashboard: Dashboard) -> None:
    with session_scope(dashboard.sessions) as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == "browser-reader"))
        cookie, live = open_session(
            s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=1), now=datetime.now(UTC)
        )
    page = guest.page
    page.context.add_cookies([{"name": SESSION_COOKIE, "value": cookie, "url": dashboard.url}])
    page.goto("/gpus/idle?window=6h")
    expect(page.locator("#account .who")).to_have_text("browser-reader")
    with session_scope(dashboard.sessions) as s:
        s.execute(delete(WebSession).where(WebSession.id_sha256 == live.id_sha256))
    # The next htmx refresh (every 2 s here) gets 401 with HX-Redirect, and htmx loads the login page.
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fgpus%2Fidle%3Fwindow%3D6h&expired=1$"), timeout=15_000)
    expect(page.locator("p.notice")).to_have_text("Your session has ended. Log in again.")
    assert [e for e in guest.errors if "HTTP 401" not in e and "status of 401" not in e] == []
