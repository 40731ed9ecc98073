"""bench/pages.py: which URLs are timed, and the checks over the timings."""

from __future__ import annotations

from typing import Any

from bench.harness import Timing
from bench.pages import NEW_URLS, URLS, checks, json_problem, page_urls


def figures(p95: float, status: int = 200) -> dict[str, Any]:
    return {"p50_ms": p95 / 2, "p95_ms": p95, "bytes": 1000, "status": status, "content_type": "text/html"}


def timing(status: int = 200, content_type: str = "application/json", body: bytes = b"{}") -> Timing:
    return Timing(1.0, 2.0, len(body), status, {status: 1}, content_type, body)


def test_page_urls() -> None:
    everything = page_urls("i-0abc", [])
    assert len(everything) == len(URLS)
    assert "/instances/i-0abc?window=24h" in everything
    assert "/instances/{id}?window=24h" not in page_urls(None, [])
    assert len(page_urls(None, [])) == len(URLS) - 1
    assert page_urls("i-0abc", ["heatmap"]) == sorted(NEW_URLS, key=URLS.index)
    assert page_urls("i-0abc", ["/mig", "instances/i-"]) == ["/mig?window=24h", "/instances/i-0abc?window=24h"]


def test_checks() -> None:
    tables = {
        "pages": {
            "/?window=24h": figures(40.0),
            "/?window=30d": figures(60.0),
            "/heatmap?window=7d": figures(80.0),
            "/heatmap/week?window=30d": figures(1.0, status=404),
        },
        "fragments": {"/heatmap?window=7d": figures(100.0)},
        "json": {"/?window=24h": figures(30.0)},
    }
    found = checks(tables, ["/heatmap/week?window=30d (pages): status 404"])
    assert found["slowest_p95_ms"] == 100.0
    assert found["new_vs_overview_max_ratio"] == 2.5  # the 404 does not count
    assert found["month_vs_day_overview"] == 1.5
    assert found["all_under_150ms"] is False  # a page that answered 404
    assert found["problems"] == ["/heatmap/week?window=30d (pages): status 404"]
    del tables["pages"]["/heatmap/week?window=30d"]
    assert checks(tables, [])["all_under_150ms"] is True
    tables["json"]["/?window=24h"] = figures(150.0)
    assert checks(tables, [])["all_under_150ms"] is False


def test_checks_without_the_overview() -> None:
    found = checks({"pages": {"/heatmap?window=7d": figures(80.0)}, "fragments": {}, "json": {}}, [])
    assert found["new_vs_overview_max_ratio"] is None
    assert found["month_vs_day_overview"] is None


def test_json_problem() -> None:
    assert json_problem(timing()) is None
    assert json_problem(timing(content_type="application/json; charset=utf-8")) is None
    assert json_problem(timing(content_type="text/html; charset=utf-8", body=b"<html>")) == (
        "Content-Type text/html; charset=utf-8"
    )
    assert json_problem(timing(body=b"<html>")) == "the body is not JSON"
    assert json_problem(timing(status=404, content_type="text/html")) is None
