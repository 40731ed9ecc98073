"""Browser hardening: the security headers on every answer, no-store behind the login, assets cached, a CSP
that the templates keep to, and /docs served without any CDN."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.web.templating import STATIC_DIR, TEMPLATES_DIR, static_url
from tests.conftest import make_token


def assert_hardened(h: Mapping[str, str]) -> None:
    """`h`: a response's headers, looked up case-insensitively."""
    csp = h["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert "unsafe" not in csp and "http" not in csp
    assert h["x-frame-options"] == "DENY"
    assert h["x-content-type-options"] == "nosniff"
    assert h["referrer-policy"] == "same-origin"


def test_pages_behind_the_login_are_hardened_and_not_stored(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    token = make_token(sessions, "read")
    for path in ("/", "/gpus/idle", "/mig", "/waste", "/instances"):
        r = client.get(path, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, path
        assert_hardened(r.headers)
        assert r.headers["cache-control"] == "no-store", path
    r = client.get("/api/v1/report", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    assert_hardened(r.headers)
    assert r.headers["cache-control"] == "no-store"


def test_login_and_error_answers_are_hardened(client: TestClient) -> None:
    for path in ("/login", "/api/v1/nothing", "/nothing", "/healthz", "/openapi.json"):
        r = client.get(path, follow_redirects=False)
        assert_hardened(r.headers)
        assert r.headers["cache-control"] == "no-store", path
    r = client.get("/", follow_redirects=False)  # to the login form
    assert r.status_code == 303
    assert_hardened(r.headers)


def test_static_assets_keep_their_caching(client: TestClient) -> None:
    r = client.get(static_url("app.css"))
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert r.headers["x-content-type-options"] == "nosniff"
    r = client.get("/static/app.css")
    assert r.status_code == 200 and r.headers.get("cache-control") != "no-store"


# What the policy forbids must not be in the pages: inline script, inline style, event handler attributes.
INLINE = {
    "script element with a body": re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I),
    "style element": re.compile(r"<style\b", re.I),
    "style attribute": re.compile(r"\sstyle\s*=", re.I),
    "event handler attribute": re.compile(r"\son[a-z]+\s*=", re.I),
    "javascript: URL": re.compile(r"javascript:", re.I),
}


def test_templates_have_nothing_inline() -> None:
    found = [
        f"{path.name}: {what}"
        for path in sorted(Path(TEMPLATES_DIR).rglob("*.html"))
        for what, pattern in INLINE.items()
        if pattern.search(path.read_text())
    ]
    assert found == []
    # htmx adds a style element for its indicators unless told not to.
    assert '{"includeIndicatorStyles": false' in (Path(TEMPLATES_DIR) / "base.html").read_text()


def test_rendered_pages_have_nothing_inline(client: TestClient, sessions: sessionmaker[Session]) -> None:
    token = make_token(sessions, "read")
    for path in ("/", "/gpus/idle", "/mig", "/waste?group_by=team", "/instances", "/login", "/nothing", "/docs"):
        html = client.get(path, headers={"Authorization": f"Bearer {token}"}).text
        page = BeautifulSoup(html, "html.parser")
        assert all(s.get("src") for s in page.find_all("script")), path
        assert page.find("style") is None, path
        attributes = [a for tag in page.find_all(True) for a in tag.attrs if a == "style" or a.startswith("on")]
        assert attributes == [], path


def test_api_docs_come_from_the_package(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    assert_hardened(r.headers)
    page = BeautifulSoup(r.text, "html.parser")
    urls = [t.get("src") or t.get("href") for t in page.find_all(["script", "link"])]
    assert urls and all(str(u).startswith(("/static/", "data:")) for u in urls), urls
    for url in urls:
        if str(url).startswith("/static/"):
            asset = client.get(str(url))
            assert asset.status_code == 200, url
    assert (STATIC_DIR / "vendor" / "swagger-ui.LICENSE").exists()
    assert page.select_one("#swagger-ui")["data-openapi-url"] == "/openapi.json"  # type: ignore[index]
    assert client.get("/openapi.json").json()["info"]["title"] == "gpufleet"
    # No page that would load its assets from a CDN.
    assert client.get("/redoc").status_code == 404
    assert client.get("/docs/oauth2-redirect").status_code == 404
