"""Fetching a page three ways (HTML, htmx fragment, JSON) in the view tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

JSON = {"Accept": "application/json"}


def recent_start(hours: float) -> datetime:
    """A start such that `hours` of intervals end just before now (to the minute)."""
    return datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=hours)


def get_json(client: TestClient, url: str, status: int = 200) -> Any:
    r = client.get(url, headers=JSON)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"].startswith("application/json")
    if status == 200:
        assert "Accept" in r.headers.get("vary", "")
    return r.json()


def get_html(client: TestClient, url: str, status: int = 200, **headers: str) -> BeautifulSoup:
    r = client.get(url, headers=headers)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"].startswith("text/html")
    return BeautifulSoup(r.text, "html.parser")


def fragment(client: TestClient, url: str) -> BeautifulSoup:
    doc = get_html(client, url, **{"HX-Request": "true"})
    assert doc.select_one("html") is None and doc.select_one("nav.nav") is None
    return doc


def assert_bad_parameter(client: TestClient, url: str, param: str) -> None:
    """`url` names a parameter the page cannot use: 400 naming `param`, as the API's JSON error and as an error
    page."""
    body = get_json(client, url, status=400)
    assert body["error"] and [d["field"] for d in body["detail"]] == [param]
    r = client.get(url)
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert BeautifulSoup(r.text, "html.parser").select_one(".error")["data-param"] == param
