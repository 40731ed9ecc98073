"""The app serves the dashboard's assets from static/, without any CDN."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.web.templating import STATIC_DIR, static_url


def test_serves_the_stylesheet(client: TestClient) -> None:
    r = client.get("/static/app.css")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/css")
    assert ".state-unpartitioned" in r.text
    # Unversioned URLs keep the default caching.
    assert "immutable" not in r.headers.get("cache-control", "")


def test_serves_htmx(client: TestClient) -> None:
    r = client.get("/static/vendor/htmx.min.js")
    assert r.status_code == 200
    assert "javascript" in r.headers["content-type"]
    assert r.content == (STATIC_DIR / "vendor" / "htmx.min.js").read_bytes()
    assert b"htmx" in r.content[:200]


def test_versioned_urls_are_cached_for_good(client: TestClient) -> None:
    r = client.get(static_url("app.css"))
    assert r.status_code == 200
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"


def test_url_for_static(client: TestClient) -> None:
    assert client.app.url_path_for("static", path="app.css") == "/static/app.css"  # type: ignore[attr-defined]


def test_no_path_escapes_static(client: TestClient) -> None:
    assert client.get("/static/../pyproject.toml").status_code == 404
    assert client.get("/static/%2e%2e/pyproject.toml").status_code == 404
    assert client.get("/static/missing.css").status_code == 404
