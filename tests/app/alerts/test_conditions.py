"""What the instance and tag conditions find (app/alerts/findings.py): agent_offline, spot_interruption and
tag_waste, each when it holds, when it does not (yet), out of the rule's scope, and scoped to holders' users; and
the Capacity Block the stop action's guard reads from the bill."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.alerts.rules import Scope
from app.billing.prices import remake_billed_prices
from app.db import session_scope
from app.settings import Settings
from tests.app.alerts.test_findings import ana_holds, found, rule, subjects
from tests.app.analyse.test_priced import bill
from tests.factories import batch, gpu
from tests.feeding import ANA, BOB, P4D_PER_GPU_HOUR, Feeder, busy, idle

H = timedelta(hours=1)
P4D, SPOT, G5 = "i-0a00000000000000a", "i-0b00000000000000b", "i-0c00000000000000c"
P4D_PER_HOUR = 21.957642


# agent_offline ------------------------------------------------------------------------------------------------------


@pytest.fixture
def silent_fleet(feeder: Feeder) -> datetime:
    """A p4d whose GPU ana held reports for two hours from t0, then nothing; a g5 reports for three. Now: t0 + 3 h,
    the p4d silent for an hour."""
    t0 = feeder.t0
    feeder.feed([gpu(0, uid="GPU-p4d")], start=t0, hours=2, fn=ana_holds, holders=[ANA], instance_id=P4D)
    feeder.feed([gpu(0, uid="GPU-g5", name="NVIDIA A10G")], start=t0, hours=3, fn=busy(50), instance_id=G5,
                instance_type="g5.xlarge")  # fmt: skip
    return t0 + 3 * H


def test_agent_offline_holds_for_a_silent_instance(
    silent_fleet: datetime, feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    [[f]] = found(sessions, settings, silent_fleet, rule("agent_offline", for_hours=0.5))
    assert f.subject == f"instance:{P4D}"
    assert f.since == feeder.t0 + 2 * H
    assert f.what.startswith("agent silent for 1.0 h, last data ")
    assert f.device is None and f.device_id is None
    assert (f.instance_id, f.lifecycle, f.page) == (P4D, "on-demand", f"/instances/{P4D}")
    # What the whole instance costs if it still runs.
    assert f.usd_per_day == pytest.approx(24 * P4D_PER_HOUR)
    assert f.usd_so_far == pytest.approx(P4D_PER_HOUR)
    # Who held its GPUs as of its last data.
    assert f.holders == ("ana",)


def test_agent_offline_does_not_hold_before_its_for_nor_once_gone(
    silent_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    [early] = found(sessions, settings, silent_fleet, rule("agent_offline", for_hours=2))
    assert early == []
    # Silent for GPUFLEET_GONE_AFTER_H (24 h): taken as terminated, no longer offline.
    [gone] = found(sessions, settings, silent_fleet + 24 * H, rule("agent_offline", for_hours=2))
    assert gone == []
    # Silent for 23 h, the g5 for 22 h: both still offline.
    [late] = found(sessions, settings, silent_fleet + 22 * H, rule("agent_offline", for_hours=2))
    assert subjects(late) == [f"instance:{P4D}", f"instance:{G5}"]


def test_agent_offline_out_of_scope_and_by_users(
    silent_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    region, kind, ana, bob = found(
        sessions,
        settings,
        silent_fleet,
        rule("agent_offline", for_hours=0.5, scope=Scope(regions=("eu-west-1",))),
        rule("agent_offline", for_hours=0.5, scope=Scope(instance_types=("g5.xlarge",))),
        rule("agent_offline", for_hours=0.5, scope=Scope(users=("ana",))),
        rule("agent_offline", for_hours=0.5, scope=Scope(users=("bob",))),
    )
    assert region == kind == bob == []
    assert subjects(ana) == [f"instance:{P4D}"]


# spot_interruption --------------------------------------------------------------------------------------------------


def bob_holds(uid: str, t: datetime) -> dict[str, Any]:
    """60% busy, held by bob's pod (run by root)."""
    return {**(busy(60)(uid, t) or {}), "holders": [{"ref": 1, "used_mib": 18000}]}


def notice(feeder: Feeder, at: datetime) -> None:
    """The spot g5's agent reports an interruption notice seen at `at`, in a batch of one interval there."""
    b = batch([gpu(0, uid="GPU-spot", name="NVIDIA A10G")], start=at, intervals=1, duration_s=60,
              instance_id=SPOT, instance_type="g5.xlarge", lifecycle="spot")  # fmt: skip
    b["intervals"][0]["samples"] = [bob_holds("GPU-spot", at)]
    b["holders"] = [ANA, BOB]
    b["events"] = [
        {"ts": at.isoformat(), "kind": "spot_interruption", "details": {"action": "terminate", "time": "soon"}}
    ]
    r = feeder.client.post(
        "/api/v1/ingest",
        content=json.dumps(b).encode(),
        headers={"Authorization": f"Bearer {feeder.token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text


@pytest.fixture
def spot_fleet(feeder: Feeder) -> datetime:
    """A g5 spot instance that bob's pod keeps busy for two hours from t0; its notice comes at t0 + 1 h 50 min.
    Now: t0 + 2 h, the instance still reporting."""
    t0 = feeder.t0
    spot = gpu(0, uid="GPU-spot", name="NVIDIA A10G")
    feeder.feed([spot], start=t0, hours=2, fn=bob_holds, holders=[ANA, BOB], instance_id=SPOT,
                instance_type="g5.xlarge", lifecycle="spot")  # fmt: skip
    notice(feeder, t0 + H + timedelta(minutes=50))
    return t0 + 2 * H


def test_spot_interruption_holds_after_a_notice(
    spot_fleet: datetime, feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    [[f]] = found(sessions, settings, spot_fleet, rule("spot_interruption"))
    assert f.subject == f"instance:{SPOT}"
    assert f.since == feeder.t0 + H + timedelta(minutes=50)
    assert f.what == "spot interruption notice: terminate at soon"
    assert f.lifecycle == "spot" and f.holders == ("root",)
    assert f.extra["action"] == "terminate"
    assert f.usd_per_day is not None and f.usd_per_day > 0


def test_spot_interruption_does_not_hold_once_old_or_gone(
    spot_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    # Ten minutes after its last data a noticed instance is gone.
    [gone] = found(sessions, settings, spot_fleet + timedelta(minutes=10), rule("spot_interruption"))
    assert gone == []


def test_spot_interruption_only_for_an_hour(
    feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    t0 = feeder.t0
    spot = gpu(0, uid="GPU-spot", name="NVIDIA A10G")
    feeder.feed([spot], start=t0, hours=3, fn=bob_holds, holders=[ANA, BOB], instance_id=SPOT,
                instance_type="g5.xlarge", lifecycle="spot")  # fmt: skip
    notice(feeder, t0 + H)
    # The instance kept running: the notice holds for an hour after it was seen, then no more.
    within, after = (found(sessions, settings, t0 + n * H, rule("spot_interruption"))[0] for n in (1.9, 2.1))
    assert subjects(within) == [f"instance:{SPOT}"] and after == []


def test_spot_interruption_out_of_scope_and_by_users(
    spot_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    on_demand, ana, root = found(
        sessions,
        settings,
        spot_fleet,
        rule("spot_interruption", scope=Scope(lifecycles=("on-demand",))),
        rule("spot_interruption", scope=Scope(users=("ana",))),
        rule("spot_interruption", scope=Scope(users=("root",), lifecycles=("spot",))),
    )
    assert on_demand == ana == []
    assert subjects(root) == [f"instance:{SPOT}"]


# tag_waste ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def team_fleet(feeder: Feeder) -> datetime:
    """Four hours from t0: team research's p4d with one GPU idle (4 GPU-hours of idle cost) and one busy; team
    infra's g5 busy; an untagged p4d with one idle GPU in eu-west-1. Now: t0 + 4 h, on the hour."""
    t0 = feeder.t0
    feeder.feed([gpu(0, uid="GPU-r0"), gpu(1, uid="GPU-r1")], start=t0, hours=4,
                fn={"GPU-r0": idle, "GPU-r1": busy(90)}, instance_id=P4D)  # fmt: skip
    feeder.feed([gpu(0, uid="GPU-g5", name="NVIDIA A10G")], start=t0, hours=4, fn=busy(90), instance_id=G5,
                instance_type="g5.xlarge", tags={"team": "infra"})  # fmt: skip
    feeder.feed([gpu(0, uid="GPU-u")], start=t0, hours=4, fn=idle, instance_id="i-untagged", tags={},
                region="eu-west-1", availability_zone="eu-west-1a")  # fmt: skip
    return t0 + 4 * H


def test_tag_waste_holds_over_its_dollars_a_day(
    team_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    now = team_fleet
    [team] = found(sessions, settings, now, rule("tag_waste", tag_key="team", usd_per_day=10))
    assert subjects(team) == ["tag:team", "tag:team=research"]
    untagged, research = team
    waste = 4 * P4D_PER_GPU_HOUR  # $10.98 over the last 24 h
    assert research.usd_so_far == pytest.approx(waste)
    assert research.usd_per_day == pytest.approx(waste)  # 24 h exactly: now is on the hour
    assert research.since == now - 24 * H
    assert research.tags == {"team": "research"}
    assert research.page == "/waste?group_by=tag%3Ateam&window=24h&tag=team%3Aresearch"
    assert research.what == "team=research wasted $10.98 in the last 24.0 h: $10.98 a day, over $10.00"
    assert research.instance_id is None and research.holders == ()
    assert research.extra["instances"] == 1 and research.extra["threshold_usd_per_day"] == 10
    assert untagged.what.startswith("(no team tag) wasted $10.98") and untagged.tags == {}


def test_tag_waste_does_not_hold_under_its_dollars(
    team_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    [over] = found(sessions, settings, team_fleet, rule("tag_waste", tag_key="team", usd_per_day=11))
    assert over == []


def test_tag_waste_sums_only_the_instances_in_scope(
    team_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    us, gpu_type, users = found(
        sessions,
        settings,
        team_fleet,
        rule("tag_waste", tag_key="team", usd_per_day=10, scope=Scope(regions=("us-east-1",))),
        rule("tag_waste", tag_key="team", usd_per_day=10, scope=Scope(instance_types=("g5.xlarge",))),
        # A tag's waste is held by no one: in no scope that names users.
        rule("tag_waste", tag_key="team", usd_per_day=1, scope=Scope(users=("ana",))),
    )
    assert subjects(us) == ["tag:team=research"]
    assert gpu_type == users == []


# The Capacity Block guard -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "block"), [("capacity block", True), ("capacity reservation", False), (None, False)])
def test_capacity_block_from_the_bill(
    kind: str | None, block: bool, feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0, uid="GPU-p5")], start=t0, hours=3, fn=idle, instance_id=P4D)
    with session_scope(sessions) as s:
        bill(s, P4D, "p4d.24xlarge", {t0: 30.0, t0 + H: 30.0}, kind)
        remake_billed_prices(s)
    [[f]] = found(sessions, settings, t0 + 3 * H, rule("gpu_idle", for_hours=1))
    assert f.capacity_block is block
