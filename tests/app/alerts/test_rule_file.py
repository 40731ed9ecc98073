"""The rule file: TOML to rules, one line naming the line of each problem, the sync at start, and `gpufleet serve`
stopping with exit code 2 on a bad file."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import rules
from app.alerts.rule_file import RuleFileError, load_rule_file, parse_rule_file, sync_rule_file
from app.alerts.rules import Origin, Route, Target
from app.alerts.schemas import RuleIn, to_rule
from app.alerts.tables import alert_rules
from app.cli import main
from app.db import session_scope

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
PATH = Path("/etc/gpufleet/alerts.toml")

GOOD = """\
# Alert rules of the fleet.

[[rule]]
name = "forgotten-gpus"
condition = "gpu_idle"
for = "2h"
quiet = "1d"
remind = "1d"
scope = { lifecycles = ["on-demand"], tags = { team = "vision" } }
route = { owner = true, fallback = { slack = "https://hooks.slack.com/services/T0/B0/XXXX" } }

[[rule]]
name = "team-waste"
condition = "tag_waste"
tag = "team"
usd_per_day = 50

[rule.route]
webhook = "https://hooks.example.com/gpufleet"
secret = "0123456789abcdef0123"

[[rule]]
name = "idle p4d"
condition = "gpu_idle"
for = 6
scope.instance_types = ["p4d.24xlarge"]
route.email = ["ml-leads@example.com"]

[rule.stop]
dry_run = false
grace = "1h30m"
"""


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_good_file() -> None:
    loaded = parse_rule_file(PATH, GOOD)
    assert [r.name for r in loaded] == ["forgotten-gpus", "team-waste", "idle p4d"]
    idle, waste, p4d = loaded
    assert idle.source == "file" and idle.origin == Origin(PATH, 3)
    assert idle.route == Route(Target("slack", url="https://hooks.slack.com/services/T0/B0/XXXX"), owner=True)
    assert idle.scope.tags == (("team", "vision"),) and idle.quiet_s == idle.remind_s == 86400
    assert waste.usd_per_day == 50.0 and waste.tag_key == "team" and waste.origin == Origin(PATH, 12)
    assert waste.route.target == Target(
        "webhook", url="https://hooks.example.com/gpufleet", secret="0123456789abcdef0123"
    )
    assert p4d.for_hours == 6 and p4d.stop is not None and p4d.stop.dry_run is False and p4d.stop.grace_s == 5400
    assert p4d.route.target == Target("email", to=("ml-leads@example.com",))


def test_an_empty_file_has_no_rules() -> None:
    assert parse_rule_file(PATH, "# nothing yet\n") == []


def fail(text: str) -> RuleFileError:
    with pytest.raises(RuleFileError) as err:
        parse_rule_file(PATH, text)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{PATH}:{err.value.line}: ")
    return err.value


@pytest.mark.parametrize(
    ("change", "needle", "says"),
    [
        (('for = "2h"', 'for = "2x"'), 'for = "2x"', "rule 'forgotten-gpus': for: not a duration: '2x'"),
        (('condition = "tag_waste"', 'condition = "tag_wasted"'), "tag_wasted", "condition: Input should be"),
        (('secret = "0123456789abcdef0123"', 'secret = "short"'), 'secret = "short"', "route.secret: String should"),
        (('webhook = "https://', 'webhook = "gopher://'), "gopher://", "route.webhook: expected an http"),
        (('route.email = ["ml-leads@example.com"]', 'route.email = ["ml-leads"]'), "route.email", "route.email[0]"),
        (('grace = "1h30m"', 'grace = "-5m"'), 'grace = "-5m"', "stop.grace: a duration cannot be negative"),
        (('quiet = "1d"', 'quiet = "1d"\nlouder = true'), "louder", "louder: unknown field"),
        (("usd_per_day = 50", "usd_per_day = -50"), "usd_per_day = -50", "usd_per_day: Input should be greater"),
        (('name = "idle p4d"', 'name = "forgotten-gpus"'), 'name = "forgotten-gpus"', "used twice (first at line 4)"),
    ],
)
def test_a_bad_rule_names_its_line(change: tuple[str, str], needle: str, says: str) -> None:
    text = GOOD.replace(*change, 1)
    assert text != GOOD
    err = fail(text)
    expected = line_of(text, needle) if needle != 'name = "forgotten-gpus"' else text.splitlines().index(needle, 10) + 1
    assert err.line == expected, str(err)
    assert says in err.problem, str(err)


def test_a_missing_key_names_the_rule_header() -> None:
    text = GOOD.replace("for = 6\n", "")
    err = fail(text)
    assert err.line == line_of(text, 'name = "idle p4d"') - 1
    assert err.problem == "rule 'idle p4d': for: required for gpu_idle"


def test_a_second_problem_is_counted() -> None:
    err = fail(GOOD.replace('for = "2h"', 'for = "2x"').replace('quiet = "1d"', 'quiet = "never"'))
    assert err.problem.endswith("(and 1 more problem)")


def test_toml_syntax_errors_carry_their_line() -> None:
    text = GOOD.replace("for = 6", "for = 6 hours")
    err = fail(text)
    assert err.line == line_of(text, "for = 6 hours") and "not valid TOML" in err.problem


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ('server = "x"\n', 1, "unknown key 'server'"),
        ("# rules\n[[rules]]\nname = 'x'\n", 2, "unknown key 'rules'"),
        ("rule = 3\n", 1, "[[rule]] table"),
        ("\n[rule]\nname = 'x'\n", 2, "[[rule]] table"),
    ],
)
def test_the_file_is_rule_tables_only(text: str, line: int, says: str) -> None:
    err = fail(text)
    assert err.line == line and says in err.problem


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError) as missing:
        load_rule_file(tmp_path / "none.toml")
    assert str(missing.value).startswith(f"{tmp_path / 'none.toml'}: cannot read it")
    latin = tmp_path / "latin.toml"
    latin.write_bytes('name = "caf\xe9"'.encode("latin-1"))
    with pytest.raises(RuleFileError, match="not UTF-8"):
        load_rule_file(latin)


# The sync ------------------------------------------------------------------------------------------------------


def api_rule(session: Session, name: str) -> None:
    data = {"name": name, "condition": "agent_offline", "for": "1h", "route": {"email": ["ops@example.com"]}}
    rules.create_rule(session, to_rule(RuleIn.model_validate(data), source="api"), by="token ops", now=NOW)


def test_sync_creates_replaces_and_deletes_file_rules_only(session: Session) -> None:
    api_rule(session, "made through the API")
    first = sync_rule_file(session, parse_rule_file(PATH, GOOD), now=NOW)
    assert sorted(first.created) == ["forgotten-gpus", "idle p4d", "team-waste"] and first.deleted == []
    ids = {r.name: r.id for r in rules.list_rules(session)}
    assert sync_rule_file(session, parse_rule_file(PATH, GOOD), now=NOW) == type(first)([], [], [])

    edited = GOOD.replace('for = "2h"', 'for = "3h"').replace('name = "team-waste"', 'name = "team waste"')
    later = NOW.replace(hour=14)
    second = sync_rule_file(session, parse_rule_file(PATH, edited), now=later)
    assert (
        second.created == ["team waste"] and second.replaced == ["forgotten-gpus"] and second.deleted == ["team-waste"]
    )
    now_stored = {r.name: r for r in rules.list_rules(session)}
    assert set(now_stored) == {"forgotten-gpus", "idle p4d", "team waste", "made through the API"}
    assert now_stored["forgotten-gpus"].id == ids["forgotten-gpus"] and now_stored["forgotten-gpus"].for_hours == 3
    assert now_stored["forgotten-gpus"].updated_at == later and now_stored["forgotten-gpus"].updated_by == "rule file"
    assert now_stored["idle p4d"].updated_at == NOW
    assert {r.source for r in now_stored.values()} == {"file", "api"}

    sync_rule_file(session, [], now=later)
    assert [r.name for r in rules.list_rules(session)] == ["made through the API"]


def test_a_name_clash_with_an_api_rule_names_the_line_and_changes_nothing(session: Session) -> None:
    api_rule(session, "idle p4d")
    with pytest.raises(RuleFileError) as err:
        sync_rule_file(session, parse_rule_file(PATH, GOOD), now=NOW)
    assert err.value.line == line_of(GOOD, 'name = "idle p4d"') - 1
    assert "made through the API" in str(err.value) and "\n" not in str(err.value)
    assert [r.name for r in rules.list_rules(session)] == ["idle p4d"]


# gpufleet serve ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_sigterm_change() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.usefixtures("no_sigterm_change")
def test_serve_stops_on_a_bad_rule_file_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "alerts.toml"
    text = GOOD.replace('for = "2h"', 'for = "2x"')
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("GPUFLEET_ALERTS_FILE", str(path))
    # Checked before any database is started or joined.
    code, out, err = run(capsys, "serve", "--data-dir", str(tmp_path / "data"))
    assert code == 2 and out == ""
    line = line_of(text, 'for = "2x"')
    assert err == f"gpufleet: bad alert rule file {path}:{line}: rule 'forgotten-gpus': for: not a duration: " + (
        "'2x'; use 30m, 2h, 1d, 1w, a combination such as 1h30m, or a number of hours\n"
    )
    assert not (tmp_path / "data").exists()


@pytest.fixture
def serve_returns(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`gpufleet serve` runs through its start-up, then returns instead of serving."""
    import uvicorn

    calls: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(app))
    return calls


@pytest.mark.usefixtures("no_sigterm_change")
def test_serve_syncs_a_good_file_and_stops_on_a_clash(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    engine: Engine,
    sessions: sessionmaker[Session],
    serve_returns: list[Any],
) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(GOOD, encoding="utf-8")
    monkeypatch.setenv("GPUFLEET_ALERTS_FILE", str(path))
    code, _, err = run(capsys, "serve", "--database-url", database_url)
    assert code == 0 and len(serve_returns) == 1, err
    with engine.connect() as conn:
        names = conn.execute(select(alert_rules.c.name, alert_rules.c.source).order_by(alert_rules.c.name)).all()
    assert names == [("forgotten-gpus", "file"), ("idle p4d", "file"), ("team-waste", "file")]

    with session_scope(sessions) as s:
        api_rule(s, "made by hand")
    path.write_text(GOOD.replace('name = "team-waste"', 'name = "made by hand"'), encoding="utf-8")
    code, _, err = run(capsys, "serve", "--database-url", database_url)
    assert code == 2 and len(serve_returns) == 1
    assert err == (
        f"gpufleet: bad alert rule file {path}:12: rule 'made by hand': a rule of that name was made through the API: "
        "rename one of them\n"
    )
    with engine.connect() as conn:
        assert conn.execute(select(alert_rules.c.name).where(alert_rules.c.name == "team-waste")).scalar() is not None

    monkeypatch.delenv("GPUFLEET_ALERTS_FILE")
    code, _, _ = run(capsys, "serve", "--database-url", database_url)
    assert code == 0
    with engine.connect() as conn:
        assert conn.execute(select(alert_rules.c.name)).scalars().all() == ["made by hand"]
