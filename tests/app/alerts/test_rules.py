"""Alert rules: durations, every check naming its field, and keeping rules in the database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.alerts import rules
from app.alerts.fields import format_duration, parse_duration_s
from app.alerts.outputs import rule_out
from app.alerts.rules import Route, Rule, Scope, Stop, Target
from app.alerts.schemas import RuleIn, field_problems, to_rule
from app.alerts.tables import alert_rules
from app.errors import ApiError

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
SECRET = "s3cret-s3cret-s3cret"


def body(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "forgotten gpus",
        "condition": "gpu_idle",
        "for": "2h",
        "route": {"slack": "https://hooks.slack.com/services/T0/B0/XXXX"},
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def problems(data: dict[str, Any]) -> dict[str, str]:
    """Field -> message of everything wrong with `data`."""
    try:
        to_rule(RuleIn.model_validate(data), source="api")
    except ValidationError as exc:
        return {p.field: p.message for p in field_problems(exc.errors())}
    except ApiError as exc:
        return {p.field: p.message for p in exc.detail}
    return {}


def check(data: dict[str, Any]) -> Rule:
    return to_rule(RuleIn.model_validate(data), source="api")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1w", 604800),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("90s", 90),
        ("0", 0),
        ("2", 7200),
        ("1.5h", 5400),
        (2, 7200),
        (0.5, 1800),
        (" 2H ", 7200),
    ],
)
def test_durations(text: str | float, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["2x", "-1h", "", "  ", "h", "1h-", "1.h", "2 hours", "367d", -1, float("inf"), True])
def test_bad_durations_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(text)


@pytest.mark.parametrize("seconds", [0, 59, 60, 3600, 5400, 86400, 90061, 604800 + 3600])
def test_a_formatted_duration_reads_back(seconds: int) -> None:
    assert parse_duration_s(format_duration(seconds)) == seconds


def test_a_good_rule() -> None:
    rule = check(
        body(
            quiet="1d",
            remind="12h",
            scope={"regions": ["us-east-1"], "lifecycles": ["on-demand"], "tags": {"team": "vision"}, "users": ["ada"]},
            stop={"grace": "30m"},
        )
    )
    assert rule.for_hours == 2.0 and rule.quiet_s == 86400 and rule.remind_s == 43200
    assert rule.scope == Scope(("us-east-1",), (), ("on-demand",), (("team", "vision"),), ("ada",))
    assert rule.stop == Stop(dry_run=True, grace_s=1800, spot=False, capacity_block=False)
    assert rule.route == Route(Target("slack", url="https://hooks.slack.com/services/T0/B0/XXXX"))


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"name": ""}, "name", "at least 1"),
        ({"name": "x" * 101}, "name", "at most 100"),
        ({"name": "a/b"}, "name", "letters, digits"),
        ({"name": " padded"}, "name", "not at either end"),
        ({"condition": "gpu_hot"}, "condition", "gpu_idle"),
        ({"for": None}, "for", "required for gpu_idle"),
        ({"for": "2x"}, "for", "not a duration"),
        ({"for": "-1h"}, "for", "negative"),
        ({"for": ""}, "for", "empty"),
        ({"for": "0"}, "for", "longer than 0"),
        ({"quiet": "soon"}, "quiet", "not a duration"),
        ({"remind": "0"}, "remind", "longer than 0"),
        ({"remind": True}, "remind", "expected a duration"),
        ({"usd_per_day": 5}, "usd_per_day", "only for tag_waste"),
        ({"tag": "team"}, "tag", "only for tag_waste"),
        ({"condition": "tag_waste", "for": None, "tag": "team"}, "usd_per_day", "required for tag_waste"),
        ({"condition": "tag_waste", "for": None, "usd_per_day": 5}, "tag", "required for tag_waste"),
        ({"condition": "tag_waste", "for": None, "tag": "team", "usd_per_day": 0}, "usd_per_day", "greater than 0"),
        ({"condition": "spot_interruption"}, "for", "takes no duration"),
        ({"condition": "spot_interruption", "for": None, "stop": {}}, "stop", "cannot stop one"),
        ({"scope": {"lifecycles": ["reserved"]}}, "scope.lifecycles[0]", "on-demand"),
        ({"scope": {"regions": [" "]}}, "scope.regions[0]", "at least 1"),
        ({"scope": {"teams": ["a"]}}, "scope.teams", "unknown field"),
        (
            {"condition": "tag_waste", "for": None, "tag": "team", "usd_per_day": 5, "scope": {"users": ["asmith"]}},
            "scope.users",
            "no process holds",
        ),
        ({"condition": "mig_unpartitioned", "scope": {"users": ["asmith"]}}, "scope.users", "no process holds"),
        ({"stop": {"grace": "2x"}}, "stop.grace", "not a duration"),
        ({"stop": {"dry_run": "no"}}, "stop.dry_run", "boolean"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"route": {}}, "route", "exactly one of"),
        ({"route": {"slack": "https://a.example", "email": ["a@example.com"]}}, "route", "exactly one of"),
        ({"route": {"slack": "hooks.slack.com/x"}}, "route.slack", "http:// or https://"),
        ({"route": {"webhook": "ftp://example.com/hook", "secret": SECRET}}, "route.webhook", "http:// or https://"),
        ({"route": {"webhook": "https:///path", "secret": SECRET}}, "route.webhook", "no host"),
        ({"route": {"webhook": "https://example.com/hook"}}, "route.secret", "required with webhook"),
        ({"route": {"webhook": "https://example.com/hook", "secret": "short"}}, "route.secret", "at least 16"),
        ({"route": {"slack": "https://a.example", "secret": SECRET}}, "route.secret", "only a webhook"),
        ({"route": {"email": ["a@example.com", "not an address"]}}, "route.email[1]", "not an email address"),
        ({"route": {"email": []}}, "route.email", "at least 1"),
        ({"route": {"owner": False}}, "route.owner", "true or left out"),
        (
            {"route": {"slack": "https://a.example", "fallback": {"slack": "https://b.example"}}},
            "route.fallback",
            "only an owner",
        ),
        (
            {"route": {"owner": True, "fallback": {"email": ["@example.com"]}}},
            "route.fallback.email[0]",
            "not an email",
        ),
        ({"route": {"owner": True, "fallback": {"webhook": "https://b.example"}}}, "route.fallback.secret", "required"),
        ({"route": {"owner": True, "fallback": {}}}, "route.fallback", "exactly one of"),
    ],
)
def test_each_problem_names_its_field(changes: dict[str, Any], field: str, says: str) -> None:
    found = problems(body(**changes))
    assert field in found, found
    assert says in found[field], found


@pytest.mark.parametrize("condition", ["gpu_idle", "slice_underused", "agent_offline", "spot_interruption"])
def test_users_scope_what_processes_hold(condition: str) -> None:
    data = body(condition=condition, scope={"users": ["asmith"]})
    if condition == "spot_interruption":
        data.pop("for")
    assert check(data).scope.users == ("asmith",)


def test_owner_route_with_a_fallback() -> None:
    rule = check(body(route={"owner": True, "fallback": {"webhook": "https://hooks.example/in", "secret": SECRET}}))
    assert rule.route.owner and rule.route.target == Target("webhook", url="https://hooks.example/in", secret=SECRET)
    assert rule.route.as_json() == {
        "owner": True,
        "fallback": {"channel": "webhook", "url": "https://hooks.example/in", "secret": SECRET},
    }
    assert Route.from_json(rule.route.as_json()) == rule.route
    bare = check(body(route={"owner": True}))
    assert bare.route == Route(None, owner=True) and bare.route.as_json() == {"owner": True, "fallback": None}


def test_email_addresses_are_kept_once_in_order() -> None:
    rule = check(body(route={"email": ["b@example.com", " a@example.com ", "b@example.com"]}))
    assert rule.route.target == Target("email", to=("b@example.com", "a@example.com"))


def test_numbers_are_hours_and_json_types_are_strict() -> None:
    assert check(body(**{"for": 1.5})).for_hours == 1.5
    assert "for" in problems(body(**{"for": True}))
    assert "enabled" in problems(body(enabled="yes"))
    assert "usd_per_day" in problems(body(condition="tag_waste", tag="team", usd_per_day="50", **{"for": None}))


# Keeping rules -------------------------------------------------------------------------------------------------


def stored(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(alert_rules)) or 0)


def test_create_read_list(session: Session) -> None:
    rule = check(body(route={"webhook": "https://hooks.example/in", "secret": SECRET}, stop={}))
    made = rules.create_rule(session, rule, by="token ops", now=NOW)
    assert made.id is not None and made.same_content(rule)
    assert made.created_at == NOW and made.updated_by == "token ops" and made.source == "api"
    assert rules.get_rule(session, "forgotten gpus") == made
    assert rules.get_rule(session, str(made.id)) == made
    assert rules.get_rule(session, "nothing") is None
    assert rules.list_rules(session) == [made]
    row = session.execute(select(alert_rules.c.stop, alert_rules.c.route, alert_rules.c.for_hours)).one()
    assert row.stop == {"dry_run": True, "grace_s": 3600, "spot": False, "capacity_block": False}
    assert row.route == {"channel": "webhook", "url": "https://hooks.example/in", "secret": SECRET}
    assert row.for_hours == 2.0


def test_no_stop_is_sql_null(session: Session) -> None:
    rules.create_rule(session, check(body()), by="t", now=NOW)
    assert session.scalar(select(alert_rules.c.stop.is_(None))) is True


def test_a_taken_name_is_409_naming_name_and_writes_nothing(session: Session) -> None:
    rules.create_rule(session, check(body()), by="t", now=NOW)
    with pytest.raises(ApiError) as err:
        rules.create_rule(session, check(body(quiet="1d")), by="t", now=NOW)
    assert err.value.status_code == 409 and err.value.detail[0].field == "name"
    assert stored(session) == 1 and rules.list_rules(session)[0].quiet_s == 0


def test_replace_keeps_id_and_may_rename(session: Session) -> None:
    made = rules.create_rule(session, check(body()), by="t", now=NOW)
    other = rules.create_rule(session, check(body(name="other")), by="t", now=NOW)
    later = NOW.replace(hour=13)
    renamed = rules.replace_rule(session, made.name, check(body(name="renamed", quiet="1h")), by="u", now=later)
    assert (renamed.id, renamed.name, renamed.quiet_s, renamed.updated_at) == (made.id, "renamed", 3600, later)
    assert renamed.created_at == NOW and renamed.updated_by == "u"
    with pytest.raises(ApiError) as err:
        rules.replace_rule(session, "renamed", check(body(name="other")), by="u", now=later)
    assert err.value.status_code == 409 and err.value.detail[0].field == "name"
    # The clash rolled back to its savepoint: both rules are as they were, and the session still works.
    assert {r.name for r in rules.list_rules(session)} == {"renamed", "other"}
    assert rules.get_rule(session, "other") == other
    with pytest.raises(ApiError) as missing:
        rules.replace_rule(session, "nobody", check(body()), by="u", now=later)
    assert missing.value.status_code == 404


def test_enable_and_delete(session: Session) -> None:
    rules.create_rule(session, check(body()), by="t", now=NOW)
    off = rules.set_enabled(session, "forgotten gpus", False, by="u", now=NOW)
    assert off.enabled is False and off.updated_by == "u"
    assert rules.set_enabled(session, "forgotten gpus", True, by="v", now=NOW).enabled is True
    assert rules.delete_rule(session, "forgotten gpus").name == "forgotten gpus"
    assert stored(session) == 0
    with pytest.raises(ApiError) as err:
        rules.delete_rule(session, "forgotten gpus")
    assert err.value.status_code == 404


def test_file_rules_are_not_changed_here(session: Session) -> None:
    rules.create_rule(session, replace(check(body()), source="file"), by="rule file", now=NOW)
    for change in (
        lambda: rules.replace_rule(session, "forgotten gpus", check(body(quiet="1h")), by="u", now=NOW),
        lambda: rules.delete_rule(session, "forgotten gpus"),
        lambda: rules.set_enabled(session, "forgotten gpus", False, by="u", now=NOW),
    ):
        with pytest.raises(ApiError) as err:
            change()
        assert err.value.status_code == 409 and "rule file" in err.value.error
    assert rules.list_rules(session)[0].quiet_s == 0


def test_a_replaced_webhook_keeps_its_secret_for_the_same_url_only(session: Session) -> None:
    made = rules.create_rule(
        session, check(body(route={"webhook": "https://hooks.example/in", "secret": SECRET})), by="t", now=NOW
    )
    same = to_rule(RuleIn.model_validate(body(route={"webhook": "https://hooks.example/in"})), source="api", keep=made)
    assert same.route.target is not None and same.route.target.secret == SECRET
    with pytest.raises(ApiError) as err:
        to_rule(RuleIn.model_validate(body(route={"webhook": "https://elsewhere.example/in"})), source="api", keep=made)
    assert err.value.status_code == 400 and err.value.detail[0].field == "route.secret"


def test_the_answer_hides_the_secret(session: Session) -> None:
    made = rules.create_rule(
        session,
        check(body(route={"owner": True, "fallback": {"webhook": "https://hooks.example/in", "secret": SECRET}})),
        by="t",
        now=NOW,
    )
    out = rule_out(made).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert SECRET not in str(out)
    assert out["route"] == {"owner": True, "fallback": {"webhook": "https://hooks.example/in", "secret_set": True}}
    assert out["for"] == "2h" and out["quiet"] == "0"
