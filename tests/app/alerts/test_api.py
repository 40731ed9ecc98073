"""`/api/v1/alerts` over HTTP: admins only, each bad field named in a 400, nothing half-written, file rules left to
the file, secrets never shown."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import rules
from app.alerts.schemas import RuleIn, to_rule
from app.alerts.tables import alert_rules
from app.db import session_scope
from app.main import create_app
from app.models import ApiToken
from app.sessions import SESSION_COOKIE, open_session
from app.settings import Settings
from app.web.csrf import CSRF_HEADER
from tests.conftest import make_token

URL = "/api/v1/alerts"
SECRET = "hmac-secret-0123456789"


def rule_body(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "idle-gpus",
        "condition": "gpu_idle",
        "for": "2h",
        "scope": {"lifecycles": ["on-demand"], "tags": {"team": "vision"}},
        "route": {"webhook": "https://hooks.example.com/gpufleet", "secret": SECRET},
        "remind": "1d",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def admin(sessions: sessionmaker[Session]) -> dict[str, str]:
    return bearer(make_token(sessions, "admin", name="ops"))


def count(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(alert_rules)) or 0)


def session_cookie(sessions: sessionmaker[Session], scope: str) -> tuple[str, str]:
    """A dashboard login opened with a token of `scope`: its cookie and CSRF token."""
    make_token(sessions, scope, name=f"login-{scope}")
    with session_scope(sessions) as s:
        token_id = s.scalar(select(ApiToken.id).where(ApiToken.name == f"login-{scope}"))
        cookie, live = open_session(
            s, token_id=token_id, password_hash=None, lifetime=timedelta(hours=1), now=datetime.now(UTC)
        )
    return cookie, live.csrf_secret


def test_add_read_list_replace_toggle_delete(client: TestClient, admin: dict[str, str]) -> None:
    made = client.post(URL, json=rule_body(), headers=admin)
    assert made.status_code == 201, made.text
    assert made.headers["location"] == f"{URL}/idle-gpus"
    rule = made.json()
    assert rule["name"] == "idle-gpus" and rule["for"] == "2h" and rule["remind"] == "1d" and rule["quiet"] == "0"
    assert rule["route"] == {"webhook": "https://hooks.example.com/gpufleet", "secret_set": True}
    assert rule["scope"]["tags"] == {"team": "vision"} and rule["source"] == "api"
    assert rule["updated_by"] == "token ops" and rule["enabled"] is True and "stop" not in rule

    assert client.get(f"{URL}/idle-gpus", headers=admin).json() == rule
    assert client.get(f"{URL}/{rule['id']}", headers=admin).json() == rule
    assert client.get(URL, headers=admin).json() == {"rules": [rule]}

    # A replacement without the secret keeps it: the rule a GET returned can be sent back as it is, changed.
    sent_back = {k: rule[k] for k in ("name", "condition", "for", "scope", "quiet", "remind")}
    sent_back["route"] = {"webhook": rule["route"]["webhook"]}
    sent_back["name"] = "idle gpus"
    sent_back["stop"] = {"grace": "30m", "spot": True}
    put = client.put(f"{URL}/idle-gpus", json=sent_back, headers=admin)
    assert put.status_code == 200, put.text
    assert put.json()["id"] == rule["id"] and put.json()["name"] == "idle gpus"
    assert put.json()["stop"] == {"dry_run": True, "grace": "30m", "spot": True, "capacity_block": False}
    assert put.json()["route"]["secret_set"] is True

    off = client.post(f"{URL}/idle gpus/enabled", json={"enabled": False}, headers=admin)
    assert off.status_code == 200 and off.json()["enabled"] is False
    gone = client.delete(f"{URL}/idle%20gpus", headers=admin)
    assert gone.status_code == 204 and gone.content == b""
    assert client.get(f"{URL}/idle gpus", headers=admin).status_code == 404
    assert client.get(URL, headers=admin).json() == {"rules": []}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"condition": "gpu_hot"}, "condition"),
        ({"for": "2x"}, "for"),
        ({"for": None}, "for"),
        ({"remind": "-1h"}, "remind"),
        ({"quiet": ""}, "quiet"),
        ({"route": {"webhook": "not a url", "secret": SECRET}}, "route.webhook"),
        ({"route": {"slack": "ftp://hooks.slack.com/x"}}, "route.slack"),
        ({"route": {"webhook": "https://hooks.example.com/x"}}, "route.secret"),
        ({"route": {"email": ["ops@example.com", "ops at example.com"]}}, "route.email[1]"),
        ({"route": {"owner": True, "fallback": {"email": ["x"]}}}, "route.fallback.email[0]"),
        ({"scope": {"lifecycles": ["reserved"]}}, "scope.lifecycles[0]"),
        ({"stop": {"grace": "forever"}}, "stop.grace"),
        ({"name": "a/b"}, "name"),
        ({"enabled": "yes"}, "enabled"),
        ({"usd_per_day": 10}, "usd_per_day"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(
    client: TestClient, admin: dict[str, str], sessions: sessionmaker[Session], changes: dict[str, Any], field: str
) -> None:
    r = client.post(URL, json=rule_body(**changes), headers=admin)
    assert r.status_code == 400, r.text
    answer = r.json()
    assert answer["error"] == "bad rule"
    assert field in [d["field"] for d in answer["detail"]], answer
    assert count(sessions) == 0


def test_bodies_that_are_not_rules(client: TestClient, admin: dict[str, str], sessions: sessionmaker[Session]) -> None:
    r = client.post(URL, content=b"{not json", headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad rule"
    r = client.post(URL, json=["a"], headers=admin)
    assert r.status_code == 400
    r = client.post(URL, headers=admin)
    assert r.status_code == 400 and r.json()["detail"][0]["message"] == "required"
    r = client.post(f"{URL}/x/enabled", json={"enabled": "off"}, headers=admin)
    assert r.status_code == 400 and r.json()["detail"][0]["field"] == "enabled"
    assert count(sessions) == 0


def test_a_bad_replacement_leaves_the_rule_as_it_was(client: TestClient, admin: dict[str, str]) -> None:
    before = client.post(URL, json=rule_body(), headers=admin).json()
    r = client.put(f"{URL}/idle-gpus", json=rule_body(quiet="1d", route={"email": ["nope"]}), headers=admin)
    assert r.status_code == 400 and r.json()["detail"][0]["field"] == "route.email[0]"
    # A new webhook URL needs its secret again.
    r = client.put(f"{URL}/idle-gpus", json=rule_body(route={"webhook": "https://other.example/in"}), headers=admin)
    assert r.status_code == 400 and r.json()["detail"][0]["field"] == "route.secret"
    assert client.get(f"{URL}/idle-gpus", headers=admin).json() == before


def test_names_are_unique(client: TestClient, admin: dict[str, str], sessions: sessionmaker[Session]) -> None:
    assert client.post(URL, json=rule_body(), headers=admin).status_code == 201
    assert client.post(URL, json=rule_body(name="other"), headers=admin).status_code == 201
    again = client.post(URL, json=rule_body(quiet="1h"), headers=admin)
    assert again.status_code == 409 and again.json()["detail"][0]["field"] == "name"
    renamed = client.put(f"{URL}/other", json=rule_body(), headers=admin)
    assert renamed.status_code == 409 and renamed.json()["detail"][0]["field"] == "name"
    assert count(sessions) == 2
    assert client.put(f"{URL}/nobody", json=rule_body(name="nobody"), headers=admin).status_code == 404
    assert client.delete(f"{URL}/nobody", headers=admin).status_code == 404


def test_a_rule_from_the_file_is_changed_in_the_file(
    client: TestClient, admin: dict[str, str], sessions: sessionmaker[Session]
) -> None:
    with session_scope(sessions) as s:
        rule = to_rule(RuleIn.model_validate(rule_body()), source="file")
        rules.create_rule(s, replace(rule, source="file"), by="rule file", now=datetime.now(UTC))
    shown = client.get(f"{URL}/idle-gpus", headers=admin).json()
    assert shown["source"] == "file"
    for r in (
        client.put(f"{URL}/idle-gpus", json=rule_body(quiet="1h"), headers=admin),
        client.post(f"{URL}/idle-gpus/enabled", json={"enabled": False}, headers=admin),
        client.delete(f"{URL}/idle-gpus", headers=admin),
    ):
        assert r.status_code == 409 and "comes from the rule file" in r.json()["error"]
    assert client.get(f"{URL}/idle-gpus", headers=admin).json() == shown


def test_secrets_are_never_shown(client: TestClient, admin: dict[str, str]) -> None:
    owner = {"owner": True, "fallback": {"webhook": "https://hooks.example.com/b", "secret": SECRET + "-b"}}
    answers = [
        client.post(URL, json=rule_body(), headers=admin),
        client.post(URL, json=rule_body(name="owned", route=owner), headers=admin),
        client.get(URL, headers=admin),
        client.get(f"{URL}/owned", headers=admin),
        client.put(f"{URL}/owned", json=rule_body(name="owned", route=owner), headers=admin),
        client.post(f"{URL}/owned/enabled", json={"enabled": False}, headers=admin),
    ]
    for r in answers:
        assert r.status_code in (200, 201), r.text
        assert SECRET not in r.text
    assert answers[3].json()["route"]["fallback"] == {"webhook": "https://hooks.example.com/b", "secret_set": True}


ROUTES = [
    ("GET", URL),
    ("POST", URL),
    ("GET", f"{URL}/idle-gpus"),
    ("PUT", f"{URL}/idle-gpus"),
    ("DELETE", f"{URL}/idle-gpus"),
    ("POST", f"{URL}/idle-gpus/enabled"),
]


@pytest.mark.parametrize(("method", "url"), ROUTES)
def test_admins_only(
    client: TestClient, sessions: sessionmaker[Session], admin: dict[str, str], method: str, url: str
) -> None:
    client.post(URL, json=rule_body(), headers=admin)
    body = {"enabled": False} if url.endswith("enabled") else rule_body()
    payload = {"json": body} if method in ("POST", "PUT") else {}
    nobody = client.request(method, url, **payload)
    assert nobody.status_code == 401 and nobody.headers["WWW-Authenticate"].startswith("Bearer")
    for scope in ("read", "ingest"):
        r = client.request(method, url, headers=bearer(make_token(sessions, scope)), **payload)
        assert r.status_code == 403 and r.json()["error"] == f"token scope {scope!r} does not allow 'admin'"
    cookie, _csrf = session_cookie(sessions, "read")
    r = client.request(method, url, headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}, **payload)
    assert r.status_code == 403 and "may only read" in r.json()["error"]
    assert count(sessions) == 1


def test_an_admin_login_changes_with_its_csrf_token(client: TestClient, sessions: sessionmaker[Session]) -> None:
    cookie, csrf = session_cookie(sessions, "admin")
    jar = {"Cookie": f"{SESSION_COOKIE}={cookie}"}
    assert client.get(URL, headers=jar).status_code == 200
    forged = client.post(URL, json=rule_body(), headers=jar)
    assert forged.status_code == 403 and CSRF_HEADER in forged.json()["error"]
    assert client.post(URL, json=rule_body(), headers={**jar, CSRF_HEADER: "x" * 43}).status_code == 403
    made = client.post(URL, json=rule_body(), headers={**jar, CSRF_HEADER: csrf})
    assert made.status_code == 201 and made.json()["updated_by"] == "login login-admin"


@pytest.fixture(scope="module")
def auth_off(settings: Settings, engine: Any) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update={"auth": "off"}))
    with TestClient(app, client=("127.0.0.1", 50000)) as c:
        yield c


def test_with_auth_off_this_host_reads_and_only_an_admin_token_changes(
    auth_off: TestClient, sessions: sessionmaker[Session]
) -> None:
    assert auth_off.get(URL).status_code == 200
    r = auth_off.post(URL, json=rule_body())
    assert r.status_code == 401 and "GPUFLEET_AUTH=off" in r.json()["error"]
    assert auth_off.post(URL, json=rule_body(), headers=bearer(make_token(sessions, "read"))).status_code == 403
    assert auth_off.post(URL, json=rule_body(), headers=bearer(make_token(sessions, "admin"))).status_code == 201
    remote = TestClient(auth_off.app, client=("192.0.2.7", 50000))
    assert remote.get(URL).status_code == 403


def test_the_openapi_description(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ops = spec["paths"][URL]
    assert {"bearerToken": ["admin"]} in ops["post"]["security"]
    assert ops["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/RuleIn")
    assert set(ops["post"]["responses"]) >= {"201", "400", "401", "403", "409"}
    schema = spec["components"]["schemas"]["RuleIn"]
    assert {"name", "condition", "for", "scope", "route", "quiet", "remind", "stop", "enabled"} <= set(
        schema["properties"]
    )
    assert set(spec["paths"][f"{URL}/{{name}}"]) == {"get", "put", "delete"}
    assert "post" in spec["paths"][f"{URL}/{{name}}/enabled"]
