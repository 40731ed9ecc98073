"""Browser tests: Debian's Chromium driven by Playwright against a real server in a thread.

The server uses the test database with `refresh_s=2`, so an htmx refresh of a page's live block happens within
seconds. One story is posted to it over HTTP for the whole session; the tables are emptied again afterwards.
Every tab starts logged in, with a dashboard session of the read token `browser-reader`; a `guest` tab has none
and goes through the login form (test_login.py).
Each test opens a fresh browser context and records console errors, page errors, dialogs and what the
Content-Security-Policy blocked. Screenshots go to GPUFLEET_SCREENSHOTS (default `.ci/artifacts/screenshots`);
a failing test leaves `FAILED-<test>.png` there.

Without /usr/bin/chromium the tests are skipped, except with CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httpx2
import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, Response, ViewportSize, sync_playwright
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine, make_sessionmaker, session_scope
from app.main import run_upkeep
from app.models import ApiToken
from app.sessions import SESSION_COOKIE, open_session
from app.settings import Settings
from tests.agent.live_server import LiveServer
from tests.conftest import TABLES, make_token
from tests.factories import gpu, mig_slice
from tests.feeding import Feeder, busy, held, idle, unknown

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 900}
REFRESH_S = 2

# An instance tag that would run script if any page failed to escape it.
EVIL = "<img src=x onerror=alert(1)><script>window.pwned=1</script>"

# Chromium asks every new origin for /favicon.ico, which the dashboard does not serve: a 404 that says nothing
# about the page itself.
IGNORED_404 = ("/favicon.ico",)

REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("GPUFLEET_SCREENSHOTS") or REPO / ".ci" / "artifacts" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    return report


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing; install Debian's chromium (apt-get install chromium) for the browser tests"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}. CI=true: the browser tests must run in CI", pytrace=False)
        pytest.skip(reason)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass(frozen=True)
class Dashboard:
    url: str
    regions: dict[str, str]
    """instance id -> region"""
    sessions: sessionmaker[Session]
    read_token: str
    """Secret of the token `browser-reader` (scope read), for the tests that log in through the form."""
    cookie: str
    """A dashboard session of that token: every tab but a guest's starts logged in with it."""


def _post_story(feeder: Feeder) -> None:
    """A g5 idle for three hours, a busy p4d in another region, an A100 MIG node with an unknown slice, an
    idle-held slice and two free slices; team tags on each, and a script-laden tag on the g5."""
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)
    feeder.feed(
        [gpu(0, uid="GPU-forgotten", name="NVIDIA A10G")],
        start=start,
        hours=3,
        fn=idle,
        instance_id="i-forgotten",
        instance_type="g5.xlarge",
        tags={"team": "vision", "Name": "forgotten-box", "note": EVIL},
    )
    feeder.feed(
        [gpu(0, uid="GPU-busy")],
        start=start,
        hours=3,
        fn=busy(85),
        instance_id="i-busy",
        region="us-west-2",
        availability_zone="us-west-2b",
        tags={"team": "nlp"},
    )
    node = gpu(
        0,
        uid="GPU-mig",
        mig=True,
        slices=[mig_slice(1, "3g.20gb", uid="MIG-a"), mig_slice(2, "2g.10gb", uid="MIG-b")],
        unpartitioned=2,
    )
    feeder.feed(
        [node],
        start=start,
        hours=3,
        fn={"GPU-mig": unknown, "MIG-a": unknown, "MIG-b": held},
        instance_id="i-mig",
        tags={"team": "nlp"},
    )


@pytest.fixture(scope="session")
def dashboard(settings: Settings, database_url: str) -> Iterator[Dashboard]:
    """The live server with the story in its database. Not built on the `engine` fixture, which would empty the
    tables after every test: the story is posted once and the tables emptied at the end."""
    engine = make_engine(database_url, pool_size=1)
    run_upkeep(engine, settings)  # today's partitions, before the first post

    def empty() -> None:
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))

    empty()
    sessions = make_sessionmaker(engine)
    token = make_token(sessions, "ingest", name="browser-tests")
    reader = make_token(sessions, "read", name="browser-reader")
    with session_scope(sessions) as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == "browser-reader"))
        now = datetime.now(UTC)
        cookie, _live = open_session(s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=2), now=now)
    try:
        with (
            LiveServer(settings.model_copy(update={"refresh_s": REFRESH_S})) as server,
            httpx2.Client(base_url=server.url, timeout=30) as http,
        ):
            # Feeder only posts: through this client the batches reach the live server over real HTTP.
            _post_story(Feeder(cast(TestClient, http), token, datetime.now(UTC)))
            regions = {"i-forgotten": "us-east-1", "i-busy": "us-west-2", "i-mig": "us-east-1"}
            yield Dashboard(server.url, regions, sessions, reader, cookie)
    finally:
        empty()
        engine.dispose()


@dataclass
class Tab:
    """A page in a fresh context, with what went wrong in it."""

    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    csp_violations: list[str] = field(default_factory=list)
    """What the Content-Security-Policy blocked: Chromium reports each block on the console."""

    def watch(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("dialog", self._dialog)
        self.page.on("response", self._response)

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(f"{message.text} ({message.location.get('url')})")
        if message.type == "error" and urlsplit(message.location.get("url", "")).path not in IGNORED_404:
            self.errors.append(f"console: {message.text} ({message.location.get('url')})")

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _response(self, response: Response) -> None:
        if response.status >= 400 and urlsplit(response.url).path not in IGNORED_404:
            self.errors.append(f"HTTP {response.status}: {response.request.method} {response.request.url}")

    def shot(self, name: str) -> Path:
        path = screenshot_dir() / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def assert_clean(self) -> None:
        assert self.csp_violations == [], "blocked by the CSP:\n" + "\n".join(self.csp_violations)
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"
        assert self.errors == [], "\n".join(self.errors)

    def htmx_loaded(self) -> bool:
        return bool(self.page.evaluate("typeof window.htmx === 'object' && typeof window.htmx.ajax === 'function'"))


def _open(
    browser: Browser, dashboard: Dashboard, request: pytest.FixtureRequest, *, js: bool, logged_in: bool = True
) -> Iterator[Tab]:
    context = browser.new_context(base_url=dashboard.url, viewport=VIEWPORT, java_script_enabled=js)
    context.set_default_timeout(10_000)
    if logged_in:
        context.add_cookies([{"name": SESSION_COOKIE, "value": dashboard.cookie, "url": dashboard.url}])
    tab = Tab(context.new_page())
    tab.watch()
    try:
        yield tab
        report = request.node.stash.get(REPORTS, {}).get("call")
        if report is not None and report.failed:
            tab.shot("FAILED-" + re.sub(r"[^\w.-]+", "_", request.node.name))
    finally:
        context.close()


@pytest.fixture
def tab(browser: Browser, dashboard: Dashboard, request: pytest.FixtureRequest) -> Iterator[Tab]:
    yield from _open(browser, dashboard, request, js=True)


@pytest.fixture
def guest(browser: Browser, dashboard: Dashboard, request: pytest.FixtureRequest) -> Iterator[Tab]:
    """A tab with no session: the dashboard sends it to the login form."""
    yield from _open(browser, dashboard, request, js=True, logged_in=False)


@pytest.fixture
def tab_without_js(browser: Browser, dashboard: Dashboard, request: pytest.FixtureRequest) -> Iterator[Tab]:
    yield from _open(browser, dashboard, request, js=False)
