"""The daily digest against the real database: one per target per UTC day from the digest hour, never doubled
(queued again, or by two processes at once), its dollars, top waste and incidents worked out by hand on a fleet
fed through the real ingest route, each target's rules' scopes respected, and a real send that arrives with its
message id."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import outbox
from app.alerts.digest import digest_job, queue_digests
from app.alerts.outbox import send_due
from app.alerts.rules import Route, Rule, Scope, Target, create_rule
from app.alerts.tables import alert_incidents, alert_outbox
from app.db import make_engine, make_sessionmaker, session_scope
from app.models import Instance
from app.settings import Settings
from tests.app.alerts.jobs import run_beside_outage
from tests.app.alerts.receivers import HttpReceiver, Inbox
from tests.factories import gpu
from tests.feeding import G5_PER_GPU_HOUR, P4D_PER_GPU_HOUR, Feeder, busy, holders_story, idle

H = timedelta(hours=1)
DAY_NOW = datetime(2026, 11, 25, 9, 30, tzinfo=UTC)
"""A time past the default digest hour (8 UTC), for tests that need no fleet."""
SECRET = "a-long-shared-secret-0123456789"
SLACK = "https://hooks.slack.com/services/T0/B0/XXXX"
HOOK = "https://hooks.example.com/gpufleet"
PUBLIC = "https://gpufleet.example.com"


def _settings(settings: Settings, hour: int = 8, **more: Any) -> Settings:
    return settings.model_copy(update={"alerts_digest_hour": hour, "public_url": PUBLIC, **more})


def _slack(url: str = SLACK) -> Route:
    return Route(Target("slack", url))


def _hook(url: str = HOOK) -> Route:
    return Route(Target("webhook", url, secret=SECRET))


def _email(*to: str) -> Route:
    return Route(Target("email", to=to))


def _rule(
    sessions: sessionmaker[Session], name: str, route: Route, scope: Scope | None = None, *, enabled: bool = True
) -> Rule:
    rule = Rule(name, "gpu_idle", route, for_hours=2.0, scope=scope or Scope(), enabled=enabled)
    with session_scope(sessions) as s:
        return create_rule(s, rule, by="test", now=DAY_NOW - 2 * timedelta(days=1))


def _queue(sessions: sessionmaker[Session], settings: Settings, now: datetime) -> int:
    with session_scope(sessions) as s:
        return queue_digests(s, settings, now=now)


def _digests(sessions: sessionmaker[Session]) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_outbox).where(alert_outbox.c.kind == "digest").order_by(alert_outbox.c.id)))


def _digest_id(channel: str, target: str, day: date) -> uuid.UUID:
    return outbox.message_id("digest", channel, target, day.isoformat())


def _payload_to(sessions: sessionmaker[Session], channel: str, target: str) -> dict[str, Any]:
    (row,) = [r for r in _digests(sessions) if (r.channel, r.target) == (channel, target)]
    return dict(row.payload)


# When, and how many -----------------------------------------------------------------------------------------------


def test_one_digest_per_fixed_target_per_day(sessions: sessionmaker[Session], settings: Settings) -> None:
    _rule(sessions, "a", _slack())
    _rule(sessions, "b", _slack(), Scope(regions=("eu-west-1",)))  # the same target: one digest for both
    _rule(sessions, "c", _email("ml@example.com", "ops@example.com"))
    _rule(sessions, "d", _hook())
    _rule(sessions, "e", Route(Target("email", to=("fallback@example.com",)), owner=True))
    _rule(sessions, "f", Route(None, owner=True))  # an owner route without a fallback: no fixed target
    s8 = _settings(settings)
    assert _queue(sessions, s8, DAY_NOW) == 5
    today = DAY_NOW.date()
    expected = {
        ("slack", SLACK),
        ("email", "ml@example.com"),
        ("email", "ops@example.com"),
        ("webhook", HOOK),
        ("email", "fallback@example.com"),
    }
    rows = _digests(sessions)
    assert {(r.channel, r.target) for r in rows} == expected
    assert {r.message_id for r in rows} == {_digest_id(c, t, today) for c, t in expected}
    assert all(r.incident_id is None for r in rows)
    assert next(r.secret for r in rows if r.channel == "webhook") == SECRET
    # Later the same day: nothing more. The next day: one each again.
    assert _queue(sessions, s8, DAY_NOW + 10 * H) == 0
    assert len(_digests(sessions)) == 5
    assert _queue(sessions, s8, DAY_NOW + 24 * H) == 5
    assert len({r.message_id for r in _digests(sessions)}) == 10


def test_no_digest_before_the_digest_hour(sessions: sessionmaker[Session], settings: Settings) -> None:
    _rule(sessions, "a", _hook())
    morning = datetime(2026, 11, 25, 0, 0, tzinfo=UTC)
    assert _queue(sessions, _settings(settings, 6), morning + timedelta(hours=5, minutes=59)) == 0
    assert _digests(sessions) == []
    assert _queue(sessions, _settings(settings, 6), morning + 6 * H) == 1
    (row,) = _digests(sessions)
    assert row.payload["date"] == "2026-11-25"
    assert (row.payload["start"], row.payload["end"]) == ("2026-11-24T06:00:00Z", "2026-11-25T06:00:00Z")


def test_a_target_added_late_in_the_day_gets_that_days_digest(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    s8 = _settings(settings)
    _rule(sessions, "a", _hook())
    assert _queue(sessions, s8, DAY_NOW) == 1
    _rule(sessions, "b", _slack())
    late = DAY_NOW.replace(hour=23, minute=50)
    assert _queue(sessions, s8, late) == 1
    assert {r.message_id for r in _digests(sessions)} == {
        _digest_id("webhook", HOOK, DAY_NOW.date()),
        _digest_id("slack", SLACK, DAY_NOW.date()),
    }
    # Its window is the day's, not the 24 h before it was queued.
    assert _payload_to(sessions, "slack", SLACK)["text"].endswith("2026-11-24 08:00 to 2026-11-25 08:00 UTC")


def test_disabled_rules_route_no_digest(sessions: sessionmaker[Session], settings: Settings) -> None:
    _rule(sessions, "on", _hook())
    _rule(sessions, "off", _slack(), enabled=False)
    # A target shared with a disabled rule gets the digest of the enabled one only.
    _rule(sessions, "off-too", _hook(), Scope(regions=("eu-west-1",)), enabled=False)
    assert _queue(sessions, _settings(settings), DAY_NOW) == 1
    (row,) = _digests(sessions)
    assert (row.channel, row.target) == ("webhook", HOOK)
    assert row.payload["rules"] == ["on"]


def test_queued_twice_at_once_it_is_queued_once(engine: Engine, settings: Settings) -> None:
    sessions = make_sessionmaker(engine)
    for i in range(4):
        _rule(sessions, f"r{i}", _hook(f"{HOOK}/{i}"))
    two = make_engine(engine.url.render_as_string(hide_password=False), pool_size=2)
    s8 = _settings(settings)
    gate = threading.Barrier(2)
    counts: list[int] = []
    errors: list[BaseException] = []

    def run(factory: sessionmaker[Session]) -> None:
        try:
            gate.wait(5)
            counts.append(_queue(factory, s8, DAY_NOW))
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(f,)) for f in (sessions, make_sessionmaker(two))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        two.dispose()
    assert errors == []
    assert sorted(counts) == [0, 4]
    assert len(_digests(sessions)) == 4


# What it says -----------------------------------------------------------------------------------------------------


def _story(feeder: Feeder) -> datetime:
    """i-p4d (team research): GPU 0 idle and GPU 1 busy for 3 h; i-g5 (team infra): its GPU idle for 2 h. Returns
    the end of the story, the digest hour of the tests that read it."""
    t0 = feeder.t0
    feeder.feed(
        [gpu(0, uid="GPU-p0"), gpu(1, uid="GPU-p1")],
        start=t0,
        hours=3,
        fn={"GPU-p0": idle, "GPU-p1": busy(50.0)},
        instance_id="i-p4d",
        tags={"team": "research", "Name": "trainer"},
    )
    feeder.feed(
        [gpu(0, uid="GPU-g5", name="NVIDIA A10G")],
        start=t0 + H,
        hours=2,
        instance_id="i-g5",
        instance_type="g5.xlarge",
        tags={"team": "infra"},
    )
    return t0 + 3 * H


def _incident(sessions: sessionmaker[Session], rule: Rule, subject: str, **values: Any) -> None:
    with session_scope(sessions) as s:
        s.execute(alert_incidents.insert().values(rule_id=rule.id, subject=subject, **values))


def test_the_digest_gives_dollars_top_waste_and_the_days_incidents(
    sessions: sessionmaker[Session], settings: Settings, feeder: Feeder
) -> None:
    end = _story(feeder)
    rule = _rule(sessions, "idle", _hook())
    other = _rule(sessions, "elsewhere", _slack())
    with sessions() as s:
        p4d_pk = s.execute(select(Instance.id).where(Instance.instance_id == "i-p4d")).scalar_one()
    details = {
        "what": "GPU 0 (NVIDIA A100-SXM4-40GB) idle for 2.0 h",
        "instance_name": "trainer",
        "instance_id": "i-p4d",
        "device": "GPU 0",
        "usd_so_far": 5.49,
        "usd_per_day": 65.87,
    }
    _incident(sessions, rule, "gpu:GPU-p0", instance_pk=p4d_pk, since=end - 3 * H, opened_at=end - H, details=details)
    ended = {"what": "i-g5 idle", "instance_id": "i-g5", "usd_so_far": 2.01}
    _incident(
        sessions, rule, "gpu:GPU-g5", since=end - 30 * H, opened_at=end - 29 * H, closed_at=end - H / 2, details=ended
    )
    # Not of the window: closed before it, opened after it; and another target's.
    _incident(sessions, rule, "gpu:old", since=end - 40 * H, opened_at=end - 39 * H, closed_at=end - 25 * H)
    _incident(sessions, rule, "gpu:late", since=end, opened_at=end + timedelta(minutes=1))
    _incident(sessions, other, "gpu:other", since=end - 3 * H, opened_at=end - H)

    with session_scope(sessions) as session:
        assert queue_digests(session, _settings(settings, end.hour), now=end + timedelta(minutes=5)) == 2
    p = _payload_to(sessions, "webhook", HOOK)
    assert p["kind"] == "digest" and p["date"] == end.date().isoformat() and p["rules"] == ["idle"]
    assert (p["start"], p["end"]) == (f"{end - 24 * H:%Y-%m-%dT%H:%M:%SZ}", f"{end:%Y-%m-%dT%H:%M:%SZ}")
    assert p["cost_usd"] == pytest.approx(6 * P4D_PER_GPU_HOUR + 2 * G5_PER_GPU_HOUR, abs=0.01)
    assert p["waste_usd"] == pytest.approx(3 * P4D_PER_GPU_HOUR + 2 * G5_PER_GPU_HOUR, abs=0.01)
    first, second = p["top_waste"]
    assert first == {
        "instance_id": "i-p4d",
        "instance_name": "trainer",
        "instance_type": "p4d.24xlarge",
        "gpus": 2,
        "cost_usd": pytest.approx(6 * P4D_PER_GPU_HOUR, abs=0.01),
        "waste_usd": pytest.approx(3 * P4D_PER_GPU_HOUR, abs=0.01),
        "idle_share": pytest.approx(0.5, abs=0.001),
        "users": [],
    }
    assert (second["instance_id"], second["instance_type"], second["gpus"]) == ("i-g5", "g5.xlarge", 1)
    assert second["waste_usd"] == pytest.approx(2 * G5_PER_GPU_HOUR, abs=0.01)
    assert second["idle_share"] == pytest.approx(1.0)
    assert (p["opened_count"], p["closed_count"]) == (1, 1)
    (opened,) = p["opened"]
    assert (opened["rule"], opened["condition"], opened["subject"]) == ("idle", "gpu_idle", "gpu:GPU-p0")
    assert opened["what"] == details["what"]
    assert opened["where"] == "GPU 0 of trainer (i-p4d)" and opened["closed_at"] is None
    assert (opened["usd_so_far"], opened["usd_per_day"]) == (5.49, 65.87)
    (closed,) = p["closed"]
    assert closed["subject"] == "gpu:GPU-g5" and closed["usd_so_far"] == 2.01
    assert closed["closed_at"] == f"{end - H / 2:%Y-%m-%dT%H:%M:%SZ}"
    assert p["url"].startswith(f"{PUBLIC}/waste?group_by=instance&start=")

    # The same content for Slack: the dollars, the instances, the incidents and the link.
    slack = _payload_to(sessions, "slack", SLACK)
    assert slack["text"].startswith(f"gpufleet daily digest {end.date().isoformat()}: $")
    shown = json.dumps(slack["blocks"])
    assert "gpu:other" not in json.dumps(_payload_to(sessions, "webhook", HOOK))
    assert "Opened (1)" in shown and "Closed (0)" in shown  # the other rule's incident opened; none closed


def test_email_digest_has_a_subject_and_the_figures(
    sessions: sessionmaker[Session], settings: Settings, feeder: Feeder
) -> None:
    end = _story(feeder)
    rule = _rule(sessions, "idle", _email("ml@example.com"))
    details = {"what": "GPU 0 idle for 2.0 h", "instance_name": "trainer", "instance_id": "i-p4d", "usd_so_far": 5.49}
    _incident(
        sessions, rule, "gpu:GPU-p0", since=end - 3 * H, opened_at=end - H, details=details | {"usd_per_day": 65.87}
    )
    _incident(
        sessions, rule, "gpu:GPU-g5", since=end - 30 * H, opened_at=end - 29 * H, closed_at=end - H, details=details
    )
    with session_scope(sessions) as s:
        queue_digests(s, _settings(settings, end.hour), now=end)
    p = _payload_to(sessions, "email", "ml@example.com")
    since = f"{end - 3 * H:%Y-%m-%d %H:%M}"
    assert (
        f"Opened (1):\n- GPU 0 idle for 2.0 h on trainer (i-p4d), since {since} UTC ($5.49 so far, $65.87/day) [idle]"
        in p["text"]
    )
    closed = f"since {end - 30 * H:%Y-%m-%d %H:%M} to {end - H:%Y-%m-%d %H:%M} UTC ($5.49 in all) [idle]"
    assert f"Closed (1):\n- GPU 0 idle for 2.0 h on trainer (i-p4d), {closed}" in p["text"]
    waste = 3 * P4D_PER_GPU_HOUR + 2 * G5_PER_GPU_HOUR
    assert p["subject"] == f"gpufleet daily digest {end.date().isoformat()}: ${waste:,.2f} wasted"
    assert f"trainer (i-p4d, p4d.24xlarge, 2 GPUs): ${3 * P4D_PER_GPU_HOUR:,.2f} wasted, 50% idle" in p["text"]
    assert f"ip-10-0-0-1 (i-g5, g5.xlarge, 1 GPU): ${2 * G5_PER_GPU_HOUR:,.2f} wasted, 100% idle" in p["text"]
    assert f"Dashboard: {PUBLIC}/waste?" in p["text"]


def test_top_waste_lists_the_five_that_wasted_most(
    sessions: sessionmaker[Session], settings: Settings, feeder: Feeder
) -> None:
    end = feeder.t0 + 2 * H
    for n in range(1, 8):  # n tenths of two hours idle
        feeder.feed(
            [gpu(0)], start=feeder.t0, hours=n * 0.2, step_s=720.0, instance_id=f"i-{n}", instance_type="g5.xlarge"
        )
    _rule(sessions, "idle", _hook())
    with session_scope(sessions) as s:
        queue_digests(s, _settings(settings, end.hour), now=end)
    p = _payload_to(sessions, "webhook", HOOK)
    assert [r["instance_id"] for r in p["top_waste"]] == ["i-7", "i-6", "i-5", "i-4", "i-3"]
    assert p["waste_usd"] == pytest.approx(sum(range(1, 8)) * 0.2 * G5_PER_GPU_HOUR, abs=0.01)


def test_each_target_sees_the_union_of_its_rules_scopes(
    sessions: sessionmaker[Session], settings: Settings, feeder: Feeder
) -> None:
    end = _story(feeder)
    _rule(sessions, "research", _hook(f"{HOOK}/research"), Scope(tags=(("team", "research"),)))
    _rule(sessions, "g5", _hook(f"{HOOK}/g5"), Scope(instance_types=("g5.xlarge",)))
    _rule(sessions, "both-a", _hook(f"{HOOK}/both"), Scope(tags=(("team", "research"),)))
    _rule(sessions, "both-b", _hook(f"{HOOK}/both"), Scope(tags=(("team", "infra"),)))
    _rule(sessions, "none", _hook(f"{HOOK}/none"), Scope(regions=("eu-west-1",)))
    with session_scope(sessions) as s:
        assert queue_digests(s, _settings(settings, end.hour), now=end) == 4

    def seen(path: str, waste: float) -> list[str]:
        p = _payload_to(sessions, "webhook", f"{HOOK}/{path}")
        assert p["waste_usd"] == pytest.approx(waste, abs=0.01)
        return [r["instance_id"] for r in p["top_waste"]]

    assert seen("research", 3 * P4D_PER_GPU_HOUR) == ["i-p4d"]
    assert seen("g5", 2 * G5_PER_GPU_HOUR) == ["i-g5"]
    assert seen("both", 3 * P4D_PER_GPU_HOUR + 2 * G5_PER_GPU_HOUR) == ["i-p4d", "i-g5"]
    assert seen("none", 0.0) == []
    # One scope: the link carries its filters.
    assert "tag=team%3Aresearch" in _payload_to(sessions, "webhook", f"{HOOK}/research")["url"]


def test_a_scope_of_users_counts_what_they_held(
    sessions: sessionmaker[Session], settings: Settings, feeder: Feeder
) -> None:
    story = holders_story(feeder)  # ana holds GPU 0 of i-p4d idle for its first hour; its GPU 1 idles, unheld
    end = story["end"]
    _rule(sessions, "ana", _hook(f"{HOOK}/ana"), Scope(users=("ana",)))
    _rule(sessions, "all", _hook(f"{HOOK}/all"))
    with session_scope(sessions) as s:
        assert queue_digests(s, _settings(settings, end.hour), now=end) == 2
    ana = _payload_to(sessions, "webhook", f"{HOOK}/ana")
    (row,) = ana["top_waste"]
    assert (row["instance_id"], row["users"]) == ("i-p4d", ["ana"])
    assert row["waste_usd"] == pytest.approx(P4D_PER_GPU_HOUR, abs=0.01)
    assert ana["waste_usd"] == pytest.approx(P4D_PER_GPU_HOUR, abs=0.01)
    whole = _payload_to(sessions, "webhook", f"{HOOK}/all")
    assert whole["waste_usd"] == pytest.approx(3 * P4D_PER_GPU_HOUR, abs=0.01)


def test_one_analysis_serves_every_target(engine: Engine, settings: Settings, feeder: Feeder) -> None:
    sessions = make_sessionmaker(engine)
    end = _story(feeder)
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    def queued(day_offset: int) -> int:
        statements.clear()
        event.listen(engine, "before_cursor_execute", count)
        try:
            with session_scope(sessions) as s:
                queue_digests(s, _settings(settings, end.hour), now=end + day_offset * 24 * H)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        return len(statements)

    _rule(sessions, "one", _hook(f"{HOOK}/0"), Scope(tags=(("team", "research"),)))
    alone = queued(0)
    for i in range(1, 8):
        _rule(sessions, f"r{i}", _hook(f"{HOOK}/{i}"), Scope(regions=(f"region-{i}",)))
    many = queued(1)
    assert many - alone == 7  # one INSERT more per target; the reads are the same
    with sessions() as s:
        assert s.execute(select(func.count()).select_from(alert_outbox)).scalar_one() == 9


# Sent -------------------------------------------------------------------------------------------------------------


def test_a_digest_arrives_with_its_message_id(
    sessions: sessionmaker[Session], settings: Settings, receiver: HttpReceiver, smtp_plain: tuple[int, Inbox]
) -> None:
    port, inbox = smtp_plain
    s8 = _settings(settings, smtp_host="127.0.0.1", smtp_port=port, smtp_starttls="off")
    _rule(sessions, "hook", _hook(receiver.url("/hook")))
    _rule(sessions, "slack", _slack(receiver.url("/slack")))
    _rule(sessions, "mail", _email("ml@example.com"))
    assert _queue(sessions, s8, DAY_NOW) == 3
    report = send_due(sessions, s8, now=DAY_NOW)
    assert report.delivered == 3
    day = DAY_NOW.date()
    hook_id = str(_digest_id("webhook", receiver.url("/hook"), day))
    assert receiver.delivered_ids("/hook") == [hook_id]
    (request,) = receiver.requests("/hook")
    body = json.loads(request.body)
    assert body["kind"] == "digest" and body["message_id"] == hook_id and body["waste_usd"] == 0
    (slack,) = receiver.requests("/slack")
    slack_id = str(_digest_id("slack", receiver.url("/slack"), day))
    assert slack_id in json.loads(slack.body)["blocks"][-1]["elements"][0]["text"]
    (mail,) = inbox.mails
    assert mail.message["X-Gpufleet-Message-Id"] == str(_digest_id("email", "ml@example.com", day))
    assert mail.message["Subject"] == f"gpufleet daily digest {day.isoformat()}: $0.00 wasted"
    # Sent: queuing again that day sends nothing more.
    assert _queue(sessions, s8, DAY_NOW + H) == 0
    assert send_due(sessions, s8, now=DAY_NOW + H).claimed == 0


def test_the_digest_job_queues_and_outlives_a_database_outage(
    engine: Engine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    sessions = make_sessionmaker(engine)
    _rule(sessions, "a", _hook())
    now_hour = _settings(settings, 0)  # due all day
    run_beside_outage(
        lambda e: digest_job(e, now_hour, check_s=0.05), engine, lambda: bool(_digests(sessions)), caplog, timeout_s=20
    )
    (row,) = _digests(sessions)
    assert row.message_id == _digest_id("webhook", HOOK, datetime.now(UTC).date())
    failures = [r for r in caplog.records if "alert digests failed" in r.getMessage()]
    assert len(failures) == 1 and "database" in failures[0].getMessage()
