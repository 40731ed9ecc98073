"""Display filters, URLs that keep the query, and whole-page and block rendering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.web.templating import (
    DASH,
    ago,
    as_list,
    hours,
    is_htmx,
    make_environment,
    mib,
    num,
    pct,
    render,
    select_options,
    static_url,
    url_with,
    usd,
    usd_rate,
    utc,
)

TEMPLATES = Path(__file__).parent / "templates"


def make_request(path: str = "/", query: str = "", headers: dict[str, str] | None = None) -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "scheme": "http",
            "server": ("testserver", 80),
            "root_path": "",
            "path": path,
            "query_string": query.encode(),
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        }
    )


def html_of(response: Response) -> str:
    return bytes(response.body).decode()


def test_usd() -> None:
    assert usd(None) == "no price"
    assert usd(0) == "$0.00"
    assert usd(2.744) == "$2.74"
    assert usd(0.004) == "<$0.01"
    assert usd(1234.561) == "$1,234.56"
    assert usd(9999.99) == "$9,999.99"
    assert usd(12345.67) == "$12,346"
    assert usd(Decimal("1500000")) == "$1,500,000"
    assert usd(-5) == "-$5.00"


def test_usd_rate() -> None:
    assert usd_rate(None) == DASH == "\u2013"
    assert usd_rate(2.7411) == "$2.74/h"
    assert usd_rate(0.526) == "$0.526/h"
    assert usd_rate(32.7726) == "$32.77/h"


def test_pct() -> None:
    assert pct(None) == "unknown"
    assert pct(42) == "42.0%"
    assert pct(3.14159) == "3.1%"
    assert pct(0.25, fraction=True) == "25.0%"


def test_hours() -> None:
    assert hours(None) == DASH
    assert hours(3) == "3.0 h"
    assert hours(47.9) == "47.9 h"
    assert hours(48) == "2.0 d"
    assert hours(60) == "2.5 d"


def test_mib() -> None:
    assert mib(None) == DASH
    assert mib(512) == "512 MiB"
    assert mib(81920) == "80 GiB"
    assert mib(4864) == "4.8 GiB"
    assert mib(1024) == "1 GiB"


def test_ago() -> None:
    now = datetime(2026, 11, 21, 14, 5, tzinfo=UTC)
    assert ago(None, now) == DASH
    assert ago(now - timedelta(seconds=42), now) == "42 s ago"
    assert ago(now - timedelta(minutes=5, seconds=59), now) == "5 min ago"
    assert ago(now - timedelta(hours=3, minutes=1), now) == "3 h ago"
    assert ago(now - timedelta(hours=47), now) == "47 h ago"
    assert ago(now - timedelta(days=2, hours=5), now) == "2 d ago"
    assert ago(now, now) == "just now"
    assert ago(now + timedelta(minutes=2), now) == "in 2 min"
    # Naive datetimes are UTC.
    assert ago(datetime(2026, 11, 21, 14, 0), now) == "5 min ago"


def test_utc() -> None:
    assert utc(None) == DASH
    assert utc(datetime(2026, 11, 21, 14, 5, 59, tzinfo=UTC)) == "2026-11-21 14:05 UTC"
    cet = timezone(timedelta(hours=1))
    assert utc(datetime(2026, 11, 21, 15, 5, tzinfo=cet)) == "2026-11-21 14:05 UTC"
    assert utc(datetime(2026, 11, 21, 14, 5)) == "2026-11-21 14:05 UTC"


def test_num() -> None:
    assert num(None) == DASH
    assert num(1234567) == "1,234,567"
    assert num(1234.567, 1) == "1,234.6"
    assert num(float("nan")) == DASH


def test_filters_in_templates() -> None:
    env = make_environment()
    out = env.from_string("{{ a | usd }} {{ b | pct }} {{ c | mib }} {{ d | ago(now) }}").render(
        a=None, b=None, c=81920, d=datetime(2026, 1, 1, tzinfo=UTC), now=datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    )
    assert out == "no price unknown 80 GiB 5 s ago"


def _query(url: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def test_url_with_replaces_in_place_and_keeps_the_rest() -> None:
    request = make_request("/waste", "sort=usd&tag=team:a&tag=env:prod&window=24h")
    url = url_with(request, sort="hours", dir="asc")
    assert url.startswith("/waste?")
    assert _query(url) == [
        ("sort", "hours"),
        ("tag", "team:a"),
        ("tag", "env:prod"),
        ("window", "24h"),
        ("dir", "asc"),
    ]
    # Readable tags in the URL.
    assert "tag=team:a&tag=env:prod" in url


def test_url_with_removes_and_repeats() -> None:
    request = make_request("/waste", "sort=usd&tag=team:a&tag=env:prod&page=3")
    assert _query(url_with(request, page=None)) == [("sort", "usd"), ("tag", "team:a"), ("tag", "env:prod")]
    assert _query(url_with(request, tag=["team:b"])) == [("sort", "usd"), ("tag", "team:b"), ("page", "3")]
    assert url_with(request, sort=None, tag=None, page=None) == "/waste"
    assert url_with(make_request("/mig"), window="7d") == "/mig?window=7d"
    # Values are encoded; nothing leaks into the next parameter.
    assert _query(url_with(request, tag="a&b=c", page=None))[1] == ("tag", "a&b=c")


def test_static_url_versions_by_content() -> None:
    url = static_url("app.css")
    assert url.startswith("/static/app.css?v=") and len(url.rsplit("=", 1)[1]) == 12
    assert static_url("vendor/htmx.min.js").startswith("/static/vendor/htmx.min.js?v=")
    with pytest.raises(ValueError):
        static_url("../pyproject.toml")


def test_is_htmx() -> None:
    assert not is_htmx(make_request())
    assert is_htmx(make_request(headers={"HX-Request": "true"}))
    assert not is_htmx(make_request(headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}))


def test_select_options() -> None:
    opts = select_options(["us-east-1", ("eu-west-1", "Ireland")], ["eu-west-1", "ap-south-1"])
    assert [(o.value, o.label, o.selected) for o in opts] == [
        ("us-east-1", "us-east-1", False),
        ("eu-west-1", "Ireland", True),
        ("ap-south-1", "ap-south-1", True),
    ]
    assert as_list(None) == [] and as_list("a") == ["a"] and as_list(("a", None, 3)) == ["a", "3"]


def _page_context(**extra: Any) -> dict[str, Any]:
    return {
        "page": "idle",
        "options": {"region": ["us-east-1", "eu-west-1"], "instance_type": ["p4d.24xlarge"]},
        "current": {"window": "24h", "region": "us-east-1", "tag": ["team:a"]},
        "sort": "waste",
        "dir": "desc",
        "total": 1234.5,
        "name": "<b>gpu</b>",
        **extra,
    }


def test_render_whole_page() -> None:
    env = make_environment(TEMPLATES)
    request = make_request("/gpus/idle", "sort=waste&dir=desc&tag=team:a&group_by=type&page=2")
    response = render(request, "page.html", _page_context(), env=env)
    html = html_of(response)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert response.headers["vary"] == "HX-Request"
    assert html.startswith("<!doctype html>")
    assert "<title>Idle GPUs · gpufleet</title>" in html
    assert '<a href="/gpus/idle" class="current" aria-current="page">Idle GPUs</a>' in html
    assert html.count('aria-current="page"') == 1
    assert '<link rel="stylesheet" href="/static/app.css?v=' in html
    assert '<script src="/static/vendor/htmx.min.js?v=' in html and "defer></script>" in html
    # Autoescaped.
    assert "&lt;b&gt;gpu&lt;/b&gt;" in html and "<b>gpu</b>" not in html
    # Filter bar: a GET form keeping the other parameters, dropping the page number.
    assert '<form class="filter-bar" method="get" action="/gpus/idle"' in html
    assert '<input type="hidden" name="group_by" value="type">' in html
    assert '<input type="hidden" name="sort" value="waste">' in html
    assert 'name="page"' not in html
    assert '<option value="us-east-1" selected>us-east-1</option>' in html
    assert '<option value="24h" selected>24 h</option>' in html
    assert '<input type="checkbox" name="tag" value="team:a" checked>' in html
    assert 'hx-get="/gpus/idle" hx-target="#content" hx-push-url="true"' in html
    # Sort headers: the current column reverses, another starts high to low (numbers) or A to Z (text).
    assert 'aria-sort="descending"' in html
    assert 'href="/gpus/idle?sort=waste&amp;dir=asc&amp;tag=team:a&amp;group_by=type"' in html
    assert 'href="/gpus/idle?sort=name&amp;dir=asc&amp;tag=team:a&amp;group_by=type"' in html
    assert "gpufleet 0.1.0" in html and "<span>extra</span>" in html


def test_render_block_only() -> None:
    env = make_environment(TEMPLATES)
    request = make_request("/gpus/idle", "sort=waste&dir=desc")
    response = render(request, "page.html", _page_context(), block="content", env=env, status_code=202)
    html = html_of(response)
    assert response.status_code == 202
    # The block alone: what it uses it imports and sets itself (a fragment does not run the page's top level).
    assert html.lstrip().startswith("<h1>Idle GPUs</h1>")
    assert "<html" not in html and "<form" not in html and "<nav" not in html
    assert 'class="sortable num sorted"' in html and '<td class="num">$1,234.50</td>' in html
    # A nested block renders alone too.
    rows = html_of(render(request, "page.html", _page_context(), block="rows", env=env))
    assert rows == '<tr><td class="num">$1,234.50</td><td>&lt;b&gt;gpu&lt;/b&gt;</td></tr>'
    assert render(request, "base.html", {}, block="content", env=env).body == b""
    with pytest.raises(KeyError, match="no block 'nope'"):
        render(request, "page.html", _page_context(), block="nope", env=env)


def test_block_context_needs_only_the_block_variables() -> None:
    env = make_environment(TEMPLATES)
    html = html_of(render(make_request(), "page.html", {"total": 5, "name": "x"}, block="rows", env=env))
    assert html == '<tr><td class="num">$5.00</td><td>x</td></tr>'


def test_strict_undefined() -> None:
    env = make_environment(TEMPLATES)
    with pytest.raises(Exception, match="undefined"):
        render(make_request(), "page.html", {"total": 5}, block="rows", env=env)


def test_macros() -> None:
    env = make_environment()
    m = env.get_template("_macros.html").make_module({})
    badge = str(m.state_badge("unknown"))  # type: ignore[attr-defined]
    assert 'class="badge state-unknown"' in badge and ">unknown</span>" in badge
    empty = str(m.empty_state("No idle GPUs", "<script>x</script>"))  # type: ignore[attr-defined]
    assert "No idle GPUs" in empty and "&lt;script&gt;" in empty


def test_base_page_defaults() -> None:
    html = html_of(render(make_request(), "base.html", {"page": "mig"}))
    assert '<a href="/mig" class="current" aria-current="page">MIG</a>' in html
    for href in ("/", "/gpus/idle", "/waste", "/instances"):
        assert f'<a href="{href}">' in html
    assert "cdn" not in html.lower() and "https://" not in html
