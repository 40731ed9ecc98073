"""The Content-Security-Policy in a real browser: every page, the login form and /docs work under it with
nothing blocked, and a blocked inline script would be seen."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .conftest import Dashboard, Tab

pytestmark = pytest.mark.browser

PAGES = ("/", "/gpus/idle", "/mig", "/waste", "/waste?group_by=tag:team", "/instances", "/instances/i-busy")


def test_every_page_keeps_to_the_policy(tab: Tab) -> None:
    page = tab.page
    for url in PAGES:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        assert "default-src 'self'" in response.headers["content-security-policy"], url
        expect(page.locator("#content")).to_be_visible()
        assert page.evaluate("typeof window.htmx") == "object", url
        # htmx was told not to add its indicator style, which the policy would block.
        assert page.locator("head style").count() == 0, url
    tab.assert_clean()


def test_login_form_keeps_to_the_policy(guest: Tab) -> None:
    response = guest.page.goto("/login")
    assert response is not None and response.status == 200
    expect(guest.page.locator("#token-login")).to_be_visible()
    guest.assert_clean()


def test_api_docs_render_from_local_assets(tab: Tab, dashboard: Dashboard) -> None:
    page = tab.page
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(dashboard.url + "/") else outside.append(r.url))
    response = page.goto("/docs")
    assert response is not None and response.status == 200
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("gpufleet")
    expect(page.locator(".opblock-summary-path", has_text="/api/v1/ingest").first).to_be_visible()
    assert outside == []
    tab.assert_clean()


def test_a_blocked_inline_script_is_reported(tab: Tab) -> None:
    page = tab.page
    page.goto("/")
    page.evaluate("""() => {
        const s = document.createElement('script');
        s.textContent = 'window.inlineRan = true';
        document.body.appendChild(s);
    }""")
    page.wait_for_timeout(100)
    assert page.evaluate("typeof window.inlineRan") == "undefined"
    assert any("script-src" in v for v in tab.csp_violations), tab.csp_violations
