"""The demo's history, written through the bulk path and read back through the analysis: the stories' numbers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import Fleet, load_fleet
from app.analyse.idle import idle_gpus
from app.analyse.mig import mig_gpus, underused_slices, unpartitioned
from app.analyse.now import current_state, latest_samples
from app.analyse.states import UNKNOWN, Thresholds
from app.analyse.waste import analyse_waste
from app.analyse.window import Filters, preset_window
from app.demo import history
from app.demo.fleet import DAY, GRID_S, HOUR, STORIES, DemoFleet, SimInstance, make_fleet
from app.pricing import Pricer
from app.store.samples import StageRow
from tests.app.demo.conftest import last_wednesday_afternoon

G5_XLARGE_USD_PER_HOUR = 1.006
DAYS = 5
FINE_S = 60


@dataclass
class Loaded:
    fleet: DemoFleet
    hosts: list[history.Host]
    epoch: int
    rows: int

    def named(self, name: str) -> SimInstance:
        return next(i for i in self.fleet.instances if i.tags["Name"] == name)


@pytest.fixture(scope="module")
def loaded(module_sessions: sessionmaker[Session]) -> Loaded:
    """The stories' eight instances, five days of them up to a Wednesday afternoon."""
    epoch = last_wednesday_afternoon()
    fleet = make_fleet(len(STORIES), seed=1, epoch=epoch)
    hosts = history.make_hosts(fleet, FINE_S)
    begin = epoch - DAYS * DAY
    history.register(module_sessions, hosts, first=begin)
    written = history.write_history(
        module_sessions,
        fleet,
        hosts,
        starts={h.inst.instance_id: float(begin) for h in hosts},
        end=float(epoch),
        fine_s=FINE_S,
        mem_held_mib=256,
    )
    return Loaded(fleet, hosts, epoch, written.rows)


def at(loaded: Loaded) -> datetime:
    return datetime.fromtimestamp(loaded.epoch, UTC)


def fleet_now(session: Session, loaded: Loaded) -> Fleet:
    return load_fleet(session, filters=Filters(), pricer=Pricer(), thresholds=Thresholds(), now=at(loaded))


def test_the_forgotten_g5_is_idle_for_102_hours_and_costs_its_dollars(
    loaded: Loaded, module_sessions: sessionmaker[Session]
) -> None:
    now = at(loaded)
    with module_sessions() as session:
        fleet = fleet_now(session, loaded)
        latest = latest_samples(session, now=now, thresholds=Thresholds())
        idle = idle_gpus(session, fleet, latest, now=now, thresholds=Thresholds())
    g5 = [g for g in idle if g.gpu.instance.name == "vision-finetune-dev"]
    assert len(g5) == 1
    assert g5[0].since == now - timedelta(hours=102)
    assert g5[0].state == "idle"
    assert g5[0].idle_hours == pytest.approx(102.0)
    assert g5[0].burned_usd == pytest.approx(102 * G5_XLARGE_USD_PER_HOUR)
    assert g5[0].usd_per_day == pytest.approx(24 * G5_XLARGE_USD_PER_HOUR)
    # On a Wednesday morning the p4d team is at work: none of its GPUs is idle.
    assert not [g for g in idle if g.gpu.instance.tags["team"] == "ml-research"]


def test_the_inference_p5_has_two_unused_slices_and_one_slice_never_partitioned(
    loaded: Loaded, module_sessions: sessionmaker[Session]
) -> None:
    now = at(loaded)
    with module_sessions() as session:
        fleet = fleet_now(session, loaded)
        latest = latest_samples(session, now=now, thresholds=Thresholds())
        analysis = analyse_waste(session, fleet, preset_window("24h", now), Thresholds())
        every = mig_gpus(analysis, current_state(fleet, latest))
    views = [v for v in every if v.gpu.instance.name == "inference-serving"]
    assert len(views) == 8
    unused = underused_slices(views)
    assert sorted(u.slot.slice.profile for u in unused) == ["1g.10gb", "2g.20gb"]
    assert all(u.slot.reason == "no process all window" for u in unused)
    # The one GPU of the serving host with capacity in no slice.
    [free] = unpartitioned(views)
    assert free.gpu.gpu_index == 7 and free.free_slices == 1
    assert free.free_usd_per_hour == pytest.approx(55.04 / 8 / 7)


def test_the_a100_mig_node_has_slices_of_unknown_utilization(
    loaded: Loaded, module_sessions: sessionmaker[Session]
) -> None:
    now = at(loaded)
    with module_sessions() as session:
        fleet = fleet_now(session, loaded)
        latest = latest_samples(session, now=now, thresholds=Thresholds())
        analysis = analyse_waste(session, fleet, preset_window("24h", now), Thresholds())
        states = current_state(fleet, latest)
        views = [v for v in mig_gpus(analysis, states) if v.gpu.instance.name == "shared-a100-mig"]
    slots = [slot for v in views for slot in v.slots]
    assert len(views) == 8 and len(slots) == 22
    assert all(slot.unit is not None and slot.unit.avg_util is None for slot in slots)
    assert {slot.state for slot in slots} == {UNKNOWN}
    # Utilization is unknown, but a slice with no process at all is still found.
    assert [u.slot.slice.profile for u in underused_slices(views)] == ["1g.5gb"]


def test_spot_instances_send_nothing_while_away(loaded: Loaded, module_sessions: sessionmaker[Session]) -> None:
    spot = loaded.named("embeddings-spot")
    gaps = loaded.fleet.offline(spot, loaded.epoch - DAYS * DAY, loaded.epoch)
    assert gaps
    sql = text(
        "SELECT count(*) FROM samples s JOIN gpus g ON g.id = s.device_id JOIN instances i ON i.id = g.instance_pk "
        "WHERE i.instance_id = :i AND s.ts >= :a AND s.ts < :b"
    )
    with module_sessions() as session:
        for a, b in gaps:
            inside = session.scalar(sql, {"i": spot.instance_id, "a": _utc(a), "b": _utc(b)})
            around = session.scalar(sql, {"i": spot.instance_id, "a": _utc(a - HOUR), "b": _utc(a)})
            assert inside == 0
            if a - HOUR >= loaded.epoch - DAYS * DAY and loaded.fleet.online(spot, a - HOUR):
                assert around == 4 * HOUR // GRID_S  # four GPUs, every 5 minutes


def test_the_p4d_team_trains_on_weekdays_only(loaded: Loaded, module_sessions: sessionmaker[Session]) -> None:
    p4d = loaded.named("llm-pretrain-a")
    sql = text(
        "SELECT date_trunc('day', s.ts - interval '5 hours') AS day, max(s.util), max(s.procs) FROM samples s "
        "JOIN gpus g ON g.id = s.device_id JOIN instances i ON i.id = g.instance_pk WHERE i.instance_id = :i "
        "GROUP BY 1 ORDER BY 1"
    )
    with module_sessions() as session:
        days = session.execute(sql, {"i": p4d.instance_id}).all()
    assert len(days) == DAYS + 1
    for day, top, procs in days:
        weekend = day.weekday() >= 5
        assert (top < 5 and procs == 0) if weekend else (top > 80 and procs == 1), day


def test_rows_are_the_fake_nvml_exact_figures(loaded: Loaded, module_sessions: sessionmaker[Session]) -> None:
    host = next(h for h in loaded.hosts if h.inst.tags["Name"] == "inference-serving")
    t = loaded.epoch - 2 * DAY
    truth = host.lib.truth(t, t + GRID_S)
    sql = text(
        "SELECT d.uuid, s.util, s.mem_used_mib, s.procs, s.power_w FROM samples s JOIN "
        "(SELECT id, uuid FROM gpus UNION ALL SELECT id, uuid FROM mig_slices) d ON d.id = s.device_id "
        "WHERE s.ts = :t"
    )
    with module_sessions() as session:
        rows = {r.uuid: r for r in session.execute(sql, {"t": _utc(t)})}
    assert len(truth) == 35
    for uuid, expect in truth.items():
        row = rows[uuid]
        assert row.util == pytest.approx(expect.util, abs=0.01)
        assert (row.mem_used_mib, row.procs) == (expect.mem_used_mib, expect.procs)
        assert row.power_w == (None if expect.power_w is None else round(expect.power_w))


def test_every_device_has_one_row_per_interval_up_to_the_end(
    loaded: Loaded, module_sessions: sessionmaker[Session]
) -> None:
    g5 = loaded.named("vision-finetune-dev")
    sql = text(
        "SELECT count(*), max(s.ts) FROM samples s JOIN gpus g ON g.id = s.device_id "
        "JOIN instances i ON i.id = g.instance_pk WHERE i.instance_id = :i"
    )
    with module_sessions() as session:
        count, newest = session.execute(sql, {"i": g5.instance_id}).one()
        seen = session.scalar(text("SELECT last_seen FROM instances WHERE instance_id = :i"), {"i": g5.instance_id})
    coarse = (DAYS * DAY - history.FINE_SPAN_S) // GRID_S
    assert count == coarse + history.FINE_SPAN_S // FINE_S
    assert newest == at(loaded) - timedelta(seconds=FINE_S)
    assert seen == at(loaded)


def test_the_same_instance_gives_the_same_rows(loaded: Loaded) -> None:
    inst = loaded.named("inference-serving")
    one, two = history.Host(loaded.fleet, inst, FINE_S), history.Host(loaded.fleet, inst, FINE_S)
    assert one.gpus == two.gpus
    ids = {uuid: k for k, uuid in enumerate(one.lib.truth(0.0, 1.0))}
    one.register(ids)
    two.register(ids)
    rows_one: list[StageRow] = []
    rows_two: list[StageRow] = []
    one.rows(loaded.epoch - 600, loaded.epoch - 300, at(loaded), rows_one)
    two.rows(loaded.epoch - 600, loaded.epoch - 300, at(loaded), rows_two)
    assert rows_one == rows_two and len(rows_one) == 35


def test_spans_follow_the_grids_and_never_leave_a_sliver() -> None:
    fine_from = 10 * GRID_S
    got = history.spans(5 * GRID_S + 0.4, 10 * GRID_S + 25.0, fine_from=fine_from, fine_s=10)
    assert got[0] == (5 * GRID_S + 0.4, 6 * GRID_S)
    assert len(got) == 8
    assert got[4:] == [
        (9 * GRID_S, 10 * GRID_S),
        (10 * GRID_S, 10 * GRID_S + 10),
        (10 * GRID_S + 10, 10 * GRID_S + 20),
        (10 * GRID_S + 20, 10 * GRID_S + 25.0),
    ]
    assert history.spans(GRID_S - 0.5, 2 * GRID_S, fine_from=fine_from, fine_s=10) == [(GRID_S - 0.5, 2 * GRID_S)]


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def test_the_locked_down_a100_host_names_the_figures_it_could_not_read(
    loaded: Loaded, module_sessions: sessionmaker[Session]
) -> None:
    with module_sessions() as session:
        fleet = fleet_now(session, loaded)
    gpus = sorted(
        (g for g in fleet.gpus.values() if g.instance.name == "a100-mig-locked-down"), key=lambda g: g.gpu_index
    )
    assert [bool(g.permission_denied) for g in gpus] == [True] * 4 + [False] * 4
    assert {(d.figure, d.grant) for d in gpus[0].permission_denied} == {
        ("mem_used_mib", "mig-monitor"),
        ("procs", "mig-monitor"),
    }
    slices = sorted(s.profile for s in fleet.slices_by_gpu[gpus[0].pk])
    assert slices == ["1g.5gb"] * 7, "A100 40GB profiles, though the parent's memory was refused"


def test_the_history_says_who_held_each_device(loaded: Loaded, module_sessions: sessionmaker[Session]) -> None:
    users = text(
        "SELECT h.user_name, sum(r.secs) / 3600 AS hours, sum(r.lt5_s) / 3600 AS idle_held_hours, "
        "array_agg(DISTINCT h.job_id) AS jobs, array_agg(DISTINCT h.namespace) AS namespaces "
        "FROM holder_rollups_daily r JOIN holders h ON h.id = r.holder_id GROUP BY 1"
    )
    # Per device, its holders' seconds against its own: shares of one interval add up to the interval at most.
    over = text(
        "SELECT h.device_id, h.secs, d.secs FROM (SELECT device_id, sum(secs) AS secs FROM holder_rollups_daily "
        "GROUP BY 1) h LEFT JOIN (SELECT device_id, sum(secs) AS secs FROM rollups_hourly GROUP BY 1) d "
        "ON d.device_id = h.device_id WHERE d.secs IS NULL OR h.secs > d.secs + 1e-6"
    )
    starts = text("SELECT count(*) FROM holders WHERE started_at IS NULL OR started_at > first_seen")
    with module_sessions() as session:
        by_user = {r.user_name: r for r in session.execute(users)}
        assert session.execute(over).all() == []
        assert session.scalar(starts) == 0
    # asmith's notebook holds a GPU of the locked-down A100 host, idle, all along.
    assert by_user["asmith"].hours == pytest.approx(DAYS * 24, rel=0.01)
    assert by_user["asmith"].idle_held_hours == pytest.approx(by_user["asmith"].hours)
    # mchen's Slurm job runs on the 16 GPUs of the two p4d training nodes in office hours only.
    assert by_user["mchen"].jobs == ["48213"]
    assert 16 * 20 < by_user["mchen"].hours < 16 * DAYS * 12
    # The inference p5's vLLM pods are root's, in namespace inference (with the other root pods and containers).
    assert "inference" in by_user["root"].namespaces
    with module_sessions() as session:
        slices = session.scalar(
            text(
                "SELECT count(DISTINCT r.device_id) FROM holder_rollups_daily r JOIN holders h ON h.id = r.holder_id "
                "JOIN mig_slices m ON m.id = r.device_id WHERE h.namespace = 'inference' AND h.executable = 'vllm'"
            )
        )
    assert slices == 25, "every slice of the inference p5 but the two unused ones"
