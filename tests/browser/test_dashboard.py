"""The dashboard in a real browser: every page renders without script errors, filters and sorting live in the
URL, the live block refreshes through htmx in place, agent-supplied text never runs, and the filter form works
with JavaScript off. Each page test leaves a full-page screenshot (see conftest)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Page, Request, expect

from .conftest import EVIL, REFRESH_S, Dashboard, Tab

pytestmark = pytest.mark.browser


def query(page: Page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def figure(page: Page, name: str) -> str:
    locator = page.locator(f"[data-figure={name}]")
    expect(locator).to_be_visible()
    return locator.inner_text().strip()


def row_ids(page: Page, table: str, attribute: str) -> list[str]:
    return [r.get_attribute(attribute) or "" for r in page.locator(f"{table} tbody tr").all()]


def open_page(tab: Tab, url: str) -> Page:
    page = tab.page
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    expect(page.locator("nav a[aria-current=page]")).to_be_visible()
    assert tab.htmx_loaded(), "htmx did not load"
    return page


def test_overview(tab: Tab) -> None:
    page = open_page(tab, "/")
    expect(page.locator("h1")).to_have_text("Fleet overview")
    assert figure(page, "instances") == "3"
    assert figure(page, "gpus") == "3"
    assert figure(page, "idle-now") == "1"
    assert figure(page, "waste").startswith("$")
    assert figure(page, "monthly").startswith("$")
    expect(page.locator("#live svg").first).to_be_visible()
    expect(page.locator("table.states")).to_be_visible()
    expect(page.locator("#live")).to_contain_text("forgotten-box")
    expect(page.locator("#live")).to_contain_text("vision")  # waste by team
    tab.shot("overview")
    tab.assert_clean()


def test_idle_gpus(tab: Tab) -> None:
    page = open_page(tab, "/gpus/idle")
    assert row_ids(page, "#idle-gpus", "data-gpu") == ["GPU-forgotten"]
    assert figure(page, "idle-count") == "1"
    assert figure(page, "burned").startswith("$")
    row = page.locator("#idle-gpus tbody tr").first
    expect(row).to_contain_text("g5.xlarge")
    expect(row).to_contain_text(f"note={EVIL}")
    tab.shot("idle")
    tab.assert_clean()


def test_mig(tab: Tab) -> None:
    page = open_page(tab, "/mig")
    assert figure(page, "mig-gpus") == "1"
    assert figure(page, "underused") == "2"
    layout = page.locator("figure.mig-gpu[data-gpu=GPU-mig] svg")
    expect(layout).to_be_visible()
    box = layout.bounding_box()
    assert box is not None and box["width"] >= 140 and box["height"] >= 20, box  # 7 slices of 20 px at least
    expect(layout).to_contain_text("3g.20gb")
    expect(layout).to_contain_text("2 free")
    expect(page.locator("#underused tbody tr")).to_have_count(2)
    expect(page.locator("#unpartitioned tbody tr")).to_have_count(1)
    tab.shot("mig")
    tab.assert_clean()


def test_waste_and_group_by(tab: Tab) -> None:
    page = open_page(tab, "/waste")
    expect(page.locator("#waste-table")).to_be_visible()
    assert figure(page, "total-waste").startswith("$")
    assert figure(page, "total-cost").startswith("$")
    # Choosing a grouping submits its form (static/app.js: no inline handler, which the CSP would block).
    with page.expect_navigation():
        page.select_option("select[name=group_by]", "tag:team")
    assert query(page)["group_by"] == ["tag:team"]
    labels = [c.strip() for c in page.locator("#waste-table tbody tr td:first-child").all_inner_texts()]
    assert sorted(labels) == ["nlp", "vision"]
    tab.shot("waste")
    tab.assert_clean()


def test_instances(tab: Tab) -> None:
    page = open_page(tab, "/instances")
    expect(page.locator("#instances")).to_be_visible()
    assert sorted(row_ids(page, "#instances", "data-instance")) == ["i-busy", "i-forgotten", "i-mig"]
    expect(page.locator("tr[data-instance=i-forgotten]")).to_contain_text(f"note={EVIL}")
    expect(page.locator("tr[data-instance=i-busy]")).to_contain_text("us-west-2b")
    tab.shot("instances")
    tab.assert_clean()


def test_instance_detail(tab: Tab) -> None:
    page = open_page(tab, "/instances/i-mig")
    expect(page.locator("h1")).to_contain_text("i-mig")
    # The state strip and one chart per metric for every GPU and slice of the instance.
    charts = page.locator("section#charts svg")
    expect(charts).to_have_count(4)
    for chart in charts.all():
        expect(chart).to_be_visible()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 150 and box["height"] > 80, box
    expect(page.locator("section.gpu table.devices tr.slice")).to_have_count(2)
    expect(page.locator("section.gpu")).to_contain_text("A100 MIG")
    tab.shot("instance-i-mig")
    tab.assert_clean()


def test_filter_by_region(tab: Tab, dashboard: Dashboard) -> None:
    page = open_page(tab, "/instances")
    assert len(row_ids(page, "#instances", "data-instance")) == 3
    page.select_option("form.filter-bar select[name=region]", "us-west-2")
    with page.expect_navigation():
        page.click("form.filter-bar button[type=submit]")
    assert query(page)["region"] == ["us-west-2"]
    rows = row_ids(page, "#instances", "data-instance")
    assert rows == [i for i, region in dashboard.regions.items() if region == "us-west-2"] == ["i-busy"]
    # The form shows the filter in force.
    expect(page.locator("form.filter-bar select[name=region]")).to_have_value("us-west-2")
    tab.shot("instances-region-filter")
    tab.assert_clean()


def test_sort_by_column(tab: Tab) -> None:
    page = open_page(tab, "/instances")
    header = page.locator("#instances th.sortable a[href*='sort=name']")
    with page.expect_navigation():
        header.click()
    assert query(page)["sort"] == ["name"] and query(page)["dir"] == ["asc"]
    expect(page.locator("#instances th[aria-sort]")).to_have_attribute("aria-sort", "ascending")
    # By display name: the Name tag where there is one, else the instance id.
    assert row_ids(page, "#instances", "data-instance") == ["i-forgotten", "i-busy", "i-mig"]
    with page.expect_navigation():
        page.locator("#instances th.sortable a[href*='sort=name']").click()
    assert query(page)["dir"] == ["desc"]
    assert row_ids(page, "#instances", "data-instance") == ["i-mig", "i-busy", "i-forgotten"]
    tab.shot("instances-sorted")
    tab.assert_clean()


def test_live_block_refreshes_in_place(tab: Tab) -> None:
    page = open_page(tab, "/?window=6h")
    page.evaluate("window.__marker = 1")
    before = page.locator("#updated time").get_attribute("datetime")
    assert before

    def refresh(request: Request) -> bool:
        return request.headers.get("hx-request") == "true" and urlsplit(request.url).path == "/"

    with page.expect_request(refresh, timeout=(REFRESH_S * 3 + 5) * 1000) as caught:
        pass
    request = caught.value
    assert not request.is_navigation_request()
    assert parse_qs(urlsplit(request.url).query)["window"] == ["6h"]
    page.wait_for_function(
        "before => document.querySelector('#updated time')?.getAttribute('datetime') !== before", arg=before
    )
    assert page.evaluate("window.__marker") == 1, "the page was reloaded"
    # Only the live block was swapped: the page's chrome exists once, the figures are in place.
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(page.locator("#live #live, #live nav")).to_have_count(0)
    assert figure(page, "instances") == "3"
    assert urlsplit(page.url).path == "/"
    tab.shot("overview-after-refresh")
    tab.assert_clean()


def test_agent_text_never_runs(tab: Tab) -> None:
    page = tab.page
    image_requests: list[str] = []
    page.on("request", lambda r: image_requests.append(r.url) if r.resource_type == "image" else None)
    for url in ("/", "/gpus/idle", "/instances", "/instances/i-forgotten", "/waste?group_by=tag:note"):
        open_page(tab, url)
        page.wait_for_timeout(100)  # room for an onerror handler to fire
        assert page.evaluate("typeof window.pwned") == "undefined", url
        assert page.evaluate("document.querySelectorAll('img, #main script').length") == 0, url
        if url != "/":
            assert EVIL in page.locator("#main").inner_text(), url
        if url == "/instances/i-forgotten":
            tab.shot("instance-i-forgotten")
    tab.shot("waste-by-tag-note")
    assert image_requests == []
    tab.assert_clean()


def test_filter_form_without_javascript(tab_without_js: Tab) -> None:
    page = tab_without_js.page
    response = page.goto("/instances")
    assert response is not None and response.status == 200
    page.select_option("form.filter-bar select[name=region]", "us-west-2")
    with page.expect_navigation():
        page.click("form.filter-bar button[type=submit]")
    assert query(page)["region"] == ["us-west-2"]
    assert row_ids(page, "#instances", "data-instance") == ["i-busy"]
    tab_without_js.shot("instances-no-js")
    tab_without_js.assert_clean()
