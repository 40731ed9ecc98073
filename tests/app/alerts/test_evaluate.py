"""The evaluation of rules against the real database: every enabled rule in one transaction, one process at a time
(the others skip the round), a failing rule rolled back alone, the job that outlives a failing round, and, end to
end, an idle GPU fed through ingest that becomes one incident and one message naming the instance and dollars."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import evaluate as evaluate_module
from app.alerts.evaluate import Evaluation, Find, evaluate, evaluate_once, evaluation_job, server_finder
from app.alerts.findings import Finding
from app.alerts.rules import Route, Rule, Scope, create_rule, set_enabled
from app.alerts.rules import Target as Fixed
from app.alerts.tables import alert_incidents, alert_outbox
from app.analyse.fleet import DeviceRowsCache
from app.db import session_scope
from app.pricing import PriceConfig, TypePrice
from app.pricing.resolve import Pricer
from app.settings import Settings
from tests.factories import gpu
from tests.feeding import G5_PER_GPU_HOUR, Feeder, idle

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
HOOK = "https://hooks.example.com/gpufleet"
MIN = timedelta(minutes=1)


@pytest.fixture
def alert_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "public_url": "https://gpufleet.example.com",
            "alerts_signing_key": "test-signing-key-0123456789abcdefghij",
        }
    )


def _finding(subject: str = "gpu:GPU-1", **kw: Any) -> Finding:
    base: dict[str, Any] = {
        "subject": subject,
        "since": T0 - timedelta(hours=3),
        "what": "GPU 0 (NVIDIA A10G) idle for 3.0 h",
        "instance_id": "i-0abc1234",
        "instance_name": "train-3",
        "usd_so_far": 3.0,
        "usd_per_day": 24.0,
    }
    return Finding(**{**base, **kw})


def _rule(sessions: sessionmaker[Session], name: str, **kw: Any) -> Rule:
    rule = Rule(name=name, condition="gpu_idle", for_hours=1, route=Route(Fixed("webhook", url=HOOK, secret="s" * 20)))
    with session_scope(sessions) as s:
        return create_rule(s, Rule(**{**rule.__dict__, **kw}), by="test", now=T0)


def _finder(found: dict[str, Sequence[Finding]]) -> Any:
    """What each rule (by name) finds; a rule not named finds nothing."""

    def load(_session: Session, _settings: Settings, _now: datetime) -> Find:
        return lambda rule: found.get(rule.name, [])

    return load


def _rows(sessions: sessionmaker[Session]) -> tuple[list[Any], list[Any]]:
    with sessions() as s:
        incidents = list(s.execute(select(alert_incidents).order_by(alert_incidents.c.id)))
        outbox = list(s.execute(select(alert_outbox).order_by(alert_outbox.c.id)))
    return incidents, outbox


def test_every_enabled_rule_is_evaluated_and_a_turned_off_one_closes_its_incidents(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    a, b = _rule(sessions, "a"), _rule(sessions, "b")
    _rule(sessions, "off", enabled=False)
    finder = _finder({"a": [_finding()], "b": [_finding(), _finding("gpu:GPU-2")], "off": [_finding()]})
    with session_scope(sessions) as s:
        result = evaluate(s, alert_settings, now=T0, finder=finder)
    assert (result.skipped, result.rules, result.opened, result.queued, result.errors) == (False, 2, 3, 3, {})
    incidents, _ = _rows(sessions)
    assert sorted((i.rule_id, i.subject) for i in incidents) == [
        (a.id, "gpu:GPU-1"),
        (b.id, "gpu:GPU-1"),
        (b.id, "gpu:GPU-2"),
    ]
    with session_scope(sessions) as s:
        set_enabled(s, "b", False, by="test", now=T0)
    with session_scope(sessions) as s:
        later = evaluate(s, alert_settings, now=T0 + MIN, finder=finder)
    assert (later.rules, later.opened, later.closed, later.queued) == (1, 0, 2, 2)
    incidents, outbox = _rows(sessions)
    assert [i.closed_at is None for i in incidents] == [True, False, False]
    assert [r.payload["reason"] for r in outbox if r.kind == "closed"] == ["the rule is turned off"] * 2


def test_a_second_process_skips_the_round_while_one_evaluates(
    sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    _rule(sessions, "a")
    finder = _finder({"a": [_finding()]})
    with sessions() as first:
        assert evaluate(first, alert_settings, now=T0, finder=finder).queued == 1
        with session_scope(sessions) as second:
            # Without the round's lock this one would wait on the first's incident: let it fail instead.
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            assert evaluate(second, alert_settings, now=T0, finder=finder) == Evaluation(skipped=True)
        first.commit()
    with session_scope(sessions) as again:
        result = evaluate(again, alert_settings, now=T0 + MIN, finder=finder)
    assert not result.skipped and result.queued == 0
    incidents, outbox = _rows(sessions)
    assert len(incidents) == 1 and len(outbox) == 1


def test_evaluations_at_once_queue_each_message_once(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    _rule(sessions, "a")
    _rule(sessions, "b")

    def slow(_session: Session, _settings: Settings, _now: datetime) -> Find:
        time.sleep(0.3)  # the others arrive while this one holds the round
        return lambda rule: [_finding(), _finding("gpu:GPU-2")]

    barrier = threading.Barrier(4)
    results: list[Evaluation] = []

    def one() -> None:
        barrier.wait()
        results.append(evaluate_once(sessions, alert_settings, finder=slow))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4 and sum(r.skipped for r in results) >= 1
    assert sum(r.queued for r in results) == 4
    incidents, outbox = _rows(sessions)
    assert len(incidents) == 4 and len(outbox) == 4 and len({r.message_id for r in outbox}) == 4


def test_a_failing_rule_is_rolled_back_alone(sessions: sessionmaker[Session], alert_settings: Settings) -> None:
    a = _rule(sessions, "a")
    bad = _rule(sessions, "bad")
    # The second finding cannot be stored (an incident needs its start): the first must not stay either.
    broken = _finding("gpu:GPU-9", since=None)
    with session_scope(sessions) as s:
        result = evaluate(
            s, alert_settings, now=T0, finder=_finder({"a": [_finding()], "bad": [_finding("gpu:GPU-8"), broken]})
        )
    assert list(result.errors) == ["bad"] and "IntegrityError" in result.errors["bad"]
    assert result.opened == 1 and result.queued == 1
    incidents, outbox = _rows(sessions)
    assert [(i.rule_id, i.subject) for i in incidents] == [(a.id, "gpu:GPU-1")] and bad.id != a.id
    assert [r.incident_id for r in outbox] == [incidents[0].id]


def test_the_job_outlives_a_failing_round_and_says_why(
    engine: Engine, sessions: sessionmaker[Session], alert_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    _rule(sessions, "a")
    calls: list[int] = []

    def flaky(_session: Session, _settings: Settings, _now: datetime) -> Find:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the analysis could not be read")
        return lambda rule: [_finding()]

    fast = alert_settings.model_copy(update={"alerts_check_s": 0.05})

    async def run() -> None:
        job = evaluation_job(engine, fast, finder=flaky)
        deadline = time.monotonic() + 10
        while not _rows(sessions)[1] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    with caplog.at_level(logging.INFO, logger="gpufleet.alerts"):
        asyncio.run(run())
    incidents, outbox = _rows(sessions)
    assert len(incidents) == 1 and len(outbox) == 1 and len(calls) > 2
    said = [r.getMessage() for r in caplog.records]
    assert said.count("alert evaluation: the round failed: RuntimeError: the analysis could not be read") == 1
    assert "alert evaluation: the round works again" in said


def _forgotten_g5(feeder: Feeder, **extra: Any) -> datetime:
    """A g5.xlarge's GPU idle for 3 hours from the feeder's start, fed through ingest; that start."""
    feeder.feed(
        [gpu(0, uid="GPU-g5", name="NVIDIA A10G")],
        start=feeder.t0,
        hours=3,
        fn=idle,
        instance_id="i-0f00000000000000d",
        instance_type="g5.xlarge",
        **extra,
    )
    return feeder.t0


def test_an_idle_gpu_fed_through_ingest_becomes_one_incident_and_one_message(
    feeder: Feeder, sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    start = _forgotten_g5(feeder, tags={"team": "ml", "Name": "forgotten-g5"})
    now = start + timedelta(hours=3)
    _rule(sessions, "forgotten-gpus", for_hours=2, scope=Scope(instance_types=("g5.xlarge",)))
    for minutes in (0, 1, 2):
        evaluate_once_at(sessions, alert_settings, now + minutes * MIN)
    incidents, outbox = _rows(sessions)
    assert [i.subject for i in incidents] == ["gpu:GPU-g5"] and incidents[0].since == start
    (msg,) = outbox
    body = msg.payload
    assert body["instance"] == {"id": "i-0f00000000000000d", "name": "forgotten-g5"}
    assert body["usd_so_far"] == pytest.approx(3 * G5_PER_GPU_HOUR, abs=0.01)
    assert body["usd_per_day"] == pytest.approx(24 * G5_PER_GPU_HOUR, abs=0.01)
    assert "forgotten-g5 (i-0f00000000000000d)" in body["text"] and "$3.02 so far" in body["text"]
    assert body["dashboard_url"] == "https://gpufleet.example.com/instances/i-0f00000000000000d"


def test_the_server_finder_prices_with_the_servers_pricer(
    feeder: Feeder, sessions: sessionmaker[Session], alert_settings: Settings
) -> None:
    start = _forgotten_g5(feeder)
    _rule(sessions, "forgotten-gpus", for_hours=2)
    # The server read its price file at start: $2 an hour for a g5.xlarge, where the catalog says about $1.
    pricer = Pricer(PriceConfig(instance_types={"g5.xlarge": TypePrice(usd_per_hour=2.0)}))
    with session_scope(sessions) as s:
        evaluate(s, alert_settings, now=start + timedelta(hours=3), finder=server_finder(pricer, DeviceRowsCache()))
    (msg,) = _rows(sessions)[1]
    assert msg.payload["usd_per_day"] == pytest.approx(48.0)


def evaluate_once_at(sessions: sessionmaker[Session], settings: Settings, now: datetime) -> Evaluation:
    with session_scope(sessions) as s:
        result = evaluate(s, settings, now=now)
    assert not result.skipped and result.errors == {}
    return result


def test_a_rule_that_keeps_failing_is_logged_once_and_once_more_when_it_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reasons = evaluate_module._Reasons()
    with caplog.at_level(logging.INFO, logger="gpufleet.alerts"):
        for _ in range(3):
            reasons.round(Evaluation(errors={"idle gpus": "ValueError: bad"}))
        reasons.round(Evaluation())
        reasons.round(Evaluation())
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "alert evaluation: rule 'idle gpus' failed: ValueError: bad",
        "alert evaluation: rule 'idle gpus' works again",
    ]
