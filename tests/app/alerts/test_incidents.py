"""Incidents against the real database: one opens per finding with one message per target, no repeat while it
stays open but a reminder every `remind_s` (not while snoozed), a closed message when it ends, the quiet period,
the stop planned and cancelled, all in the caller's transaction, and processes applying at once queue each
message once."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import snooze
from app.alerts.findings import Finding
from app.alerts.incidents import TURNED_OFF, Applied, apply, retire
from app.alerts.rules import Route, Rule, Stop, create_rule
from app.alerts.rules import Target as Fixed
from app.alerts.tables import alert_actions, alert_incidents, alert_outbox
from app.db import session_scope
from app.settings import Settings

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
HOOK = "https://hooks.example.com/gpufleet"
SECRET = "a-long-shared-secret-0123"
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)


@pytest.fixture
def alert_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "public_url": "https://gpufleet.example.com",
            "alerts_signing_key": "test-signing-key-0123456789abcdefghij",
            "user_emails": {"asmith": "ada@example.com"},
        }
    )


def _finding(usd: float = 3.0, subject: str = "gpu:GPU-1", **kw: Any) -> Finding:
    base: dict[str, Any] = {
        "subject": subject,
        "since": T0 - 3 * HOUR,
        "what": "GPU 0 (NVIDIA A10G) idle for 3.0 h",
        "instance_pk": 7,
        "instance_id": "i-0abc1234",
        "instance_name": "train-3",
        "device_id": 11,
        "device": "GPU 0 (NVIDIA A10G)",
        "usd_so_far": usd,
        "usd_per_day": 24.14,
        "holders": ("asmith",),
        "lifecycle": "on-demand",
        "page": "/instances/i-0abc1234",
    }
    return Finding(**{**base, **kw})


def _rule(sessions: sessionmaker[Session], route: Route | None = None, **kw: Any) -> Rule:
    rule = Rule(
        name=kw.pop("name", "forgotten-gpus"),
        condition="gpu_idle",
        for_hours=1,
        route=route or Route(Fixed("webhook", url=HOOK, secret=SECRET)),
        **kw,
    )
    with session_scope(sessions) as s:
        return create_rule(s, rule, by="test", now=T0)


def _apply(
    sessions: sessionmaker[Session], settings: Settings, rule: Rule, findings: Sequence[Finding], now: datetime
) -> Applied:
    with session_scope(sessions) as s:
        return apply(s, settings, rule, findings, now=now)


def _incidents(sessions: sessionmaker[Session]) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_incidents).order_by(alert_incidents.c.id)))


def _outbox(sessions: sessionmaker[Session]) -> list[Any]:
    with sessions() as s:
        return list(s.execute(select(alert_outbox).order_by(alert_outbox.c.id)))


def test_a_finding_opens_one_incident_and_queues_its_message(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions)
    applied = _apply(sessions, alert_settings, rule, [_finding()], T0)
    (inc,) = _incidents(sessions)
    assert applied.opened == [inc.id] and applied.queued == 1
    assert (inc.rule_id, inc.subject, inc.since, inc.opened_at, inc.closed_at) == (
        rule.id,
        "gpu:GPU-1",
        T0 - 3 * HOUR,
        T0,
        None,
    )
    assert (inc.instance_pk, inc.device_id) == (7, 11)
    assert inc.details["usd_so_far"] == 3.0 and inc.details["instance_id"] == "i-0abc1234"
    (told,) = inc.details["told"]
    assert (told["channel"], told["via"], inc.details["not_told"]) == ("webhook", "route", None)
    assert told["to"].startswith("https://hooks.example.com/... #")  # never the URL's path
    (msg,) = _outbox(sessions)
    assert (msg.incident_id, msg.kind, msg.channel, msg.target, msg.secret) == (
        inc.id,
        "open",
        "webhook",
        HOOK,
        SECRET,
    )
    body = msg.payload
    assert body["incident_id"] == inc.id and body["instance"] == {"id": "i-0abc1234", "name": "train-3"}
    assert body["usd_so_far"] == 3.0 and body["holders"] == ["asmith"]
    assert body["dashboard_url"] == "https://gpufleet.example.com/instances/i-0abc1234"
    token = body["snooze_url"].removeprefix("https://gpufleet.example.com/alerts/snooze/")
    key = alert_settings.alerts_signing_key.encode()  # type: ignore[union-attr]
    assert snooze.verify(key, token, now=T0).incident_id == inc.id


def test_no_repeat_while_it_stays_open_but_its_figures_follow(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions)
    _apply(sessions, alert_settings, rule, [_finding(3.0)], T0)
    for i in range(1, 4):
        again = _apply(sessions, alert_settings, rule, [_finding(3.0 + i)], T0 + i * MIN)
        assert again.opened == [] and again.queued == 0 and again.updated == 1
    (inc,) = _incidents(sessions)
    assert inc.details["usd_so_far"] == 6.0 and inc.opened_at == T0
    assert inc.details["figures_at"] == (T0 + 3 * MIN).timestamp()
    assert len(_outbox(sessions)) == 1


def test_each_round_keeps_the_figures_of_the_fifth_of_incidents_whose_figures_are_oldest(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions)
    subjects = [f"gpu:GPU-{n}" for n in range(10)]
    _apply(sessions, alert_settings, rule, [replace(_finding(1.0), subject=s) for s in subjects], T0)
    for i in range(1, 6):
        again = _apply(
            sessions, alert_settings, rule, [replace(_finding(1.0 + i), subject=s) for s in subjects], T0 + i * MIN
        )
        assert again.updated == 2
    # Five rounds: every incident's figures kept once, each from a different round.
    kept = sorted((inc.details["usd_so_far"], inc.details["figures_at"]) for inc in _incidents(sessions))
    assert [usd for usd, _at in kept] == [2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0]


def test_a_reminder_every_remind_s_while_open(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    rule = _rule(sessions, remind_s=3600)
    _apply(sessions, alert_settings, rule, [_finding()], T0)
    assert _apply(sessions, alert_settings, rule, [_finding()], T0 + 59 * MIN).reminded == []
    first = _apply(sessions, alert_settings, rule, [_finding(4.0)], T0 + HOUR)
    assert len(first.reminded) == 1 and first.queued == 1
    assert _apply(sessions, alert_settings, rule, [_finding()], T0 + HOUR + MIN).reminded == []
    assert len(_apply(sessions, alert_settings, rule, [_finding()], T0 + 2 * HOUR).reminded) == 1
    rows = _outbox(sessions)
    assert [r.kind for r in rows] == ["open", "reminder", "reminder"]
    assert len({r.message_id for r in rows}) == 3
    assert [r.payload["reminder"] for r in rows[1:]] == [1, 2]
    assert rows[1].payload["text"].startswith("Still open: GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3")
    assert rows[1].payload["usd_so_far"] == 4.0 and rows[1].payload["since"] == "2026-11-24T09:00:00Z"
    (inc,) = _incidents(sessions)
    assert inc.reminded_at == T0 + 2 * HOUR and inc.details["reminders"] == 2


def test_no_reminder_while_snoozed(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    rule = _rule(sessions, remind_s=3600)
    (incident_id,) = _apply(sessions, alert_settings, rule, [_finding()], T0).opened
    with session_scope(sessions) as s:
        snooze.snooze_incident(s, incident_id, until=T0 + 3 * HOUR, reason="training resumes", by="ada", now=T0 + MIN)
    for at in (T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR - MIN):
        assert _apply(sessions, alert_settings, rule, [_finding()], at).reminded == []
    assert len(_apply(sessions, alert_settings, rule, [_finding()], T0 + 3 * HOUR).reminded) == 1
    assert [r.kind for r in _outbox(sessions)] == ["open", "reminder"]


def test_it_closes_when_the_finding_is_gone_with_one_closed_message(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions)
    (incident_id,) = _apply(sessions, alert_settings, rule, [_finding(), _finding(subject="gpu:GPU-2")], T0).opened[:1]
    closed = _apply(sessions, alert_settings, rule, [_finding(subject="gpu:GPU-2")], T0 + 2 * HOUR)
    assert closed.closed == [incident_id] and closed.queued == 1
    assert _apply(sessions, alert_settings, rule, [_finding(subject="gpu:GPU-2")], T0 + 3 * HOUR).queued == 0
    first, second = _incidents(sessions)
    assert first.closed_at == T0 + 2 * HOUR and first.details["closed_reason"] == "the condition no longer holds"
    assert second.closed_at is None
    rows = [r for r in _outbox(sessions) if r.incident_id == incident_id]
    assert [r.kind for r in rows] == ["open", "closed"]
    body = rows[1].payload
    assert body["reason"] == "the condition no longer holds" and body["snooze_url"] is None
    assert body["text"].startswith(
        "Over after 5.0 h: GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc1234): $3.00"
    )


def test_the_quiet_period_holds_back_a_new_incident(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    quiet = _rule(sessions, quiet_s=3600)
    loud = _rule(sessions, name="loud")
    for rule in (quiet, loud):
        _apply(sessions, alert_settings, rule, [_finding()], T0)
        _apply(sessions, alert_settings, rule, [], T0 + HOUR)
    held = _apply(sessions, alert_settings, quiet, [_finding()], T0 + HOUR + 30 * MIN)
    assert held.opened == [] and held.quiet == ["gpu:GPU-1"] and held.queued == 0
    assert len(_apply(sessions, alert_settings, loud, [_finding()], T0 + HOUR + 30 * MIN).opened) == 1
    assert _apply(sessions, alert_settings, quiet, [_finding()], T0 + 2 * HOUR - MIN).opened == []
    after = _apply(sessions, alert_settings, quiet, [_finding()], T0 + 2 * HOUR + MIN)
    assert len(after.opened) == 1 and after.queued == 1
    kinds = [(r.incident_id, r.kind) for r in _outbox(sessions)]
    assert sum(k == "open" for _, k in kinds) == 4 and len({i for i, _ in kinds}) == 4


def test_a_rollback_leaves_no_incident_and_no_message(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions, stop=Stop(dry_run=False, grace_s=3600))
    with sessions() as s:
        applied = apply(s, alert_settings, rule, [_finding()], now=T0)
        assert len(applied.opened) == 1 and applied.queued == 1
        s.rollback()
    assert _incidents(sessions) == [] and _outbox(sessions) == []
    with sessions() as s:
        assert s.execute(select(alert_actions)).first() is None


def test_processes_applying_at_once_open_and_remind_once(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions, remind_s=3600)

    def race(now: datetime) -> list[Applied]:
        barrier = threading.Barrier(4)
        results: list[Applied] = []

        def one() -> None:
            barrier.wait()
            results.append(_apply(sessions, alert_settings, rule, [_finding()], now))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 4
        return results

    opened = race(T0)
    assert sum(len(a.opened) for a in opened) == 1 and sum(a.queued for a in opened) == 1
    reminded = race(T0 + HOUR)
    assert sum(len(a.reminded) for a in reminded) == 1 and sum(a.queued for a in reminded) == 1
    assert len(_incidents(sessions)) == 1
    assert [r.kind for r in _outbox(sessions)] == ["open", "reminder"]


def test_owner_routing_sends_to_the_owner_and_records_when_no_one_was_told(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions, route=Route(None, owner=True))
    owner_tag = _finding(subject="gpu:GPU-a", tags={"Owner": "grace@example.com"})
    holder = _finding(subject="gpu:GPU-b")
    nobody = _finding(subject="gpu:GPU-c", holders=("root",), tags={"team": "web"})
    applied = _apply(sessions, alert_settings, rule, [owner_tag, holder, nobody], T0)
    assert len(applied.opened) == 3 and applied.queued == 2
    by_subject = {i.subject: i for i in _incidents(sessions)}
    assert [(r.channel, r.target, r.incident_id) for r in _outbox(sessions)] == [
        ("email", "grace@example.com", by_subject["gpu:GPU-a"].id),
        ("email", "ada@example.com", by_subject["gpu:GPU-b"].id),
    ]
    assert by_subject["gpu:GPU-a"].details["told"] == [
        {"channel": "email", "to": "grace@example.com", "via": "owner tag Owner"}
    ]
    untold = by_subject["gpu:GPU-c"]
    assert applied.untold == [untold.id] and untold.details["told"] == []
    assert untold.details["not_told"].startswith("no one was told:") and "team=web" in untold.details["not_told"]
    mail = _outbox(sessions)[0].payload
    assert mail["subject"] == "[gpufleet] GPU 0 (NVIDIA A10G) idle for 3.0 h on train-3 (i-0abc1234)"
    assert "Held by: asmith" in mail["text"] and "$3.00 so far, $24.14 a day" in mail["text"]


def test_a_stop_is_planned_on_open_named_in_the_message_and_cancelled_on_close(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    rule = _rule(sessions, stop=Stop(dry_run=False, grace_s=3600))
    (incident_id,) = _apply(sessions, alert_settings, rule, [_finding()], T0).opened
    with sessions() as s:
        action = s.execute(select(alert_actions)).one()
    assert (action.incident_id, action.status, action.due_at, action.instance_id) == (
        incident_id,
        "pending",
        T0 + HOUR,
        "i-0abc1234",
    )
    (msg,) = _outbox(sessions)
    assert msg.payload["stop"] == {"at": "2026-11-24T13:00:00Z", "dry_run": False}
    assert "stops at 13:00 UTC unless snoozed" in msg.payload["text"]
    assert _incidents(sessions)[0].details["stop_at"] == (T0 + HOUR).isoformat()
    _apply(sessions, alert_settings, rule, [], T0 + 30 * MIN)
    with sessions() as s:
        action = s.execute(select(alert_actions)).one()
    assert action.status == "cancelled" and action.by == "rule forgotten-gpus"
    assert "the condition no longer holds" in action.detail
    assert "stops at" not in _outbox(sessions)[1].payload["text"]


def test_retiring_a_rule_closes_its_incidents(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    rule = _rule(sessions)
    _apply(sessions, alert_settings, rule, [_finding(), _finding(subject="gpu:GPU-2")], T0)
    with session_scope(sessions) as s:
        retired = retire(s, alert_settings, rule, now=T0 + HOUR)
    assert len(retired.closed) == 2 and retired.queued == 2
    assert all(i.closed_at == T0 + HOUR and i.details["closed_reason"] == TURNED_OFF for i in _incidents(sessions))
    assert [r.payload["reason"] for r in _outbox(sessions) if r.kind == "closed"] == [TURNED_OFF, TURNED_OFF]
