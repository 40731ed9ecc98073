"""What the device conditions find (app/alerts/findings.py) on fleets fed through the real ingest route, read at an
explicit `now`: gpu_idle, slice_underused and mig_unpartitioned, each when it holds, before it has held for `for`,
out of the rule's scope, and scoped to the users holding the device; and what one snapshot shares between rules."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import snapshot as snapshot_module
from app.alerts.findings import Finding, find, load_snapshot
from app.alerts.rules import Route, Rule, Scope, Target
from app.settings import Settings
from tests.factories import gpu, mig_slice
from tests.feeding import ANA, P4D_PER_GPU_HOUR, Feeder, SampleFn, busy, held, idle, unknown

H = timedelta(hours=1)
SLACK = Route(Target("slack", "https://hooks.slack.com/services/T0/B0/x"))
P4D = "i-0a00000000000000a"


def rule(condition: str, *, scope: Scope | None = None, **kw: Any) -> Rule:
    return Rule(f"test {condition}", condition, SLACK, scope=scope or Scope(), **kw)


def found(sessions: sessionmaker[Session], settings: Settings, now: datetime, *rules: Rule) -> list[list[Finding]]:
    """What each rule finds, all from one snapshot."""
    with sessions() as session:
        snapshot = load_snapshot(session, settings, now=now)
        return [find(snapshot, r) for r in rules]


def subjects(findings: Iterable[Finding]) -> list[str]:
    return [f.subject for f in findings]


# gpu_idle -----------------------------------------------------------------------------------------------------------


def ana_holds(uid: str, t: datetime) -> dict[str, Any]:
    return {**held(uid, t), "holders": [{"ref": 0, "used_mib": 30000}]}


def busy_until(switch: datetime) -> Any:
    def fn(uid: str, t: datetime) -> dict[str, Any] | None:
        return busy(70)(uid, t) if t < switch else idle(uid, t)

    return fn


@pytest.fixture
def idle_fleet(feeder: Feeder) -> datetime:
    """A p4d for three hours from t0: GPU-held idle-held by ana's process all along, GPU-idle busy for its first
    hour then idle, GPU-busy busy. Now: the end of the three hours."""
    t0 = feeder.t0
    feeder.feed(
        [gpu(0, uid="GPU-held"), gpu(1, uid="GPU-idle"), gpu(2, uid="GPU-busy")],
        start=t0,
        hours=3,
        fn={"GPU-held": ana_holds, "GPU-idle": busy_until(t0 + H), "GPU-busy": busy(80)},
        holders=[ANA],
        instance_id=P4D,
        tags={"team": "research", "Name": "trainer"},
    )
    return t0 + 3 * H


def test_gpu_idle_holds_for_a_gpu_idle_for_its_for(
    idle_fleet: datetime, feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    now = idle_fleet
    [two_hours] = found(sessions, settings, now, rule("gpu_idle", for_hours=2))
    assert subjects(two_hours) == ["gpu:GPU-held", "gpu:GPU-idle"]
    f, g = two_hours
    assert f.since == feeder.t0
    assert f.what == "GPU 0 (NVIDIA A100-SXM4-40GB) idle-held for 3.0 h"
    assert f.device == "GPU 0 (NVIDIA A100-SXM4-40GB)" and f.device_id is not None
    assert f.usd_so_far == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert f.usd_per_day == pytest.approx(24 * P4D_PER_GPU_HOUR)
    assert f.holders == ("ana",)
    assert (f.instance_id, f.instance_name, f.lifecycle) == (P4D, "trainer", "on-demand")
    assert f.tags == {"team": "research", "Name": "trainer"}
    assert f.capacity_block is False
    assert f.page == f"/instances/{P4D}"
    assert f.extra["state"] == "idle-held"
    assert g.since == feeder.t0 + H and g.holders == () and g.extra["state"] == "idle"
    assert g.usd_so_far == pytest.approx(2 * P4D_PER_GPU_HOUR)


def test_gpu_idle_does_not_hold_before_its_for(
    idle_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    # Idle for two hours: not yet for a rule of 2.5 h; the GPU idle-held for three hours is.
    late, never = found(
        sessions, settings, idle_fleet, rule("gpu_idle", for_hours=2.5), rule("gpu_idle", for_hours=3.5)
    )
    assert subjects(late) == ["gpu:GPU-held"]
    assert never == []


def test_gpu_idle_out_of_scope(idle_fleet: datetime, sessions: sessionmaker[Session], settings: Settings) -> None:
    scopes = [
        Scope(instance_types=("g5.xlarge",)),
        Scope(regions=("eu-west-1",)),
        Scope(lifecycles=("spot",)),
        Scope(tags=(("team", "infra"),)),
        Scope(tags=(("team", "research"), ("env", "prod"))),
    ]
    results = found(sessions, settings, idle_fleet, *[rule("gpu_idle", for_hours=1, scope=s) for s in scopes])
    assert results == [[]] * len(scopes)
    [inside] = found(
        sessions,
        settings,
        idle_fleet,
        rule(
            "gpu_idle",
            for_hours=1,
            scope=Scope(("us-east-1",), ("p4d.24xlarge",), ("on-demand",), (("team", "research"),)),
        ),
    )
    assert subjects(inside) == ["gpu:GPU-held", "gpu:GPU-idle"]


def test_gpu_idle_scoped_to_the_users_holding_it(
    idle_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    ana, bob, either = found(
        sessions,
        settings,
        idle_fleet,
        rule("gpu_idle", for_hours=1, scope=Scope(users=("ana",))),
        rule("gpu_idle", for_hours=1, scope=Scope(users=("bob",))),
        rule("gpu_idle", for_hours=1, scope=Scope(users=("bob", "ana"))),
    )
    # The idle GPU nobody holds is in no scope that names users.
    assert subjects(ana) == subjects(either) == ["gpu:GPU-held"]
    assert bob == []


# slice_underused ----------------------------------------------------------------------------------------------------


def slice_ana(uid: str, _t: datetime) -> dict[str, Any]:
    """A Hopper slice at 2% (GPM), held by ana's process."""
    return {
        "uuid": uid,
        "util": 2.0,
        "util_source": "nvml.gpm",
        "mem_used_mib": 5000,
        "procs": 1,
        "holders": [{"ref": 0, "used_mib": 5000}],
    }


def slice_busy(uid: str, _t: datetime) -> dict[str, Any]:
    return {"uuid": uid, "util": 60.0, "util_source": "nvml.gpm", "mem_used_mib": 5000, "procs": 1}


@pytest.fixture
def slice_fleet(feeder: Feeder) -> datetime:
    """A p4d GPU in MIG mode for four hours from t0: slice MIG-empty never has a process, MIG-ana is held at 2% by
    ana, MIG-busy runs at 60%; one compute slice free. Then a g5 spot instance with nothing. Now: t0 + 4 h."""
    t0 = feeder.t0
    node = gpu(
        0,
        uid="GPU-mig",
        mig=True,
        unpartitioned=1,
        slices=[
            mig_slice(1, "3g.20gb", uid="MIG-empty"),
            mig_slice(2, "2g.10gb", uid="MIG-ana"),
            mig_slice(3, "1g.5gb", uid="MIG-busy"),
        ],
    )
    fns: dict[str, SampleFn] = {"GPU-mig": idle, "MIG-empty": unknown, "MIG-ana": slice_ana, "MIG-busy": slice_busy}
    feeder.feed([node], start=t0, hours=4, fn=fns, holders=[ANA], instance_id=P4D)
    return t0 + 4 * H


def test_slice_underused_holds_over_its_for(
    slice_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    now = slice_fleet
    [two_hours] = found(sessions, settings, now, rule("slice_underused", for_hours=2))
    assert subjects(two_hours) == ["slice:MIG-ana", "slice:MIG-empty"]
    held_slice, empty = two_hours
    # Judged over whole hours covering the last two: from two hours before now.
    assert empty.since == held_slice.since == now - 2 * H
    assert empty.extra["reason"] == "no process all window"
    assert empty.device == "slice 3g.20gb (GI 1) on GPU 0 (NVIDIA A100-SXM4-40GB)"
    assert empty.what.startswith(f"{empty.device} under-used over the last 2.0 h")
    assert empty.usd_so_far == pytest.approx(2 * P4D_PER_GPU_HOUR * 3 / 7)
    assert empty.usd_per_day == pytest.approx(24 * P4D_PER_GPU_HOUR * 3 / 7)
    assert empty.holders == ()
    assert held_slice.extra["reason"] == "average utilization 2.0% < 10%"
    assert held_slice.holders == ("ana",)
    assert held_slice.usd_per_day == pytest.approx(24 * P4D_PER_GPU_HOUR * 2 / 7)
    assert held_slice.instance_id == P4D and held_slice.page == f"/instances/{P4D}"


def test_slice_underused_does_not_hold_before_its_for(
    slice_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    # The slices have existed for four hours: under-used over the last five is not known yet.
    [five] = found(sessions, settings, slice_fleet, rule("slice_underused", for_hours=5))
    assert five == []


def test_slice_underused_out_of_scope(
    slice_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    spot, tag, inside = found(
        sessions,
        settings,
        slice_fleet,
        rule("slice_underused", for_hours=2, scope=Scope(lifecycles=("spot",))),
        rule("slice_underused", for_hours=2, scope=Scope(tags=(("team", "infra"),))),
        rule("slice_underused", for_hours=2, scope=Scope(lifecycles=("on-demand",))),
    )
    assert spot == tag == []
    assert len(inside) == 2


def test_slice_underused_scoped_to_the_users_holding_it(
    slice_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    ana, bob = found(
        sessions,
        settings,
        slice_fleet,
        rule("slice_underused", for_hours=2, scope=Scope(users=("ana",))),
        rule("slice_underused", for_hours=2, scope=Scope(users=("bob",))),
    )
    assert subjects(ana) == ["slice:MIG-ana"]
    assert bob == []


# mig_unpartitioned --------------------------------------------------------------------------------------------------


@pytest.fixture
def free_fleet(feeder: Feeder) -> datetime:
    """A p4d GPU in MIG mode from t0 with one 3g slice and 4 compute slices free; at t0 + 2 h a 2g slice is made,
    leaving 2 free. Now: t0 + 4 h."""
    t0 = feeder.t0
    first = mig_slice(1, "3g.20gb", uid="MIG-a")
    before = gpu(0, uid="GPU-mig", mig=True, slices=[first], unpartitioned=4)
    after = gpu(0, uid="GPU-mig", mig=True, slices=[first, mig_slice(2, "2g.10gb", uid="MIG-b")], unpartitioned=2)
    fns: dict[str, SampleFn] = {"GPU-mig": idle, "MIG-a": unknown, "MIG-b": unknown}
    feeder.feed([before], start=t0, hours=2, fn=fns, instance_id=P4D)
    feeder.feed([after], start=t0 + 2 * H, hours=2, fn=fns, instance_id=P4D)
    return t0 + 4 * H


def test_mig_unpartitioned_holds_since_the_layout_changed(
    free_fleet: datetime, feeder: Feeder, sessions: sessionmaker[Session], settings: Settings
) -> None:
    [f] = found(sessions, settings, free_fleet, rule("mig_unpartitioned", for_hours=1.5))[0]
    assert f.subject == "mig-free:GPU-mig"
    assert f.since == feeder.t0 + 2 * H
    assert f.extra["free_slices"] == 2
    assert f.what == "2 of 7 compute slices of GPU 0 (NVIDIA A100-SXM4-40GB) in no slice for 2.0 h"
    assert f.usd_per_day == pytest.approx(24 * P4D_PER_GPU_HOUR * 2 / 7)
    assert f.usd_so_far == pytest.approx(2 * P4D_PER_GPU_HOUR * 2 / 7)
    assert f.holders == () and f.instance_id == P4D


def test_mig_unpartitioned_does_not_hold_before_its_for(
    free_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    # The GPU has had free capacity for four hours, but this layout only for two.
    [three] = found(sessions, settings, free_fleet, rule("mig_unpartitioned", for_hours=3))
    assert three == []


def test_mig_unpartitioned_out_of_scope_and_never_held(
    free_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    other_type, users, inside = found(
        sessions,
        settings,
        free_fleet,
        rule("mig_unpartitioned", for_hours=1, scope=Scope(instance_types=("p5.48xlarge",))),
        # Free capacity is held by no one: in no scope that names users.
        rule("mig_unpartitioned", for_hours=1, scope=Scope(users=("ana",))),
        rule("mig_unpartitioned", for_hours=1, scope=Scope(tags=(("team", "research"),))),
    )
    assert other_type == users == []
    assert subjects(inside) == ["mig-free:GPU-mig"]


def test_an_offline_mig_gpu_has_no_findings(
    free_fleet: datetime, sessions: sessionmaker[Session], settings: Settings
) -> None:
    free, slices = found(
        sessions,
        settings,
        free_fleet + timedelta(minutes=10),
        rule("mig_unpartitioned", for_hours=1),
        rule("slice_underused", for_hours=1),
    )
    assert free == slices == []


# One snapshot, many rules -------------------------------------------------------------------------------------------


def test_a_snapshot_reads_only_what_its_rules_need_and_each_part_once(
    slice_fleet: datetime, sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []

    def counted(name: str, real: Any) -> Any:
        def read(*args: Any, **kw: Any) -> Any:
            reads.append(name)
            return real(*args, **kw)

        return read

    for name in ("row_totals", "window_usage", "idle_gpus", "latest_samples"):
        monkeypatch.setattr(snapshot_module, name, counted(name, getattr(snapshot_module, name)))
    with sessions() as session:
        snapshot = load_snapshot(session, settings, now=slice_fleet)
        assert "fleet" not in vars(snapshot)
        assert find(snapshot, rule("agent_offline", for_hours=1)) == []
        assert "fleet" in vars(snapshot) and reads == []
        two_hours = find(snapshot, rule("slice_underused", for_hours=2))
        assert find(snapshot, rule("slice_underused", for_hours=2, scope=Scope(users=("ana",)))) != []
        assert find(snapshot, rule("slice_underused", for_hours=3)) != []
        assert find(snapshot, rule("tag_waste", tag_key="team", usd_per_day=1)) != []
        assert find(snapshot, rule("tag_waste", tag_key="project", usd_per_day=1)) != []
        assert find(snapshot, rule("gpu_idle", for_hours=1)) == find(snapshot, rule("gpu_idle", for_hours=2)) == []
        # One read of the MIG devices per `for`, of the newest samples, of the idle GPUs, one of the day's waste.
        assert sorted(reads) == ["idle_gpus", "latest_samples", "row_totals", "window_usage", "window_usage"]
        assert find(snapshot, rule("slice_underused", for_hours=2)) == two_hours


def test_an_unknown_condition_is_refused(sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions() as session:
        snapshot = load_snapshot(session, settings, now=datetime.now().astimezone())
        with pytest.raises(ValueError, match="unknown condition 'gpu_hot'"):
            find(snapshot, rule("gpu_hot"))
