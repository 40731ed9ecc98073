"""One rule for every page: JSON when `Accept` names JSON and not HTML, the live block for htmx, else the page;
each page's JSON published in the OpenAPI schema with its access rule."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

PAGES = ["/", "/gpus/idle", "/mig", "/waste", "/heatmap", "/heatmap/week", "/instances", "/instances/{instance_id}"]


@pytest.mark.parametrize(
    ("accept", "json"),
    [
        ("application/json", True),
        ("application/json, */*;q=0.1", True),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", False),
        ("text/html, application/json", False),
        ("*/*", False),
        ("", False),
    ],
)
def test_accept_chooses_json_or_html(client: TestClient, engine: Any, accept: str, json: bool) -> None:
    r = client.get("/gpus/idle", headers={"Accept": accept} if accept else {})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json" if json else "text/html")
    assert r.headers["vary"] == "Accept, HX-Request"


def test_every_page_publishes_its_json(client: TestClient, engine: Any) -> None:
    spec = client.get("/openapi.json").json()
    for path in PAGES:
        op = spec["paths"][path]["get"]
        assert op["tags"] == ["dashboard"]
        ok = op["responses"]["200"]["content"]
        ref = ok["application/json"]["schema"]["$ref"]
        assert ref.startswith("#/components/schemas/") and ref.endswith("View")
        assert "text/html" in ok
        assert {"bearerToken": ["read"]} in op["security"]
        names = {p["name"] for p in op["parameters"]}
        assert {"window", "start", "end"} <= names
        # Each page lists what it reads: the instance page no filters, pages without a sortable table no order.
        assert ("region" in names) == (path != "/instances/{instance_id}")
        assert ("sort" in names) == (path in ("/gpus/idle", "/waste", "/instances"))
    idle = spec["components"]["schemas"]["IdleView"]
    assert {"rows", "count", "burned_usd", "usd_per_day", "window", "pager"} <= set(idle["properties"])
    assert "group_by" in {p["name"] for p in spec["paths"]["/waste"]["get"]["parameters"]}
    assert "rows" in {p["name"] for p in spec["paths"]["/heatmap"]["get"]["parameters"]}
