"""The dashboard over time in a real browser: the overview's trend charts, the state heatmap (a row per instance,
GPU or tag value), the hour-of-week heatmap and the instance page's charts are drawn at a useful size, carry hover
text that names a time and a state or value, follow the filters, and read without JavaScript. No page scrolls
sideways at 1280 px. Each test leaves a full-page screenshot (see conftest)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Locator, Page, expect

from .conftest import VIEWPORT, Tab

pytestmark = pytest.mark.browser

STATE_WORDS = re.compile(r"\b(active|held|idle|unpartitioned|unknown|offline)\b")
HOUR = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
"""A bucket as the column charts name it (app/web/charts/svg.py, bucket_label)."""
_DAY = r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d \w{3}( \d\d:\d\d)?"
# A stretch of one hour or day, or of several: "Tue 24 Nov 05:00-09:00 UTC (4 h): ...",
# "Mon 23 Nov 22:00 to Tue 24 Nov 03:00 UTC (5 h): ...", "Sat 21 Nov to Mon 23 Nov UTC (3 days): ...".
HEAT_CELL = re.compile(rf"^{_DAY}(-\d\d:\d\d| to {_DAY})? UTC( \(\d+ (h|days)\))?: .+ GPU-h")
"""A state heatmap cell's tooltip (app/web/chart_data.py): its time, then its GPU-hours by state."""
WEEK_CELL = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d:00-\d\d:00 UTC \u00b7 ")

# Finds what sticks out past the right edge of the viewport, deepest first, to name it in a failure.
TOO_WIDE_JS = """() => {
  const limit = window.innerWidth;
  const name = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    const cls = (el.getAttribute('class') || '').trim().split(/\\s+/).filter(Boolean).slice(0, 3);
    if (cls.length) s += '.' + cls.join('.');
    return s;
  };
  const path = (el) => {
    const parts = [];
    for (let e = el; e && e.nodeType === 1 && parts.length < 5; e = e.parentElement) parts.unshift(name(e));
    return parts.join(' > ');
  };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > limit + 0.5) {
      out.push(`${path(el)}: right ${r.right.toFixed(0)} px, width ${r.width.toFixed(0)} px`);
    }
  }
  return out.slice(-8);
}"""

# The element under the pointer and the hover text it shows: its own <title> or its nearest group's.
UNDER_POINTER_JS = """([x, y]) => {
  const el = document.elementFromPoint(x, y);
  if (!el) return null;
  for (let e = el; e && e.tagName.toLowerCase() !== 'svg'; e = e.parentElement) {
    const t = Array.from(e.children).find((c) => c.tagName.toLowerCase() === 'title');
    if (t) return {tag: el.tagName.toLowerCase(), title: t.textContent};
  }
  return {tag: el.tagName.toLowerCase(), title: null};
}"""


def query(page: Page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def open_page(tab: Tab, url: str) -> Page:
    page = tab.page
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    expect(page.locator("header nav.nav a[aria-current=page]")).to_be_visible()
    return page


def page_json(page: Page, url: str) -> Any:
    """The page's JSON (`Accept: application/json`), with the tab's login."""
    response = page.request.get(url, headers={"Accept": "application/json"})
    assert response.status == 200, (url, response.status)
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def assert_drawn(chart: Locator, *, min_width: float, min_height: float) -> None:
    expect(chart).to_be_visible()
    box = chart.bounding_box()
    assert box is not None and box["width"] >= min_width and box["height"] >= min_height, box
    # Inside the viewport: charts scale to their card, they never push the page sideways.
    assert box["x"] >= 0 and box["x"] + box["width"] <= VIEWPORT["width"], box


def chart_title(chart: Locator) -> str:
    """The chart's own <title>, its first child."""
    return str(chart.evaluate("svg => svg.querySelector(':scope > title')?.textContent ?? ''"))


def hover(page: Page, target: Locator) -> dict[str, Any]:
    """Move the mouse over the middle of `target` and say what lies under the pointer and its hover text."""
    target.scroll_into_view_if_needed()
    box = target.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    found = page.evaluate(UNDER_POINTER_JS, [x, y])
    assert found is not None, f"nothing under the pointer at {x:.0f},{y:.0f}"
    return dict(found)


def heat_rows(page: Page) -> list[str]:
    return [r.get_attribute("data-row") or "" for r in page.locator("#heatmap-rows tbody tr").all()]


def test_overview_trend(tab: Tab) -> None:
    page = open_page(tab, "/?window=24h")
    trend = page.locator("section#trend")
    expect(trend.locator("h2")).to_contain_text("hourly")
    stacked = trend.locator("svg.chart-stacked")
    bars = trend.locator("svg.chart-bars")
    assert_drawn(stacked, min_width=800, min_height=150)
    assert_drawn(bars, min_width=800, min_height=90)
    assert chart_title(stacked) == "GPU-hours by state, per hour"
    assert chart_title(bars) == "Wasted USD per hour"

    # One column per hour of the window, as many as the page's JSON has buckets.
    data = page_json(page, "/?window=24h")
    buckets = len(data["trend"]["starts"])
    assert data["trend"]["step_s"] == 3600 and buckets == 24
    columns = stacked.locator(".cols > g > title")
    expect(columns).to_have_count(buckets)
    expect(bars.locator(".cols > g > title")).to_have_count(buckets)
    for text in columns.all_text_contents():
        assert re.match(HOUR, text), text
        assert "active" in text and "idle" in text and "GPU-h" in text, text
    wasted = [t for t in bars.locator(".cols > g > title").all_text_contents() if t != ""]
    assert all(re.match(HOUR + r" \u00b7 \$[\d,.]+$", t) for t in wasted), wasted

    # The pointer over the last column, the current hour with the story's data, shows that hour's figures.
    last = stacked.locator(".cols > g").last
    under = hover(page, last.locator("rect.hit"))
    assert under["title"] is not None and re.match(HOUR, under["title"]), under
    assert STATE_WORDS.search(under["title"]), under

    # The story began three hours ago: the previous window had nothing, so every change reads n/a.
    badges = page.locator(".cards .change")
    expect(badges).to_have_count(4)
    for badge in badges.all():
        expect(badge).to_have_attribute("data-change", "none")
        expect(badge).to_have_text("n/a")
    assert {c["change_pct"] for c in data["changes"].values()} == {None}
    tab.shot("over-time-overview")

    # Filtered to team vision (one idle GPU), the trend holds no active hour.
    page = open_page(tab, "/?window=24h&tag=team:vision")
    titles = page.locator("section#trend svg.chart-stacked .cols > g > title").all_text_contents()
    assert len(titles) == buckets and all("active 0 GPU-h" in t for t in titles), titles[-1]
    assert any(re.search(r"idle [\d.]+ GPU-h", t) and "idle 0 GPU-h" not in t for t in titles), titles[-3:]
    tab.assert_clean()


def test_overview_trend_daily(tab: Tab) -> None:
    page = open_page(tab, "/?window=30d")
    expect(page.locator("section#trend h2")).to_contain_text("daily")
    stacked = page.locator("section#trend svg.chart-stacked")
    assert_drawn(stacked, min_width=800, min_height=150)
    assert chart_title(stacked) == "GPU-hours by state, per day"
    titles = stacked.locator(".cols > g > title").all_text_contents()
    assert titles and all(re.match(r"\d{4}-\d\d-\d\d UTC \u00b7 ", t) for t in titles), titles[:3]
    tab.shot("over-time-overview-30d")
    tab.assert_clean()


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("instance", {"i-forgotten", "i-busy", "i-mig"}),
        ("gpu", None),  # keyed by the GPUs' database ids: three of them
        ("tag:team", {"nlp", "vision"}),
    ],
)
def test_heatmap_rows(tab: Tab, rows: str, expected: set[str] | None) -> None:
    url = f"/heatmap?window=24h&rows={rows}"
    page = open_page(tab, url)
    expect(page.locator("select[name=rows]")).to_have_value(rows)
    chart = page.locator("section#heatmap svg.chart-heatmap")
    assert_drawn(chart, min_width=900, min_height=60)
    assert chart_title(chart).startswith("State per hour, one row per ")

    keys = heat_rows(page)
    assert len(keys) == (3 if expected is None else len(expected))
    if expected is not None:
        assert set(keys) == expected
    # The rows come most wasteful first, the same in the chart, the table and the JSON.
    data = page_json(page, url)
    assert [r["key"] for r in data["rows"]] == keys
    wasted = [r["figures"]["waste"] for r in data["rows"]]
    assert wasted == sorted(wasted, reverse=True)
    labels = chart.locator(".rows .row-label > title").all_text_contents()
    assert labels == [r["label"] for r in data["rows"]]
    if rows == "instance":
        links = [a.get_attribute("href") for a in chart.locator(".rows a").all()]
        assert links == [f"/instances/{k}" for k in keys]

    # Every stretch of cells names its hours and the GPU-hours of its states.
    titles = chart.locator(".cells path > title").all_text_contents()
    assert titles, "no cell has a tooltip"
    for text in titles:
        assert HEAT_CELL.match(text), text
        assert STATE_WORDS.search(text), text
    # The story's idle GPU wastes money: some cell says how much.
    assert any(re.search(r"\$[\d,.]+ wasted$", t) for t in titles), titles

    # The pointer over a cell: what lies under it carries that cell's tooltip.
    cell = chart.locator(".cells path").last
    under = hover(page, cell)
    assert under["tag"] == "path" and under["title"] and HEAT_CELL.match(under["title"]), under
    tab.shot("over-time-heatmap-" + rows.replace(":", "-"))
    tab.assert_clean()


def test_heatmap_follows_filters(tab: Tab) -> None:
    page = open_page(tab, "/heatmap?window=24h&tag=team:nlp")
    assert sorted(heat_rows(page)) == ["i-busy", "i-mig"]
    expect(page.locator("form.filter-bar .tag-chip input[value='team:nlp']")).to_be_checked()
    assert len(page.locator("section#heatmap svg .rows .row-label").all()) == 2

    # A region from the filter bar narrows the rows further; the tag stays.
    page.select_option("form.filter-bar select[name=region]", "us-west-2")
    with page.expect_navigation():
        page.click("form.filter-bar button[type=submit]")
    assert query(page)["region"] == ["us-west-2"] and query(page)["tag"] == ["team:nlp"]
    assert heat_rows(page) == ["i-busy"]
    expect(page.locator("section#heatmap svg .rows .row-label")).to_have_count(1)

    # Choosing what a row is submits at once (static/app.js) and keeps the filters.
    with page.expect_navigation():
        page.select_option("select[name=rows]", "tag:team")
    assert query(page)["rows"] == ["tag:team"] and query(page)["region"] == ["us-west-2"]
    assert heat_rows(page) == ["nlp"]

    # Without filters both teams come back.
    page = open_page(tab, "/heatmap?window=24h&rows=tag:team")
    assert sorted(heat_rows(page)) == ["nlp", "vision"]

    # A tag typed into the filter bar, one row per GPU: the one GPU of team vision.
    page = open_page(tab, "/heatmap?window=24h&rows=gpu")
    expect(page.locator("#heatmap-rows tbody tr")).to_have_count(3)
    page.fill("form.filter-bar input[name=tag][type=text]", "team:vision")
    with page.expect_navigation():
        page.click("form.filter-bar button[type=submit]")
    assert query(page)["tag"] == ["team:vision"] and query(page)["rows"] == ["gpu"]
    expect(page.locator("#heatmap-rows tbody tr")).to_have_count(1)
    expect(page.locator("#heatmap-rows tbody tr")).to_contain_text("forgotten-box")
    tab.shot("over-time-heatmap-filtered")
    tab.assert_clean()


def test_week_heatmap(tab: Tab) -> None:
    page = open_page(tab, "/heatmap/week")
    expect(page.locator("nav.tabs a[aria-current=page]")).to_have_text("Waste by hour of week")
    chart = page.locator("section#week svg.chart-week")
    assert_drawn(chart, min_width=800, min_height=120)
    assert chart_title(chart) == "Wasted USD by hour of week, UTC"
    assert page.locator("[data-figure=week-total]").inner_text().startswith("$")
    expect(page.locator("[data-figure=week-peak]")).to_have_text(re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d:00$"))

    cells = chart.locator("g.heat:not(.legend) rect")
    expect(cells).to_have_count(7 * 24)
    titles = cells.locator("title").all_text_contents()
    assert all(WEEK_CELL.match(t) for t in titles), [t for t in titles if not WEEK_CELL.match(t)][:3]
    assert any("wasted over" in t and "per hour" in t for t in titles)
    # The story's hours are shaded; the hours before the fleet's first data are no hours of the week at all.
    assert chart.locator("g.heat:not(.legend) rect:not(.heat-0):not(.heat-none)").count() >= 1
    assert chart.locator("g.heat:not(.legend) rect.heat-none").count() >= 7 * 24 - 5

    wasteful = chart.locator("g.heat:not(.legend) rect.heat-5").first
    under = hover(page, wasteful)
    assert under["tag"] == "rect" and under["title"] and "wasted over" in under["title"], under
    data = page_json(page, "/heatmap/week")
    assert data["peak"] is not None and data["total_usd"] > 0
    tab.shot("over-time-week")

    # The filters apply: the two teams' waste adds up to the fleet's.
    teams = [page_json(page, f"/heatmap/week?tag=team:{team}")["total_usd"] for team in ("nlp", "vision")]
    assert all(t > 0 for t in teams) and sum(teams) == pytest.approx(data["total_usd"], rel=1e-6)

    # A day's window holds the story's few hours of the week (it began three hours ago); the rest look empty.
    page = open_page(tab, "/heatmap/week?window=24h")
    cells = page.locator("section#week svg.chart-week g.heat:not(.legend) rect")
    expect(cells).to_have_count(7 * 24)
    blank = cells.locator("xpath=self::*[contains(@class, 'heat-none')]")
    assert 7 * 24 - 5 <= blank.count() <= 7 * 24 - 3
    assert all(t.endswith("\u00b7 no data") for t in blank.locator("title").all_text_contents())
    tab.assert_clean()


def test_instance_charts(tab: Tab) -> None:
    page = open_page(tab, "/instances/i-mig")
    charts = page.locator("section#charts svg.chart")
    expect(charts).to_have_count(4)
    strip = charts.nth(0)
    assert "chart-strip" in (strip.get_attribute("class") or "")
    assert_drawn(strip, min_width=800, min_height=30)
    # A strip per device: the GPU and its two slices.
    expect(strip.locator(".row-label")).to_have_count(3)
    spans = strip.locator("rect[class^=state-] > title").all_text_contents()
    assert spans
    for text in spans:
        assert re.search(r" \u00b7 (active|idle, held|idle|unknown|offline) \u00b7 .*\d\d:\d\d.* UTC \(", text), text

    names = ["Utilization of every GPU and slice, %", "Memory used by every GPU and slice, MiB"]
    for i, name in enumerate(names, start=1):
        chart = charts.nth(i)
        assert_drawn(chart, min_width=800, min_height=150)
        assert chart_title(chart) == name
        expect(chart.locator(".legend text")).to_have_count(3)
        columns = chart.locator(".hover rect > title")
        assert columns.count() > 0, name
        for text in columns.all_text_contents():
            lines = text.split("\n")
            assert re.match(HOUR, lines[0]), text
            # Every device on its own line: the GPU and both slices, a dash where one has no value.
            assert len(lines) == 4, text
            assert all(re.match(r"GPU 0.*: (\u2013|[\d.]+( %| MiB)?)$", line) for line in lines[1:]), text
    # No device of the story reports power: the chart is drawn and says so.
    power = charts.nth(3)
    assert_drawn(power, min_width=800, min_height=120)
    assert chart_title(power) == "Power of every GPU, W"
    expect(power.locator("text.no-data")).to_have_text("no data")

    # The pointer over the utilization chart's last hover column shows every device's value there.
    under = hover(page, charts.nth(1).locator(".hover rect").last)
    assert under["tag"] == "rect" and under["title"] and re.match(HOUR, under["title"]), under
    assert "GPU 0: " in under["title"] and "3g.20gb" in under["title"], under
    tab.shot("over-time-instance-i-mig")
    tab.assert_clean()


PAGES = [
    "/",
    "/?window=30d",
    "/gpus/idle",
    "/mig",
    "/waste",
    "/waste?group_by=tag:team",
    "/heatmap",
    "/heatmap?rows=gpu",
    "/heatmap?rows=tag:team",
    "/heatmap/week",
    "/instances",
    "/instances/i-mig",
    "/instances/i-forgotten",
]


@pytest.mark.parametrize("url", PAGES)
def test_no_sideways_scroll(tab: Tab, url: str) -> None:
    page = open_page(tab, url)
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if width[0] > width[1]:
        tab.shot("too-wide-" + re.sub(r"[^\w.-]+", "_", url.strip("/") or "overview"))
    assert width[0] <= width[1], f"{url} scrolls sideways ({width[0]} > {width[1]} px): {page.evaluate(TOO_WIDE_JS)}"
    tab.assert_clean()


def test_charts_without_javascript(tab_without_js: Tab) -> None:
    page = tab_without_js.page
    expected = {
        "/?window=24h": ["GPU-hours by state, per hour", "Wasted USD per hour"],
        "/heatmap?window=24h": ["State per hour, one row per instance"],
        "/heatmap/week": ["Wasted USD by hour of week, UTC"],
        "/instances/i-mig": ["State per device, hour by hour", "Utilization of every GPU and slice, %"],
    }
    for url, names in expected.items():
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        charts = page.locator("svg.chart")
        titles = [chart_title(c) for c in charts.all()]
        for name in names:
            assert name in titles, (url, titles)
        for chart in charts.all():
            if chart_title(chart) in names:
                assert_drawn(chart, min_width=600, min_height=60)
                # The hover text is in the page itself, not made by script.
                assert chart.locator("g > title, path > title, rect > title").count() > 0, (url, chart_title(chart))

    # Without script the row choice is a form with its own button.
    page.goto("/heatmap?window=24h")
    page.select_option("select[name=rows]", "tag:team")
    with page.expect_navigation():
        page.click("form.group-by button[type=submit]")
    assert query(page)["rows"] == ["tag:team"]
    assert sorted(heat_rows(page)) == ["nlp", "vision"]
    tab_without_js.shot("over-time-heatmap-no-js")
    tab_without_js.assert_clean()
