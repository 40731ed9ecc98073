"""Who hears of an incident: fixed routes, owner routing in its order (owner tag, holders' addresses, team route,
fallback), and GPUFLEET_TEAM_TAG / GPUFLEET_TEAM_ROUTES as an operator writes them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from app.alerts.findings import Finding
from app.alerts.recipients import Target, no_one_told, targets, team_target
from app.alerts.rules import Route, Rule
from app.alerts.rules import Target as Fixed
from app.cli import main
from app.settings import Settings

SLACK = "https://hooks.slack.com/services/T0/B0/ml-secret-part"
FALLBACK = Fixed("webhook", url="https://hooks.example.com/gpufleet", secret="s" * 20)


def _finding(**kw: Any) -> Finding:
    base: dict[str, Any] = {
        "subject": "gpu:GPU-1",
        "since": datetime(2026, 11, 24, 9, tzinfo=UTC),
        "what": "GPU 0 (NVIDIA A10G) idle for 3.0 h",
        "instance_id": "i-0abc",
    }
    return Finding(**{**base, **kw})


def _owner_rule(fallback: Fixed | None = FALLBACK) -> Rule:
    return Rule(name="owners", condition="gpu_idle", for_hours=1, route=Route(fallback, owner=True))


def _settings(**kw: Any) -> Settings:
    return Settings(
        user_emails="ana=ana@example.com,bob=bob@example.com",
        team_routes=f"ml={SLACK},ml=ml-leads@example.com,infra=infra@example.com",
        **kw,
    )


def _to(found: list[Target]) -> list[tuple[str, str, str]]:
    return [(t.channel, t.to, t.via) for t in found]


def test_a_fixed_route_names_one_target_per_url_or_address() -> None:
    s = Settings()
    mail = Rule(name="r", condition="gpu_idle", route=Route(Fixed("email", to=("a@example.com", "b@example.com"))))
    assert _to(targets(s, mail, _finding())) == [
        ("email", "a@example.com", "route"),
        ("email", "b@example.com", "route"),
    ]
    hook = Rule(name="r", condition="gpu_idle", route=Route(FALLBACK))
    (t,) = targets(s, hook, _finding(tags={"Owner": "ada@example.com"}))
    assert (t.channel, t.to, t.secret) == ("webhook", FALLBACK.url, FALLBACK.secret)
    slack = Rule(name="r", condition="gpu_idle", route=Route(Fixed("slack", url=SLACK)))
    (t,) = targets(s, slack, _finding())
    assert (t.channel, t.secret) == ("slack", None)
    assert t.shown.startswith("https://hooks.slack.com/... #") and "secret" not in t.shown


def test_owner_tags_come_first_in_their_configured_order() -> None:
    s = _settings(owner_tags="email,Owner")
    f = _finding(
        tags={"Owner": "Ada Lovelace <ada@example.com>", "email": "not an address", "team": "ml"},
        holders=("ana",),
    )
    # "email" is tried first but holds no address; Owner's display form gives its address.
    assert _to(targets(s, _owner_rule(), f)) == [("email", "ada@example.com", "owner tag Owner")]
    f2 = _finding(tags={"Owner": "ada@example.com", "email": "eve@example.com"})
    assert _to(targets(s, _owner_rule(), f2)) == [("email", "eve@example.com", "owner tag email")]


def test_then_the_holders_addresses_then_the_team_route_then_the_fallback() -> None:
    s = _settings()
    holders = _finding(tags={"Owner": "asmith", "team": "ml"}, holders=("ana", "carol", "bob", "ana"))
    assert _to(targets(s, _owner_rule(), holders)) == [
        ("email", "ana@example.com", "user ana"),
        ("email", "bob@example.com", "user bob"),
    ]
    team = _finding(tags={"team": "ml"}, holders=("carol",))
    assert _to(targets(s, _owner_rule(), team)) == [
        ("slack", SLACK, "team ml"),
        ("email", "ml-leads@example.com", "team ml"),
    ]
    # A tag_waste finding about the team tag names the team by its subject.
    waste = _finding(subject="tag:team=infra", instance_id=None, what="team=infra wastes $300 a day")
    assert _to(targets(s, _owner_rule(), waste)) == [("email", "infra@example.com", "team infra")]
    other_team = _finding(tags={"team": "web"})
    assert _to(targets(s, _owner_rule(), other_team)) == [("webhook", FALLBACK.url, "fallback")]


def test_the_team_tag_is_configurable() -> None:
    s = _settings(team_tag=" squad ")
    assert s.team_tag == "squad"
    f = _finding(tags={"team": "ml", "squad": "infra"})
    assert _to(targets(s, _owner_rule(None), f)) == [("email", "infra@example.com", "team infra")]


def test_no_one_to_tell_says_why() -> None:
    s = _settings()
    f = _finding(tags={"team": "web"}, holders=("carol",))
    assert targets(s, _owner_rule(None), f) == []
    why = no_one_told(s, _owner_rule(None), f)
    assert why.startswith("no one was told:")
    assert "Owner, owner, email" in why and "carol" in why and "team=web" in why and "no fallback" in why


def test_team_routes_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_TEAM_TAG", "Team")
    monkeypatch.setenv("GPUFLEET_TEAM_ROUTES", f" ml = {SLACK} , ml=ml@example.com,, infra=ops@example.com ")
    s = Settings()
    assert s.team_tag == "Team"
    assert s.team_routes == {"ml": [SLACK, "ml@example.com"], "infra": ["ops@example.com"]}
    assert Settings().team_routes is not None and Settings(team_routes="").team_routes == {}
    assert team_target("ml", SLACK) == Target("slack", SLACK, None, "team ml")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ml", "expected team=address or team=https://hooks.slack.com/... pairs"),
        ("=ops@example.com", "expected team=address"),
        ("ml=", "team 'ml' has no address or Slack URL"),
        ("ml=ops at example.com", "team 'ml': expected an email address or a Slack incoming webhook URL"),
        ("ml=a@b@c", "team 'ml': not an email address"),
        ("ml=https://hooks.example.com/hook-secret", "team 'ml': expected an email address or a Slack"),
        ("ml=http://hooks.slack.com/services/T/B/secret", "team 'ml': expected an email address or a Slack"),
    ],
)
def test_a_bad_team_route_is_refused_without_showing_the_url(value: str, problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(team_routes=value)
    # What `gpufleet` prints of it (app/cli.py): the message, never the value, which may be a secret URL.
    text = info.value.errors()[0]["msg"]
    assert problem in text
    assert "secret" not in text


def test_a_bad_team_route_stops_a_command_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_TEAM_ROUTES", "ml=https://example.com/x")
    code = main(["token", "list", "--database-url", "postgresql://x@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gpufleet: bad setting GPUFLEET_TEAM_ROUTES: ")
    assert "team 'ml'" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("GPUFLEET_TEAM_ROUTES", "")
    monkeypatch.setenv("GPUFLEET_TEAM_TAG", " ")
    code = main(["token", "list", "--database-url", "postgresql://x@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("gpufleet: bad setting GPUFLEET_TEAM_TAG: ")
