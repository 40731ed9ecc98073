"""The stop action against the real database and a local EC2 API (moto's server mode, tests/aws_server.py) through
the real boto3 client: planned after the grace period or refused by a guard, cancelled by a snooze or a closed
incident, checked again with EC2 before the stop, recorded with EC2's answer, and taken once however many
processes run at once."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.responses.instances import InstanceResponse
from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.alerts.findings import Finding
from app.alerts.rules import Route, Rule, Stop, Target, create_rule
from app.alerts.stop import GIVE_UP_S, RETRY_S, action_job, cancel_pending, plan_stop, run_due
from app.alerts.tables import alert_actions, alert_incidents, alert_rules
from app.billing.spot import ClientFactory, ec2_clients
from app.db import make_engine, make_sessionmaker, session_scope
from app.models import Instance
from app.settings import Settings
from tests.app.alerts.jobs import run_beside_outage
from tests.aws_server import AwsServer

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
GRACE = timedelta(hours=1)
DUE = T0 + GRACE
REGION = "eu-west-1"  # not the environment's default region: the stop must go to the instance's own
IMAGE = "ami-0123456789abcdef0"  # any: the local EC2 does not check images


# --- the local EC2 ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StopCall:
    region: str
    instance_ids: tuple[str, ...]
    dry_run: bool
    fault: str | None


@dataclass
class Ec2:
    """The local EC2: launches instances, tells their state, and sees every StopInstances call it answers. The
    server's thread answers, the test reads and seeds faults."""

    server: AwsServer
    calls: list[StopCall] = field(default_factory=list)
    faults: deque[tuple[str, str]] = field(default_factory=deque)
    gate: threading.Event | None = None
    """Set: each StopInstances call waits for it before it is answered."""
    entered: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clients: dict[str, Any] = field(default_factory=dict)

    def client(self, region: str = REGION) -> Any:
        if region not in self.clients:
            self.clients[region] = boto3.client("ec2", region_name=region)
        return self.clients[region]

    def launch(self, region: str = REGION, *, spot: bool = False) -> str:
        client = self.client(region)
        extra: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        answer = client.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, InstanceType="g5.xlarge", **extra)
        return str(answer["Instances"][0]["InstanceId"])

    def state(self, instance_id: str, region: str = REGION) -> str:
        answer = self.client(region).describe_instances(InstanceIds=[instance_id])
        return str(answer["Reservations"][0]["Instances"][0]["State"]["Name"])

    def fail_next(self, code: str, message: str, n: int = 1) -> None:
        with self.lock:
            self.faults.extend([(code, message)] * n)

    def stops(self, *, dry_run: bool = False) -> list[StopCall]:
        """The StopInstances calls answered, real ones (or dry runs), faults included."""
        with self.lock:
            return [c for c in self.calls if c.dry_run == dry_run]

    def answer(self, handler: InstanceResponse) -> Any:
        with self.lock:
            fault = self.faults.popleft() if self.faults else None
            ids = tuple(handler._get_param("InstanceIds", []) or [])
            dry_run = bool(handler._get_param("DryRun", False))
            self.calls.append(StopCall(handler.region, ids, dry_run, fault[0] if fault else None))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(20)
        if fault is not None:
            raise EC2ClientError(*fault)
        return _moto_stop(handler)


_moto_stop = InstanceResponse.stop_instances


@pytest.fixture
def ec2(aws: AwsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2]:
    local = Ec2(aws)

    def stop_instances(self: InstanceResponse) -> Any:
        return local.answer(self)

    monkeypatch.setattr(InstanceResponse, "stop_instances", stop_instances)
    try:
        yield local
    finally:
        if local.gate is not None:
            local.gate.set()


def one_try() -> ClientFactory:
    """Clients that do not retry: one seeded fault fails one call."""
    return ec2_clients(attempts=1)


# --- the database -----------------------------------------------------------------------------------------------


def make_rule(sessions: sessionmaker[Session], stop: Stop | None = None, *, name: str = "idle-stop") -> Rule:
    rule = Rule(
        name=name,
        condition="gpu_idle",
        route=Route(Target("email", to=("ops@example.com",))),
        for_hours=2.0,
        stop=stop if stop is not None else Stop(dry_run=False, grace_s=int(GRACE.total_seconds())),
    )
    with session_scope(sessions) as s:
        return create_rule(s, rule, by="test", now=T0)


def add_instance(
    sessions: sessionmaker[Session],
    instance_id: str,
    *,
    region: str | None = REGION,
    zone: str | None = f"{REGION}a",
    lifecycle: str = "on-demand",
) -> None:
    with session_scope(sessions) as s:
        s.add(
            Instance(
                instance_id=instance_id,
                instance_type="g5.xlarge",
                region=region,
                availability_zone=zone,
                lifecycle=lifecycle,
                first_seen=T0 - timedelta(days=1),
                last_seen=T0,
            )
        )


def finding(instance_id: str | None, *, lifecycle: str = "on-demand", capacity_block: bool = False) -> Finding:
    return Finding(
        subject=f"gpu:GPU-{instance_id}",
        since=T0 - timedelta(hours=3),
        what="GPU 0 (NVIDIA A10G) idle for 3.0 h",
        instance_id=instance_id,
        instance_name=instance_id,
        lifecycle=lifecycle,
        capacity_block=capacity_block,
    )


def open_incident(sessions: sessionmaker[Session], rule: Rule, subject: str) -> int:
    with session_scope(sessions) as s:
        return int(
            s.execute(
                insert(alert_incidents)
                .values(rule_id=rule.id, subject=subject, since=T0 - timedelta(hours=3), opened_at=T0)
                .returning(alert_incidents.c.id)
            ).scalar_one()
        )


def plan(
    sessions: sessionmaker[Session], rule: Rule, found: Finding, *, now: datetime = T0
) -> tuple[int, datetime | None]:
    """Open an incident for `found` and plan its stop, as the evaluation does."""
    incident = open_incident(sessions, rule, found.subject)
    with session_scope(sessions) as s:
        return incident, plan_stop(s, rule, incident, found, now=now)


def planned_stop(sessions: sessionmaker[Session], ec2: Ec2, rule: Rule, **launch: Any) -> tuple[str, int]:
    """A running instance of the local EC2, known to the fleet, with a stop planned at T0 (due at DUE)."""
    instance_id = ec2.launch(**launch)
    add_instance(sessions, instance_id, region=launch.get("region", REGION))
    incident, due = plan(sessions, rule, finding(instance_id))
    assert due == DUE
    return instance_id, incident


def actions(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(alert_actions).order_by(alert_actions.c.id)).all())


def only_action(engine: Engine) -> Any:
    (row,) = actions(engine)
    return row


# --- planning ---------------------------------------------------------------------------------------------------


def test_plan_records_a_pending_stop_due_after_the_grace(engine: Engine, sessions: sessionmaker[Session]) -> None:
    rule = make_rule(sessions)
    incident, due = plan(sessions, rule, finding("i-0123456789abcdef0"))

    assert due == DUE
    row = only_action(engine)
    assert (row.rule_id, row.incident_id, row.instance_id, row.action) == (
        rule.id,
        incident,
        "i-0123456789abcdef0",
        "stop",
    )
    assert (row.status, row.dry_run, row.due_at, row.by, row.created_at, row.done_at) == (
        "pending",
        False,
        DUE,
        "idle-stop",
        T0,
        None,
    )


def test_plan_is_once_per_incident(engine: Engine, sessions: sessionmaker[Session]) -> None:
    rule = make_rule(sessions)
    found = finding("i-0123456789abcdef0")
    incident, first = plan(sessions, rule, found)
    # The evaluation retries, in the same transaction or a later one, maybe later in time: still one stop, as planned.
    with session_scope(sessions) as s:
        again = plan_stop(s, rule, incident, found, now=T0 + timedelta(minutes=5))
        assert plan_stop(s, rule, incident, found, now=T0 + timedelta(minutes=6)) == first
    assert again == first == DUE
    assert len(actions(engine)) == 1
    with session_scope(sessions) as s:
        cancel_pending(s, incident, by="ada", reason="snoozed")
        assert plan_stop(s, rule, incident, found, now=T0 + timedelta(minutes=7)) is None
    assert [r.status for r in actions(engine)] == ["cancelled"]


def test_a_rule_without_stop_plans_nothing(engine: Engine, sessions: sessionmaker[Session]) -> None:
    rule = Rule(name="notify-only", condition="gpu_idle", route=Route(Target("email", to=("a@example.com",))))
    with session_scope(sessions) as s:
        rule = create_rule(s, rule, by="test", now=T0)
    assert plan(sessions, rule, finding("i-0123456789abcdef0"))[1] is None
    assert actions(engine) == []


@pytest.mark.parametrize(
    ("found", "stop", "reason"),
    [
        (finding("i-0123456789abcdef0", lifecycle="spot"), Stop(spot=False), "a spot instance"),
        (finding("i-0123456789abcdef0", capacity_block=True), Stop(capacity_block=False), "Capacity Block"),
        (finding("gpu-host-7", lifecycle="on-prem"), Stop(), "on-premises host"),
        (finding(None), Stop(), "names no EC2 instance"),
        (finding("web-01"), Stop(), "names no EC2 instance"),
    ],
    ids=["spot", "capacity-block", "on-prem", "no-instance", "not-an-ec2-id"],
)
def test_plan_refuses_what_the_rule_does_not_allow(
    engine: Engine, sessions: sessionmaker[Session], found: Finding, stop: Stop, reason: str
) -> None:
    rule = make_rule(sessions, stop)
    incident, due = plan(sessions, rule, found)

    assert due is None
    row = only_action(engine)
    assert (row.status, row.incident_id, row.by, row.done_at) == ("cancelled", incident, "idle-stop", T0)
    assert reason in row.detail


@pytest.mark.parametrize(
    ("found", "stop"),
    [
        (finding("i-0123456789abcdef0", lifecycle="spot"), Stop(spot=True)),
        (finding("i-0123456789abcdef0", capacity_block=True), Stop(capacity_block=True)),
    ],
    ids=["spot", "capacity-block"],
)
def test_plan_stops_spot_and_capacity_block_when_the_rule_says_so(
    engine: Engine, sessions: sessionmaker[Session], found: Finding, stop: Stop
) -> None:
    rule = make_rule(sessions, stop)
    assert plan(sessions, rule, found)[1] == T0 + timedelta(seconds=stop.grace_s)
    assert only_action(engine).status == "pending"


def test_cancel_pending_cancels_the_incidents_pending_stop_only(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    rule = make_rule(sessions)
    incident, _ = plan(sessions, rule, finding("i-0123456789abcdef0"))
    other, _ = plan(sessions, rule, finding("i-0fedcba9876543210"))
    later = T0 + timedelta(minutes=10)
    with session_scope(sessions) as s:
        assert cancel_pending(s, incident, by="ada@example.com", reason="snoozed until tomorrow", now=later) == 1
    with session_scope(sessions) as s:
        assert cancel_pending(s, incident, by="someone else", reason="again", now=later) == 0

    mine, theirs = actions(engine)
    assert (mine.status, mine.by, mine.detail, mine.done_at) == (
        "cancelled",
        "ada@example.com",
        "snoozed until tomorrow",
        later,
    )
    assert (theirs.incident_id, theirs.status) == (other, "pending")


# --- taking due actions -----------------------------------------------------------------------------------------


def test_a_running_instance_is_stopped_in_its_region_after_the_grace(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions)
    instance_id, incident = planned_stop(sessions, ec2, rule)

    report = run_due(sessions, settings, now=DUE)

    assert [(a.instance_id, a.outcome.status) for a in report.acted] == [(instance_id, "done")]
    assert ec2.state(instance_id) == "stopped"
    assert ec2.stops() == [StopCall(REGION, (instance_id,), False, None)]
    row = only_action(engine)
    assert (row.status, row.done_at, row.by, row.rule_id, row.incident_id) == (
        "done",
        DUE,
        "idle-stop",
        rule.id,
        incident,
    )
    assert row.detail == f"EC2 StopInstances {instance_id} in {REGION}: running -> stopping"
    # Done once: later rounds leave it alone.
    assert run_due(sessions, settings, now=DUE + timedelta(hours=1)).acted == []
    assert len(ec2.stops()) == 1


def test_nothing_happens_before_the_stop_is_due(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions))

    assert run_due(sessions, settings, now=DUE - timedelta(seconds=1)).acted == []

    assert ec2.state(instance_id) == "running"
    assert ec2.calls == []
    assert (only_action(engine).status, only_action(engine).done_at) == ("pending", None)


def test_the_region_comes_from_the_zone_when_the_agent_reported_none(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions)
    instance_id = ec2.launch()
    add_instance(sessions, instance_id, region=None, zone=f"{REGION}b")
    plan(sessions, rule, finding(instance_id))
    lost = "i-0000000000000dead"
    add_instance(sessions, lost, region=None, zone=None)
    plan(sessions, rule, finding(lost))

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "stopped"
    stopped, unknown = actions(engine)
    assert stopped.status == "done"
    assert (unknown.status, unknown.detail) == (
        "failed",
        f"no region known for {lost}: its agent reported neither region nor zone",
    )


def test_a_dry_run_stops_nothing_and_records_what_it_would_do(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions, Stop(dry_run=True, grace_s=3600))
    instance_id, _ = planned_stop(sessions, ec2, rule)

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "running"
    assert ec2.stops() == []
    assert ec2.stops(dry_run=True) == [StopCall(REGION, (instance_id,), True, None)]
    row = only_action(engine)
    assert (row.status, row.dry_run, row.done_at) == ("dry-run", True, DUE)
    assert row.detail == f"would stop {instance_id} in {REGION} (running); EC2 allows it (DryRunOperation)"


def test_a_dry_run_says_when_the_real_stop_would_be_refused(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions, Stop(dry_run=True, grace_s=3600))
    instance_id, _ = planned_stop(sessions, ec2, rule)
    ec2.fail_next("UnauthorizedOperation", "You are not authorized to perform this operation.")

    run_due(sessions, settings, now=DUE, clients=one_try())

    assert ec2.state(instance_id) == "running"
    row = only_action(engine)
    assert row.status == "dry-run"
    assert row.detail == "would fail: UnauthorizedOperation: You are not authorized to perform this operation."


def test_a_stop_planned_as_a_dry_run_stays_one_when_the_rule_changes(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions, Stop(dry_run=True, grace_s=3600))
    instance_id, _ = planned_stop(sessions, ec2, rule)
    with session_scope(sessions) as s:
        s.execute(update(alert_rules).values(stop=Stop(dry_run=False, grace_s=3600).as_json()))

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "running"
    assert only_action(engine).status == "dry-run"


@pytest.mark.parametrize(
    ("lifecycle", "stop", "said"),
    [
        ("spot", Stop(dry_run=False, spot=False), "is a spot instance"),
        ("capacity-block", Stop(dry_run=False, capacity_block=False), "runs in a Capacity Block"),
    ],
)
def test_ec2s_word_on_spot_and_capacity_block_is_checked_before_the_stop(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2, lifecycle: str, stop: Stop, said: str
) -> None:
    rule = make_rule(sessions, stop)
    instance_id = ec2.launch(spot=lifecycle == "spot")
    if lifecycle == "capacity-block":  # moto launches none: the local server's own record says so
        ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(instance_id).lifecycle = "capacity-block"
    add_instance(sessions, instance_id)
    # The fleet's record says on-demand (an agent that reported no lifecycle, a stale one): EC2 knows better.
    plan(sessions, rule, finding(instance_id, lifecycle="on-demand"))

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "running"
    assert ec2.calls == []
    row = only_action(engine)
    assert row.status == "cancelled" and said in row.detail


def test_a_spot_instance_is_stopped_when_the_rule_allows_it(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    rule = make_rule(sessions, Stop(dry_run=False, grace_s=3600, spot=True))
    instance_id = ec2.launch(spot=True)
    add_instance(sessions, instance_id, lifecycle="spot")
    plan(sessions, rule, finding(instance_id, lifecycle="spot"))

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "stopped"
    assert only_action(engine).status == "done"


def _snooze(sessions: sessionmaker[Session], incident: int) -> None:
    with session_scope(sessions) as s:
        s.execute(update(alert_incidents).where(alert_incidents.c.id == incident).values(snoozed_until=DUE + GRACE))


def _close(sessions: sessionmaker[Session], incident: int) -> None:
    with session_scope(sessions) as s:
        s.execute(update(alert_incidents).where(alert_incidents.c.id == incident).values(closed_at=DUE - GRACE / 2))


def _delete_rule(sessions: sessionmaker[Session], incident: int) -> None:
    with session_scope(sessions) as s:
        s.execute(delete(alert_rules))


def _turn_off(sessions: sessionmaker[Session], incident: int) -> None:
    with session_scope(sessions) as s:
        s.execute(update(alert_rules).values(enabled=False))


def _drop_stop(sessions: sessionmaker[Session], incident: int) -> None:
    with session_scope(sessions) as s:
        s.execute(update(alert_rules).values(stop=None))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_snooze, "the incident is snoozed until 2026-11-20 14:00 UTC"),
        (_close, "the incident closed at 2026-11-20 12:30 UTC"),
        (_delete_rule, "its incident is gone (the rule was deleted)"),
        (_turn_off, "the rule is turned off"),
        (_drop_stop, "the rule no longer stops instances"),
    ],
    ids=["snoozed", "closed", "rule-deleted", "rule-off", "stop-removed"],
)
def test_the_stop_is_cancelled_when_the_incident_or_rule_no_longer_wants_it(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2, change: Any, reason: str
) -> None:
    instance_id, incident = planned_stop(sessions, ec2, make_rule(sessions))
    # Changed without cancel_pending (which the snooze and the evaluation call): the round itself checks.
    change(sessions, incident)

    run_due(sessions, settings, now=DUE)

    assert ec2.state(instance_id) == "running"
    assert ec2.calls == []
    row = only_action(engine)
    assert (row.status, row.detail, row.done_at) == ("cancelled", reason, DUE)


def test_a_cancelled_stop_is_not_taken(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, incident = planned_stop(sessions, ec2, make_rule(sessions))
    with session_scope(sessions) as s:
        cancel_pending(s, incident, by="ada", reason="snoozed", now=T0 + timedelta(minutes=1))

    assert run_due(sessions, settings, now=DUE).acted == []
    assert ec2.state(instance_id) == "running"
    assert ec2.calls == []


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("UnauthorizedOperation", "You are not authorized to perform this operation. Encoded authorization failure"),
        ("IncorrectInstanceState", "The instance is not in a state from which it can be stopped."),
    ],
)
def test_an_ec2_error_is_recorded_as_failed_and_the_round_goes_on(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2, code: str, message: str
) -> None:
    rule = make_rule(sessions)
    refused, _ = planned_stop(sessions, ec2, rule)
    fine, _ = planned_stop(sessions, ec2, rule)
    ec2.fail_next(code, message + " " + "x" * 400)

    report = run_due(sessions, settings, now=DUE, clients=one_try())

    assert [a.outcome.status for a in report.acted] == ["failed", "done"]
    failed, done = actions(engine)
    assert (failed.instance_id, failed.status, failed.done_at) == (refused, "failed", DUE)
    assert failed.detail.startswith(f"{code}: {message} xxx") and len(failed.detail) <= 300
    assert "\n" not in failed.detail
    assert ec2.state(refused) == "running"
    assert (done.instance_id, done.status) == (fine, "done")
    assert ec2.state(fine) == "stopped"
    # Failed is final: no second try at the next round.
    assert run_due(sessions, settings, now=DUE + timedelta(hours=1), clients=one_try()).acted == []


def test_an_instance_ec2_does_not_know_is_failed(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    gone = "i-0123456789abcdef0"
    add_instance(sessions, gone)
    plan(sessions, make_rule(sessions), finding(gone))

    run_due(sessions, settings, now=DUE, clients=one_try())

    row = only_action(engine)
    assert row.status == "failed" and row.detail.startswith("InvalidInstanceID.NotFound: ")
    assert ec2.calls == []


def test_throttling_asks_again_a_minute_later(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions))
    ec2.fail_next("RequestLimitExceeded", "Request limit exceeded.")

    report = run_due(sessions, settings, now=DUE, clients=one_try())

    assert [a.outcome.status for a in report.acted] == ["pending"]
    row = only_action(engine)
    assert (row.status, row.due_at, row.done_at) == ("pending", DUE + timedelta(seconds=RETRY_S), None)
    assert row.detail == "asking EC2 again at 13:01:00 UTC: RequestLimitExceeded: Request limit exceeded."
    assert ec2.state(instance_id) == "running"

    assert run_due(sessions, settings, now=DUE + timedelta(seconds=30), clients=one_try()).acted == []
    run_due(sessions, settings, now=DUE + timedelta(seconds=RETRY_S), clients=one_try())

    assert ec2.state(instance_id) == "stopped"
    assert only_action(engine).status == "done"
    assert [c.fault for c in ec2.stops()] == ["RequestLimitExceeded", None]


def test_a_stop_throttled_for_a_day_after_it_was_due_fails(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions))
    ec2.fail_next("RequestLimitExceeded", "Request limit exceeded.", n=2)
    last_retry = DUE + timedelta(seconds=GIVE_UP_S - RETRY_S)

    run_due(sessions, settings, now=last_retry, clients=one_try())
    assert only_action(engine).status == "pending"
    run_due(sessions, settings, now=last_retry + timedelta(seconds=RETRY_S), clients=one_try())

    row = only_action(engine)
    assert (row.status, row.done_at) == ("failed", last_retry + timedelta(seconds=RETRY_S))
    assert row.detail == "still not done 24 h after it was due: RequestLimitExceeded: Request limit exceeded."
    assert run_due(sessions, settings, now=last_retry + timedelta(hours=1), clients=one_try()).acted == []
    assert ec2.state(instance_id) == "running"


@pytest.mark.parametrize("dry_run", [False, True], ids=["stop", "dry-run"])
def test_missing_credentials_are_recorded_not_raised(
    engine: Engine,
    sessions: sessionmaker[Session],
    settings: Settings,
    ec2: Ec2,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    dry_run: bool,
) -> None:
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions, Stop(dry_run=dry_run, grace_s=3600)))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find here

    run_due(sessions, settings, now=DUE)

    row = only_action(engine)
    reason = "no AWS credentials found (environment, shared config, container or instance role)"
    assert (row.status, row.detail) == (("dry-run", f"would fail: {reason}") if dry_run else ("failed", reason))
    assert ec2.calls == []
    assert ec2.state(instance_id) == "running"


@pytest.mark.parametrize(("before", "status"), [("stop", "done"), ("terminate", "cancelled")])
def test_an_instance_stopped_or_gone_already_is_not_stopped_again(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2, before: str, status: str
) -> None:
    # Stopped by hand, or by a round that died before it recorded: the next round records it, sends nothing.
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions))
    client = ec2.client()
    client.stop_instances(InstanceIds=[instance_id]) if before == "stop" else client.terminate_instances(
        InstanceIds=[instance_id]
    )
    sent = len(ec2.calls)

    run_due(sessions, settings, now=DUE)

    assert len(ec2.calls) == sent
    row = only_action(engine)
    state = "stopped" if before == "stop" else "terminated"
    assert row.status == status
    assert row.detail.startswith(f"{instance_id} in {REGION} is {state}")


def test_two_rounds_at_once_stop_once_and_neither_waits_for_the_other(
    database_url: str, engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, _ = planned_stop(sessions, ec2, make_rule(sessions))
    ec2.gate = threading.Event()
    engines = [make_engine(database_url, pool_size=2) for _ in range(2)]
    reports: dict[str, Any] = {}

    def round_of(name: str, own: Engine) -> None:
        reports[name] = run_due(make_sessionmaker(own), settings, now=DUE)

    first = threading.Thread(target=round_of, args=("first", engines[0]))
    second = threading.Thread(target=round_of, args=("second", engines[1]))
    try:
        first.start()
        assert ec2.entered.wait(20), "the first round never reached StopInstances"
        # The first round holds the action while EC2 answers: the second skips it at once, it does not wait.
        second.start()
        second.join(10)
        assert not second.is_alive() and reports["second"].acted == []
    finally:
        ec2.gate.set()
        first.join(20)
        second.join(20)
        for e in engines:
            e.dispose()
    assert [a.outcome.status for a in reports["first"].acted] == ["done"]
    assert len(ec2.stops()) == 1
    assert ec2.state(instance_id) == "stopped"
    assert only_action(engine).status == "done"


def test_a_snooze_during_the_stop_waits_and_finds_nothing_left_to_cancel(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2
) -> None:
    instance_id, incident = planned_stop(sessions, ec2, make_rule(sessions))
    ec2.gate = threading.Event()
    acting = threading.Thread(target=run_due, args=(sessions, settings), kwargs={"now": DUE})
    acting.start()
    cancelled: list[int] = []
    try:
        assert ec2.entered.wait(20)
        snoozing = threading.Thread(
            target=lambda: cancelled.append(_cancel(sessions, incident)),
        )
        snoozing.start()
        time.sleep(0.3)
        assert cancelled == []  # it waits for the stop being sent
    finally:
        ec2.gate.set()
        acting.join(20)
    snoozing.join(20)
    assert cancelled == [0]
    assert ec2.state(instance_id) == "stopped"
    assert only_action(engine).status == "done"


def _cancel(sessions: sessionmaker[Session], incident: int) -> int:
    with session_scope(sessions) as s:
        return cancel_pending(s, incident, by="ada", reason="snoozed")


def test_the_action_job_stops_what_is_due_and_outlives_a_database_outage(
    engine: Engine, sessions: sessionmaker[Session], settings: Settings, ec2: Ec2, caplog: pytest.LogCaptureFixture
) -> None:
    rule = make_rule(sessions)
    instance_id = ec2.launch()
    add_instance(sessions, instance_id)
    plan(sessions, rule, finding(instance_id), now=datetime.now(UTC) - GRACE - timedelta(seconds=1))
    fast = settings.model_copy(update={"alerts_check_s": 0.05})
    run_beside_outage(lambda e: action_job(e, fast), engine, lambda: only_action(engine).status != "pending", caplog)
    assert only_action(engine).status == "done"
    assert ec2.state(instance_id) == "stopped"
    assert len(ec2.stops()) == 1
    said = [r.getMessage() for r in caplog.records]
    assert any(f"on {instance_id}: done: EC2 StopInstances" in m for m in said)
    assert len([m for m in said if "round failed" in m and "database" in m]) == 1
