"""The snooze page, `/alerts/snooze/<token>`: a valid link works without a login (authentication on or off, from
any host), shows the incident and records a snooze that the /alerts page then shows; a changed, expired or unknown
link gets a clear 4xx page or JSON, a closed incident is said to be closed and nothing is recorded, the form needs
its CSRF cookie, and the key made at first need serves every server process and restart."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import snooze
from app.alerts.tables import alert_actions, alert_incidents, alert_signing_key, alert_snoozes
from app.db import session_scope
from app.main import create_app
from app.models import ApiToken
from app.sessions import SESSION_COOKIE, open_session
from app.settings import Settings
from app.web.snooze import CSRF_COOKIE
from tests.app.alerts.made import HOUR
from tests.app.alerts.made import make_incident as made_incident
from tests.conftest import make_token

DETAILS = {
    "what": "GPU 0 (NVIDIA A10G) idle for 5.0 h",
    "instance_id": "i-0abc",
    "instance_name": "forgotten-g5",
    "device": "GPU 0 (NVIDIA A10G)",
    "usd_so_far": 5.03,
    "usd_per_day": 24.14,
    "holders": ["asmith"],
    "page": "/instances/i-0abc",
}


@pytest.fixture(scope="module")
def web(settings: Settings, engine: Any) -> Iterator[TestClient]:
    """A browser on the server's host, authentication on, without any login, following no redirects."""
    with TestClient(create_app(settings), client=("127.0.0.1", 50000), follow_redirects=False) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_cookies(web: TestClient) -> Iterator[None]:
    yield
    web.cookies.clear()


def make_incident(sessions: sessionmaker[Session], *, closed: bool = False, stop_pending: bool = False) -> int:
    now = datetime.now(UTC)
    return made_incident(
        sessions,
        since=datetime(2026, 11, 25, 4, 0, tzinfo=UTC),
        closed_at=now if closed else None,
        details=DETAILS,
        stop_due=now + HOUR if stop_pending else None,
    )


def link(sessions: sessionmaker[Session], settings: Settings, incident: int, *, sent: datetime | None = None) -> str:
    """The path of the incident's snooze link, as a message sent at `sent` (default now) carries it."""
    with session_scope(sessions) as s:
        key = snooze.signing_key(s, settings)
    return "/alerts/snooze/" + snooze.sign(key, incident, now=sent or datetime.now(UTC))


def admin_login(sessions: sessionmaker[Session]) -> dict[str, str]:
    """The headers of a browser logged in with an admin token."""
    make_token(sessions, "admin", name="snooze-admin")
    with session_scope(sessions) as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == "snooze-admin"))
        cookie, _live = open_session(
            s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=1), now=datetime.now(UTC)
        )
    return {"Cookie": f"{SESSION_COOKIE}={cookie}"}


def doc(r: httpx2.Response) -> BeautifulSoup:
    return BeautifulSoup(r.text, "html.parser")


def open_form(web: TestClient, path: str) -> str:
    """GET the page as a browser does; the CSRF token its form carries (its cookie is now in the client)."""
    page = web.get(path)
    assert page.status_code == 200, page.text[:300]
    field = doc(page).select_one("#snooze-form input[name=csrf_token]")
    assert field is not None
    return str(field["value"])


def snoozes(sessions: sessionmaker[Session]) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_snoozes).order_by(alert_snoozes.c.id)))


def incident_row(sessions: sessionmaker[Session], incident: int) -> Any:
    with sessions() as s:
        return s.execute(select(alert_incidents).where(alert_incidents.c.id == incident)).one()


def action_statuses(sessions: sessionmaker[Session], incident: int) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(alert_actions.c.status).where(alert_actions.c.incident_id == incident)))


# A valid link ----------------------------------------------------------------------------------------------------


def test_a_valid_link_shows_the_incident_and_the_form_without_a_login(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    incident = make_incident(sessions, stop_pending=True)
    r = web.get(link(sessions, settings, incident))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = doc(r)
    facts = page.select_one("#incident")
    assert facts is not None
    text = facts.get_text(" ", strip=True)
    for shown in ("idle-gpus", "GPU 0 (NVIDIA A10G) idle for 5.0 h", "forgotten-g5 (i-0abc)", "asmith"):
        assert shown in text
    assert "2026-11-25 04:00 UTC" in text and "$5.03" in text and "$24.14 a day" in text
    assert "will be stopped at" in page.select_one("#stop-at").get_text()  # type: ignore[union-attr]
    form = page.select_one("#snooze-form")
    assert form is not None and form["method"] == "post"
    assert [i["value"] for i in form.select("input[name=for]")] == ["1d", "1w"]
    assert form.select_one("input[name=reason]") is not None
    assert page.select_one("nav.nav") is None  # nothing else is open to the link's holder
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{CSRF_COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/alerts/snooze" in cookie
    assert "until" in page.select_one("#link-expiry").get_text()  # type: ignore[union-attr]

    data = web.get(link(sessions, settings, incident), headers={"Accept": "application/json"})
    assert data.status_code == 200 and data.headers["content-type"] == "application/json"
    view = data.json()
    assert view["incident_id"] == incident and view["usd_per_day"] == 24.14 and view["closed_at"] is None
    assert view["snoozed"] is False and view["stop_at"] is not None


def test_the_form_snoozes_the_incident_cancels_its_stop_and_the_alerts_page_shows_it(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    incident = make_incident(sessions, stop_pending=True)
    path = link(sessions, settings, incident)
    csrf = open_form(web, path)
    before = datetime.now(UTC)
    r = web.post(path, data={"for": "1w", "reason": "training resumes Monday", "name": "Ada", "csrf_token": csrf})
    assert r.status_code == 303 and r.headers["location"] == path + "?snoozed=1"
    [row] = snoozes(sessions)
    assert (row.incident_id, row.reason, row.by) == (incident, "training resumes Monday", "Ada (snooze link)")
    assert before + timedelta(weeks=1) - timedelta(seconds=1) <= row.until <= datetime.now(UTC) + timedelta(weeks=1)
    assert incident_row(sessions, incident).snoozed_until == row.until
    assert action_statuses(sessions, incident) == ["cancelled"]

    done = doc(web.get(r.headers["location"]))
    assert "Snoozed until" in done.select_one("#snooze-notice").get_text()  # type: ignore[union-attr]
    assert "snoozed until" in done.select_one("#state").get_text()  # type: ignore[union-attr]
    assert done.select_one("#stop-at") is None
    assert "training resumes Monday" in done.select_one("#snoozes").get_text()  # type: ignore[union-attr]

    admin = admin_login(sessions)
    page = doc(web.get("/alerts", headers=admin))
    listed = page.select_one(f'#snoozes tr[data-incident="{incident}"]')
    assert listed is not None
    cells = [td.get_text(" ", strip=True) for td in listed.select("td")]
    assert cells[0] == "idle-gpus" and cells[3:5] == ["training resumes Monday", "Ada (snooze link)"]
    shown = page.select_one(f'#incidents tr[data-incident="{incident}"]')
    assert shown is not None and shown["data-state"] == "snoozed"
    assert "Ada (snooze link): training resumes Monday" in shown.get_text(" ", strip=True)
    view = web.get("/alerts", headers={**admin, "Accept": "application/json"}).json()
    [about] = view["incidents"]
    assert about["snoozed"] is True and about["snoozed_by"] == "Ada (snooze link)" and about["stop_at"] is None
    assert [s["reason"] for s in view["snoozes"]] == ["training resumes Monday"]
    action = page.select_one("#actions tbody tr")
    assert action is not None and "cancelled" in action.get_text() and "snoozed until" in action.get_text()


def test_posting_again_is_harmless_each_is_recorded_and_the_latest_wins(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    incident = make_incident(sessions)
    path = link(sessions, settings, incident)
    csrf = open_form(web, path)
    for choice in ("1w", "1w", "1d"):
        r = web.post(path, data={"for": choice, "reason": "later", "csrf_token": csrf})
        assert r.status_code == 303
    rows = snoozes(sessions)
    assert len(rows) == 3 and [r.by for r in rows] == ["snooze link"] * 3
    assert incident_row(sessions, incident).snoozed_until == rows[-1].until < rows[0].until


def test_a_valid_link_works_from_another_host_over_https(
    settings: Settings, engine: Any, sessions: sessionmaker[Session]
) -> None:
    incident = make_incident(sessions)
    with TestClient(
        create_app(settings),
        base_url="https://gpufleet.example.com",
        client=("192.0.2.7", 50000),
        follow_redirects=False,
    ) as remote:
        path = link(sessions, settings, incident)
        csrf = open_form(remote, path)
        assert "Secure" in remote.get(path).headers["set-cookie"]
        r = remote.post(path, data={"for": "1d", "reason": "demo tomorrow", "csrf_token": csrf})
        assert r.status_code == 303
    assert len(snoozes(sessions)) == 1


def test_with_auth_off_the_link_works_as_well(settings: Settings, engine: Any, sessions: sessionmaker[Session]) -> None:
    incident = make_incident(sessions)
    with TestClient(
        create_app(settings.model_copy(update={"auth": "off"})), client=("127.0.0.1", 50000), follow_redirects=False
    ) as c:
        path = link(sessions, settings, incident)
        r = c.post(path, data={"for": "1d", "reason": "off", "csrf_token": open_form(c, path)})
        assert r.status_code == 303
    assert [s.reason for s in snoozes(sessions)] == ["off"]


# A form that cannot be used --------------------------------------------------------------------------------------


def test_the_form_needs_its_csrf_cookie(web: TestClient, sessions: sessionmaker[Session], settings: Settings) -> None:
    incident = make_incident(sessions, stop_pending=True)
    path = link(sessions, settings, incident)
    csrf = open_form(web, path)
    web.cookies.clear()  # another site's form: the browser sends no SameSite=Strict cookie with it
    r = web.post(path, data={"for": "1d", "reason": "x", "csrf_token": csrf})
    assert r.status_code == 400 and "The form had expired" in doc(r).select_one("#snooze-problem").get_text()  # type: ignore[union-attr]
    web.cookies.set(CSRF_COOKIE, "y" * 43, path="/alerts/snooze")
    assert web.post(path, data={"for": "1d", "reason": "x", "csrf_token": csrf}).status_code == 400
    assert web.post(path, data={"for": "1d", "reason": "x"}).status_code == 400
    assert snoozes(sessions) == [] and action_statuses(sessions, incident) == ["pending"]


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"for": "1d", "reason": "  "}, "reason", "Say why"),
        ({"for": "1d", "reason": "x" * 501}, "reason", "At most 500"),
        ({"for": "1y", "reason": "x"}, "for", "1 day or 1 week"),
        ({"reason": "x"}, "for", "1 day or 1 week"),
        ({"for": "1d", "reason": "x", "name": "n" * 101}, "name", "At most 100"),
    ],
)
def test_a_bad_form_says_what_is_wrong_next_to_the_field_and_records_nothing(
    web: TestClient,
    sessions: sessionmaker[Session],
    settings: Settings,
    fields: dict[str, str],
    field: str,
    says: str,
) -> None:
    incident = make_incident(sessions)
    path = link(sessions, settings, incident)
    r = web.post(path, data={**fields, "csrf_token": open_form(web, path)})
    assert r.status_code == 400
    error = doc(r).select_one(f'#snooze-form .field-error[data-field="{field}"]')
    assert error is not None and says in error.get_text()
    assert snoozes(sessions) == [] and incident_row(sessions, incident).snoozed_until is None


def test_a_post_that_is_not_a_form_is_refused(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    path = link(sessions, settings, make_incident(sessions))
    r = web.post(path, json={"for": "1d"})
    assert r.status_code == 400 and "application/x-www-form-urlencoded" in r.text
    assert snoozes(sessions) == []


# Links that do not work ------------------------------------------------------------------------------------------


def _flip_last(path: str) -> str:
    return path[:-1] + ("A" if path[-1] != "A" else "B")


def test_a_changed_expired_or_unknown_link_gets_a_clear_page_and_records_nothing(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    incident = make_incident(sessions, stop_pending=True)
    good = link(sessions, settings, incident)
    number, expires, signature = good.rsplit("/", 1)[1].split(".")
    cases = {
        _flip_last(good): (400, "Not a valid snooze link"),
        f"/alerts/snooze/{incident + 1}.{expires}.{signature}": (400, "Not a valid snooze link"),
        f"/alerts/snooze/{number}.{int(expires) + 86400}.{signature}": (400, "Not a valid snooze link"),
        "/alerts/snooze/not-a-token": (400, "Not a valid snooze link"),
        link(sessions, settings, incident, sent=datetime.now(UTC) - timedelta(days=7, minutes=1)): (
            410,
            "Snooze link expired",
        ),
        link(sessions, settings, incident + 1000): (404, "No such incident"),
    }
    csrf = open_form(web, good)
    for path, (status, says) in cases.items():
        for r in (web.get(path), web.post(path, data={"for": "1d", "reason": "x", "csrf_token": csrf})):
            assert r.status_code == status, (path, r.status_code)
            assert r.headers["content-type"].startswith("text/html")
            assert says in r.text and "Traceback" not in r.text
            assert doc(r).select_one("#snooze-form") is None
        data = web.get(path, headers={"Accept": "application/json"})
        assert data.status_code == status and data.json()["error"] == says[0].lower() + says[1:]
        assert [d["field"] for d in data.json()["detail"]] == ["token"]
    assert "links last 7 days" in web.get(list(cases)[4]).text
    assert snoozes(sessions) == [] and action_statuses(sessions, incident) == ["pending"]


def test_a_closed_incident_is_said_to_be_closed_and_nothing_is_recorded(
    web: TestClient, sessions: sessionmaker[Session], settings: Settings
) -> None:
    incident = make_incident(sessions)
    path = link(sessions, settings, incident)
    csrf = open_form(web, path)
    # The incident closes while the form is open.
    with session_scope(sessions) as s:
        s.execute(update(alert_incidents).where(alert_incidents.c.id == incident).values(closed_at=func.now()))
    r = web.post(path, data={"for": "1d", "reason": "x", "csrf_token": csrf})
    assert r.status_code == 409
    page = doc(r)
    assert "nothing to snooze" in page.select_one("#snooze-problem").get_text()  # type: ignore[union-attr]
    assert page.select_one("#snooze-form") is None and page.select_one("#closed") is not None
    shown = web.get(path)
    assert shown.status_code == 200 and doc(shown).select_one("#snooze-form") is None
    assert "closed at" in doc(shown).select_one("#state").get_text()  # type: ignore[union-attr]
    assert snoozes(sessions) == [] and incident_row(sessions, incident).snoozed_until is None


# The signing key -------------------------------------------------------------------------------------------------


def test_the_key_made_at_first_need_serves_every_process_and_restart(
    settings: Settings, engine: Any, sessions: sessionmaker[Session]
) -> None:
    incident = make_incident(sessions)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(alert_signing_key)) == 0
    expires = int((datetime.now(UTC) + timedelta(days=1)).timestamp())
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as first:
        # Any well-formed link makes the key, which is then kept.
        assert first.get(f"/alerts/snooze/{incident}.{expires}.{'A' * 43}").status_code == 400
    with sessions() as s:
        kept = s.scalar(select(alert_signing_key.c.key))
    assert kept is not None
    path = "/alerts/snooze/" + snooze.sign(bytes(kept), incident, now=datetime.now(UTC))
    second, third = create_app(settings), create_app(settings)
    with (
        TestClient(second, client=("127.0.0.1", 50000), follow_redirects=False) as b,
        TestClient(third, client=("127.0.0.1", 50000), follow_redirects=False) as c,
    ):
        assert b.get(path).status_code == 200
        r = c.post(path, data={"for": "1d", "reason": "x", "csrf_token": open_form(c, path)})
        assert r.status_code == 303
    with sessions() as s:
        assert [bytes(k) for k in s.scalars(select(alert_signing_key.c.key))] == [bytes(kept)]


def test_the_signing_key_of_the_settings_is_used_when_set(
    web: TestClient, settings: Settings, engine: Any, sessions: sessionmaker[Session]
) -> None:
    incident = make_incident(sessions)
    key = "a-key-of-thirty-two-characters-or-more"
    configured = settings.model_copy(update={"alerts_signing_key": key})
    signed_by_setting = "/alerts/snooze/" + snooze.sign(key.encode(), incident, now=datetime.now(UTC))
    signed_by_database = link(sessions, settings, incident)
    with TestClient(create_app(configured), client=("127.0.0.1", 50000)) as keyed:
        assert keyed.get(signed_by_setting).status_code == 200
        assert keyed.get(signed_by_database).status_code == 400
    assert web.get(signed_by_setting).status_code == 400
    assert web.get(signed_by_database).status_code == 200
