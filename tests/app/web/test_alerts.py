"""The /alerts page: admins only, the rules with their secrets hidden, the form with each problem next to its field,
edit, turn off, delete, the rules of the rule file left alone, and the recent incidents and actions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network
from typing import Any

import httpx2
import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import outbox, rules
from app.alerts.schemas import RuleIn, to_rule
from app.alerts.tables import alert_actions, alert_incidents, alert_outbox, alert_rules
from app.db import session_scope
from app.main import create_app
from app.models import ApiToken
from app.sessions import SESSION_COOKIE, open_session
from app.settings import Settings
from tests.conftest import make_token

SECRET = "page-secret-0123456789"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def web(settings: Settings, engine: Any) -> Iterator[TestClient]:
    """A browser on the server's host that keeps no cookies of its own and follows no redirects."""
    with TestClient(create_app(settings), client=("127.0.0.1", 50000), follow_redirects=False) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_cookies(web: TestClient) -> Iterator[None]:
    yield
    web.cookies.clear()


class Login:
    def __init__(self, cookie: str, csrf: str) -> None:
        self.headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"}
        self.csrf = csrf


def login(sessions: sessionmaker[Session], scope: str) -> Login:
    name = f"{scope}-{datetime.now(UTC).timestamp()}"
    make_token(sessions, scope, name=name)
    with session_scope(sessions) as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == name))
        cookie, live = open_session(s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=1), now=NOW)
    return Login(cookie, live.csrf_secret)


@pytest.fixture
def admin(sessions: sessionmaker[Session]) -> Login:
    return login(sessions, "admin")


def doc(r: httpx2.Response) -> BeautifulSoup:
    return BeautifulSoup(r.text, "html.parser")


def store(sessions: sessionmaker[Session], source: str = "api", **changes: Any) -> None:
    data: dict[str, Any] = {
        "name": "idle-gpus",
        "condition": "gpu_idle",
        "for": "2h",
        "route": {"webhook": "https://hooks.example.com/in", "secret": SECRET},
    }
    data.update(changes)
    with session_scope(sessions) as s:
        rule = replace(to_rule(RuleIn.model_validate(data), source=source), source=source)
        rules.create_rule(s, rule, by="token ops", now=NOW)


def count(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(alert_rules)) or 0)


FORM = {
    "name": "forgotten g5",
    "condition": "gpu_idle",
    "for": "90m",
    "usd_per_day": "",
    "tag": "",
    "scope_regions": "us-east-1, us-west-2",
    "scope_instance_types": "",
    "lifecycle_on-demand": "on",
    "scope_tags": "team=vision",
    "scope_users": "",
    "route_kind": "email",
    "route_target": "ada@example.com, bob@example.com",
    "route_secret": "",
    "fallback_kind": "none",
    "fallback_target": "",
    "fallback_secret": "",
    "quiet": "1d",
    "remind": "",
    "stop_grace": "1h",
    "stop_dry_run": "on",
    "enabled": "on",
}


def post(web: TestClient, who: Login, url: str, fields: dict[str, str]) -> httpx2.Response:
    return web.post(url, data={**fields, "csrf_token": who.csrf}, headers=who.headers)


# Who may see it ------------------------------------------------------------------------------------------------


def test_without_a_login_the_browser_goes_to_the_login_form(web: TestClient) -> None:
    r = web.get("/alerts")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Falerts"
    posted = web.post("/alerts/x/delete", data={}, headers={"Referer": "http://testserver/alerts?edit=x"})
    assert posted.status_code == 303 and posted.headers["location"] == "/login?next=%2Falerts"
    assert web.get("/alerts", headers={"Accept": "application/json"}).status_code == 401


def test_a_reader_is_forbidden(web: TestClient, sessions: sessionmaker[Session]) -> None:
    reader = login(sessions, "read")
    page = web.get("/alerts", headers=reader.headers)
    assert page.status_code == 403 and page.headers["content-type"].startswith("text/html")
    assert "alert rules are for admins" in page.text.lower()
    # The reader's own pages do not offer the link.
    overview = doc(web.get("/gpus/idle", headers=reader.headers))
    assert "/alerts" not in [a["href"] for a in overview.select("nav.nav a")]
    scripted = web.get("/alerts", headers={"Authorization": f"Bearer {make_token(sessions, 'read')}"})
    assert scripted.status_code == 403 and scripted.json()["error"] == "token scope 'read' does not allow 'admin'"
    store(sessions)
    assert post(web, reader, "/alerts/idle-gpus/delete", {}).status_code == 403
    assert count(sessions) == 1


def test_a_user_of_a_trusted_proxy_reads_the_dashboard_but_not_this_page(settings: Settings, engine: Any) -> None:
    configured = settings.model_copy(
        update={"trusted_proxies": [ip_network("10.0.0.0/24")], "proxy_user_header": "X-Auth-Request-Email"}
    )
    with TestClient(create_app(configured), client=("10.0.0.9", 50000), follow_redirects=False) as c:
        user = {"X-Auth-Request-Email": "ada@example.com"}
        assert c.get("/gpus/idle", headers=user).status_code == 200
        r = c.get("/alerts", headers=user)
        assert r.status_code == 403 and "signed in at the proxy" in r.text.lower()


def test_an_admin_sees_the_link(web: TestClient, admin: Login) -> None:
    nav = doc(web.get("/gpus/idle", headers=admin.headers)).select("nav.nav a")
    assert [a["href"] for a in nav][-1] == "/alerts"
    page = doc(web.get("/alerts", headers=admin.headers))
    current = page.select_one("nav.nav a.current")
    assert current is not None and current["href"] == "/alerts"


# What it shows -------------------------------------------------------------------------------------------------


def test_the_rules_with_their_secrets_hidden(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    store(
        sessions,
        quiet="1d",
        remind="12h",
        stop={"grace": "30m"},
        scope={"tags": {"team": "ml"}, "regions": ["us-east-1"]},
    )
    store(
        sessions,
        name="from the file",
        source="file",
        route={"owner": True, "fallback": {"slack": "https://hooks.slack.com/x"}},
    )
    r = web.get("/alerts", headers=admin.headers)
    assert r.status_code == 200 and SECRET not in r.text
    page = doc(r)
    row = page.select_one('#rules tr[data-rule="idle-gpus"]')
    assert row is not None
    cells = [td.get_text(" ", strip=True) for td in row.select("td")]
    assert cells[1].startswith("GPU idle or idle-held for 2h")
    assert "region us-east-1" in cells[2] and "tag team=ml" in cells[2]
    assert "webhook" in cells[3] and "https://hooks.example.com/in" in cells[3] and "secret set" in cells[3]
    assert cells[4:9] == ["1d", "12h", "stop after 30m (dry run)", "api", "on"]
    assert row.select_one('form[action="/alerts/idle-gpus/delete"] input[name=csrf_token]') is not None
    file_row = page.select_one('#rules tr[data-rule="from the file"]')
    assert file_row is not None and file_row.select("form") == [] and "in the file" in file_row.get_text()
    assert "else slack https://hooks.slack.com/x" in file_row.get_text(" ", strip=True)
    assert page.select_one("#incidents") is None and "None yet" in page.select_one("#live").get_text()  # type: ignore[union-attr]

    data = web.get("/alerts", headers={**admin.headers, "Accept": "application/json"})
    assert data.status_code == 200 and SECRET not in data.text
    view = data.json()
    assert [r["name"] for r in view["rules"]] == ["from the file", "idle-gpus"]
    assert view["rules"][1]["target"] == {
        "channel": "webhook",
        "target": "https://hooks.example.com/in",
        "secret_set": True,
    }
    assert view["incidents"] == [] and view["actions"] == []


def test_recent_incidents_and_actions(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    store(sessions)
    with session_scope(sessions) as s:
        rule_id = s.scalar(select(alert_rules.c.id))
        incident = s.execute(
            insert(alert_incidents)
            .values(rule_id=rule_id, subject="gpu:GPU-1234", since=NOW - timedelta(hours=5))
            .returning(alert_incidents.c.id)
        ).scalar_one()
        s.execute(
            insert(alert_actions).values(
                rule_id=rule_id,
                incident_id=incident,
                instance_id="i-0abc",
                dry_run=True,
                status="dry-run",
                due_at=NOW,
                by="rule idle-gpus",
                detail="would stop <b>it</b>",
            )
        )
    fragment = web.get("/alerts", headers={**admin.headers, "HX-Request": "true"})
    assert fragment.status_code == 200
    part = doc(fragment)
    assert part.select_one("nav.nav") is None and part.select_one("#rule-form") is None
    incident_row = part.select_one("#incidents tbody tr")
    assert incident_row is not None and "gpu:GPU-1234" in incident_row.get_text() and "open" in incident_row.get_text()
    action_row = part.select_one("#actions tbody tr")
    assert action_row is not None and "i-0abc" in action_row.get_text() and "(dry run)" in action_row.get_text()
    assert "would stop <b>it</b>" in action_row.get_text() and action_row.select_one("b") is None


def test_delivery_per_target(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    """What waits for each target, and why, with the target's secret part hidden."""
    with session_scope(sessions) as s:
        for n, target in enumerate(("https://hooks.slack.com/services/T1/B2/secret-part", "ops@example.com")):
            outbox.enqueue(
                s,
                message_id=outbox.message_id("test", n),
                incident_id=None,
                kind="open",
                channel="slack" if n == 0 else "email",
                target=target,
                secret=None,
                payload={"text": "x"} if n == 0 else {"subject": "x", "text": "x"},
            )
        s.execute(
            update(alert_outbox).where(alert_outbox.c.channel == "slack").values(attempts=3, last_error="HTTP 500")
        )
    view = web.get("/alerts", headers={**admin.headers, "Accept": "application/json"}).json()
    by_channel = {t["channel"]: t for t in view["delivery"]}
    assert by_channel["slack"]["queued"] == 1 and by_channel["slack"]["last_error"] == "HTTP 500"
    assert "secret-part" not in by_channel["slack"]["target"] and by_channel["email"]["target"] == "ops@example.com"
    page = doc(web.get("/alerts", headers=admin.headers))
    rows = page.select("#delivery tbody tr")
    assert len(rows) == 2 and "HTTP 500" in rows[0].get_text() and "secret-part" not in page.get_text()


# Changing rules ------------------------------------------------------------------------------------------------


def test_add_a_rule(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    r = post(web, admin, "/alerts", FORM)
    assert r.status_code == 303 and r.headers["location"] == "/alerts?saved=forgotten%20g5"
    with sessions() as s:
        rule = rules.get_rule(s, "forgotten g5")
    assert rule is not None and rule.source == "page" and rule.updated_by.startswith("login admin-")  # type: ignore[union-attr]
    assert rule.for_hours == 1.5 and rule.quiet_s == 86400 and rule.stop is None
    assert rule.scope.regions == ("us-east-1", "us-west-2") and rule.scope.lifecycles == ("on-demand",)
    assert rule.scope.tags == (("team", "vision"),)
    assert rule.route.target is not None and rule.route.target.to == ("ada@example.com", "bob@example.com")
    notice = doc(web.get(r.headers["location"], headers=admin.headers)).select_one(".notice")
    assert notice is not None and notice.get_text() == "Rule 'forgotten g5' saved."


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"name": "a/b"}, "name", "letters, digits"),
        ({"for": "2x"}, "for", "not a duration"),
        ({"for": ""}, "for", "required for gpu_idle"),
        ({"quiet": "-1h"}, "quiet", "negative"),
        ({"route_target": "ada@example.com, not-an-address"}, "route_target", "route.email[1]: not an email address"),
        ({"route_kind": "webhook", "route_target": "ftp://x"}, "route_target", "http:// or https://"),
        ({"route_kind": "webhook", "route_target": "https://hooks.example.com/in"}, "route_secret", "required"),
        ({"route_kind": "pager"}, "route_kind", "choose where messages go"),
        ({"scope_tags": "team"}, "scope_tags", "expected key=value"),
        ({"condition": "tag_waste", "tag": "team", "usd_per_day": "lots"}, "usd_per_day", "not a number"),
        ({"condition": "tag_waste", "tag": "team"}, "usd_per_day", "required for tag_waste"),
        ({"stop": "on", "stop_grace": "soon"}, "stop_grace", "not a duration"),
        # The form's other fields do not apply to these conditions, and are not sent.
        ({"condition": "spot_interruption", "usd_per_day": "5"}, "form", ""),
        ({"condition": "tag_waste", "tag": "team", "usd_per_day": "$1,200"}, "form", ""),
    ],
)
def test_a_bad_form_shows_each_problem_next_to_its_field_and_writes_nothing(
    web: TestClient, admin: Login, sessions: sessionmaker[Session], changes: dict[str, str], field: str, says: str
) -> None:
    r = post(web, admin, "/alerts", FORM | changes)
    if field == "form":  # a good rule after all
        assert r.status_code == 303
        return
    assert r.status_code == 400, r.text[:500]
    form = doc(r).select_one("#rule-form")
    assert form is not None
    shown = [e.get_text() for e in form.select(f'.field-error[data-field="{field}"]')]
    assert any(says in text for text in shown), form.select(".field-error")
    # What was typed is kept, secrets apart.
    name_input = form.select_one("input[name=name]")
    assert name_input is not None and name_input["value"] == (FORM | changes)["name"]
    assert all(i.get("value", "") == "" for i in form.select("input[type=password]"))
    assert count(sessions) == 0


def test_a_taken_name_is_409_next_to_the_name(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    store(sessions, name="forgotten g5")
    r = post(web, admin, "/alerts", FORM)
    assert r.status_code == 409
    assert "is taken" in doc(r).select_one('.field-error[data-field="name"]').get_text()  # type: ignore[union-attr]
    assert count(sessions) == 1


def test_edit_keeps_the_secret_turn_off_and_delete(
    web: TestClient, admin: Login, sessions: sessionmaker[Session]
) -> None:
    store(sessions, stop={"grace": "2h", "spot": True})
    form_page = web.get("/alerts?edit=idle-gpus", headers=admin.headers)
    assert form_page.status_code == 200 and SECRET not in form_page.text
    form = doc(form_page).select_one("#rule-form")
    assert form is not None and form["action"] == "/alerts/idle-gpus"
    fields = {i["name"]: i.get("value", "") for i in form.select("input") if i.get("type") not in ("checkbox",)}
    fields |= {i["name"]: "on" for i in form.select("input[type=checkbox][checked]")}
    for select_ in form.select("select"):
        chosen = select_.select_one("option[selected]") or select_.select_one("option")
        assert chosen is not None
        fields[str(select_["name"])] = str(chosen["value"])
    assert fields["route_kind"] == "webhook" and fields["route_target"] == "https://hooks.example.com/in"
    assert (
        fields["for"] == "2h"
        and fields["stop"] == "on"
        and fields["stop_spot"] == "on"
        and fields["stop_grace"] == "2h"
    )
    assert "leave this empty to keep it" in form.get_text()

    fields.pop("csrf_token")
    r = post(web, admin, "/alerts/idle-gpus", {**fields, "name": "idle gpus", "quiet": "4h"})
    assert r.status_code == 303, r.text[:500]
    with sessions() as s:
        edited = rules.get_rule(s, "idle gpus")
    assert edited is not None and edited.quiet_s == 4 * 3600 and edited.stop is not None and edited.stop.spot
    assert edited.route.target is not None and edited.route.target.secret == SECRET

    off = post(web, admin, "/alerts/idle%20gpus/enabled", {"enabled": "false"})
    assert off.status_code == 303 and off.headers["location"] == "/alerts?off=idle%20gpus"
    page = doc(web.get("/alerts", headers=admin.headers))
    row = page.select_one('#rules tr[data-rule="idle gpus"]')
    assert row is not None and "disabled" in row["class"] and row.select_one("button.secondary").get_text() == "Turn on"  # type: ignore[union-attr]
    gone = post(web, admin, "/alerts/idle%20gpus/delete", {})
    assert gone.status_code == 303 and count(sessions) == 0
    assert post(web, admin, "/alerts/idle%20gpus/delete", {}).status_code == 404


def test_forms_need_the_csrf_token(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    store(sessions)
    for url, fields in (
        ("/alerts", FORM),
        ("/alerts/idle-gpus/delete", {}),
        ("/alerts/idle-gpus/enabled", {"enabled": "false"}),
    ):
        r = web.post(url, data={**fields, "csrf_token": "x" * 43}, headers=admin.headers)
        assert r.status_code == 403 and "expired or came from another site" in r.text
    assert count(sessions) == 1
    with sessions() as s:
        assert rules.get_rule(s, "idle-gpus").enabled  # type: ignore[union-attr]


def test_rules_of_the_file_are_not_changed_here(web: TestClient, admin: Login, sessions: sessionmaker[Session]) -> None:
    store(sessions, source="file")
    assert post(web, admin, "/alerts/idle-gpus/delete", {}).status_code == 409
    assert post(web, admin, "/alerts/idle-gpus/enabled", {"enabled": "false"}).status_code == 409
    edit = post(web, admin, "/alerts/idle-gpus", FORM | {"name": "idle-gpus"})
    assert edit.status_code == 409 and "comes from the rule file" in edit.text
    # Its edit link is not offered, and asking for it shows the form for a new rule.
    form = doc(web.get("/alerts?edit=idle-gpus", headers=admin.headers)).select_one("#rule-form")
    assert form is not None and form["action"] == "/alerts"
    assert web.get("/alerts?edit=nobody", headers=admin.headers).status_code == 404
    assert count(sessions) == 1


@pytest.fixture(scope="module")
def auth_off(settings: Settings, engine: Any) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update={"auth": "off"}))
    with TestClient(app, client=("127.0.0.1", 50000), follow_redirects=False) as c:
        yield c


def test_with_auth_off_the_page_is_read_only(auth_off: TestClient, sessions: sessionmaker[Session]) -> None:
    store(sessions)
    r = auth_off.get("/alerts")
    assert r.status_code == 200
    page = doc(r)
    assert page.select_one("#read-only") is not None and page.select_one("#rule-form") is None
    assert page.select("#rules form") == [] and "/alerts" in [a["href"] for a in page.select("nav.nav a")]
    posted = auth_off.post("/alerts/idle-gpus/delete", data={})
    assert posted.status_code == 403 and "GPUFLEET_AUTH=off" in posted.text
    assert count(sessions) == 1
