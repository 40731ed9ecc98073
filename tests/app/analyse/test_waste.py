"""Cost and waste on constructed data: every expected figure is worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.analyse.figures import GPU, SLICE
from app.analyse.states import UNPARTITIONED
from app.analyse.window import Filters
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, busy, held, idle, unknown
from tests.factories import gpu, mig_slice, unsized_slice

H = timedelta(hours=1)
A100_MIG_REASON = "A100 MIG: NVML gives no per-slice utilization"


def test_three_idle_hours_on_p4d_cost_three_gpu_hours(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=3, fn=idle)
    a = analyst.waste(t0, t0 + 3 * H)
    assert len(a.units) == 1 and a.units[0].kind == GPU
    f = a.totals
    assert f.idle_h == pytest.approx(3.0)
    assert f.idle_cost == pytest.approx(3 * 21.957642 / 8)
    assert f.cost == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert f.unused_cost == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert f.active_h == f.idle_held_h == f.unknown_h == f.offline_h == 0
    assert f.waste == pytest.approx(f.idle_cost)
    # Projected to a 730-hour month at the same rate.
    assert a.projected_monthly_waste == pytest.approx(730 * P4D_PER_GPU_HOUR)


def test_held_memory_or_process_is_idle_held(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=held)
    f = analyst.waste(t0, t0 + 2 * H).totals
    assert f.idle_held_h == pytest.approx(2.0)
    assert f.idle_h == 0
    assert f.idle_held_cost == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert f.waste == pytest.approx(2 * P4D_PER_GPU_HOUR)


def test_activity_and_unused_capacity(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=1, fn=busy(40.0))
    f = analyst.waste(t0, t0 + H).totals
    assert f.active_h == pytest.approx(1.0)
    assert f.avg_util == pytest.approx(40.0)
    assert f.waste == 0
    assert f.unused_cost == pytest.approx(0.6 * P4D_PER_GPU_HOUR)


def test_offline_gap_is_neither_idle_nor_priced(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    g = [gpu(0)]
    feeder.feed(g, start=t0, hours=1, fn=idle)
    feeder.feed(g, start=t0 + 2 * H, hours=1, fn=idle)
    f = analyst.waste(t0, t0 + 3 * H).totals
    assert f.offline_h == pytest.approx(1.0)
    assert f.idle_h == pytest.approx(2.0)
    assert f.cost == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert f.share("offline") == pytest.approx(1 / 3)


def test_time_before_a_gpu_first_reported_is_not_offline(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0 + H, hours=1, fn=idle)
    f = analyst.waste(t0, t0 + 2 * H).totals
    assert f.offline_h == 0
    assert f.idle_h == pytest.approx(1.0)


def test_unknown_slice_is_never_idle_or_active(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    feeder.feed([g], start=t0, hours=2, fn=unknown)
    a = analyst.waste(t0, t0 + 2 * H)
    kinds = {u.kind: u for u in a.units}
    assert set(kinds) == {SLICE, UNPARTITIONED}
    f = a.totals
    # The 3g slice: 3/7 of the GPU for 2 h, utilization unknown.
    assert f.unknown_h == pytest.approx(2 * 3 / 7)
    assert f.active_h == 0 and f.idle_held_h == 0
    # The 4 free slices are idle capacity, priced as waste.
    assert f.unpartitioned_h == pytest.approx(2 * 4 / 7)
    assert f.idle_h == pytest.approx(2 * 4 / 7)
    assert f.unpartitioned_cost == pytest.approx(2 * 4 / 7 * P4D_PER_GPU_HOUR)
    assert f.cost == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert f.unknown_share == pytest.approx(3 / 7)
    assert f.avg_util == pytest.approx(0.0)  # only the free capacity has a figure


def test_mig_reconfiguration_mid_window(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    uid = "GPU-reconfigured"
    before = gpu(0, uid=uid, mig=True, slices=[mig_slice(i, "1g.5gb") for i in range(1, 8)], unpartitioned=0)
    after = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "4g.20gb"), mig_slice(2, "2g.10gb")], unpartitioned=1)
    feeder.feed([before], start=t0, hours=1, fn=busy(50.0))
    feeder.feed([after], start=t0 + H, hours=2, fn=busy(50.0))
    a = analyst.waste(t0, t0 + 3 * H)
    slices = [u for u in a.units if u.kind == SLICE]
    assert len(slices) == 9
    f = a.totals
    # First hour fully sliced; then 6 of 7 slices for 2 h, the 7th unpartitioned.
    assert f.unpartitioned_h == pytest.approx(2 / 7)
    assert f.active_h == pytest.approx(1 + 2 * 6 / 7)
    assert f.cost == pytest.approx(3 * P4D_PER_GPU_HOUR)
    assert sum(u.figures().gpu_hours for u in slices) == pytest.approx(1 + 2 * 6 / 7)


def test_missing_price_is_counted_apart(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle, instance_type="p5e.48xlarge", instance_id="i-nolistprice")
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle, instance_id="i-p4d")
    a = analyst.waste(t0, t0 + 2 * H)
    f = a.totals
    assert f.gpu_hours == pytest.approx(4.0)
    assert f.unpriced_gpu_hours == pytest.approx(2.0)
    assert f.cost == pytest.approx(2 * P4D_PER_GPU_HOUR)
    rows = {r.key: r for r in a.group("instance_type")}
    assert rows["p5e.48xlarge"].figures.cost == 0
    assert rows["p5e.48xlarge"].figures.unpriced_gpu_hours == pytest.approx(2.0)
    assert any(src.startswith("no price") for src in rows["p5e.48xlarge"].prices)


def test_groups_add_up_to_totals(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0), gpu(1)], start=t0, hours=2, fn=idle, instance_id="i-a", tags={"team": "vision"})
    feeder.feed(
        [gpu(0)],
        start=t0,
        hours=2,
        fn=busy(80),
        instance_id="i-b",
        tags={"team": "nlp"},
        instance_type="g5.xlarge",
        lifecycle="spot",
    )
    feeder.feed([gpu(0)], start=t0, hours=2, fn=held, instance_id="i-c", tags={})
    a = analyst.waste(t0, t0 + 2 * H)
    for by in ("instance", "instance_type", "region", "lifecycle", "gpu", "slice", "gpu_model", "tag:team"):
        rows = a.group(by)
        assert sum(r.figures.cost for r in rows) == pytest.approx(a.totals.cost), by
        assert sum(r.figures.waste for r in rows) == pytest.approx(a.totals.waste), by
    teams = {r.label: r for r in a.group("tag:team")}
    assert set(teams) == {"vision", "nlp", "(no team tag)"}
    assert teams["vision"].figures.idle_cost == pytest.approx(4 * P4D_PER_GPU_HOUR)
    # Rows come largest waste first.
    assert a.group("tag:team")[0].label == "vision"


def test_filters_narrow_the_fleet(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=1, fn=idle, instance_id="i-a", tags={"team": "vision"})
    feeder.feed([gpu(0)], start=t0, hours=1, fn=idle, instance_id="i-b", tags={"team": "nlp"}, region="eu-west-1")
    a = analyst.waste(t0, t0 + H, filters=Filters(tags=(("team", "nlp"),)))
    assert [u.instance.instance_id for u in a.units] == ["i-b"]
    a = analyst.waste(t0, t0 + H, filters=Filters(regions=("us-east-1",)))
    assert [u.instance.instance_id for u in a.units] == ["i-a"]


def test_daily_rows_give_the_same_answer_as_hourly_rows(feeder: Feeder, analyst: Analyst) -> None:
    """A story across midnight, read once from daily rollups and once from hourly ones."""
    now = datetime.now(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if now - midnight < 5 * H:
        midnight -= timedelta(days=1)
    start = midnight - 4 * H
    g = [gpu(0), gpu(1, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)]

    def story(uid: str, t: datetime) -> dict[str, Any]:
        return (busy(60) if t < midnight else held)(uid, t)

    feeder.feed(g, start=start, hours=8, step_s=120, fn=story)
    end = midnight + 4 * H
    by_days = analyst.waste(midnight - timedelta(days=1), midnight + timedelta(days=1), now=end)
    by_hours = analyst.waste(start - H, end, now=end)
    assert {r.table for r in by_days.window.rollup_reads()} == {"daily"}
    assert {r.table for r in by_hours.window.rollup_reads()} == {"hourly"}
    # A day's row less the hours outside the window.
    by_difference = analyst.waste(midnight - 20 * H, end, now=end)
    assert any(r.sign < 0 for r in by_difference.window.rollup_reads())
    for name in ("gpu_hours", "active_h", "idle_held_h", "idle_h", "unpartitioned_h", "cost", "waste", "offline_h"):
        assert getattr(by_days.totals, name) == pytest.approx(getattr(by_hours.totals, name)), name
        assert getattr(by_difference.totals, name) == pytest.approx(getattr(by_hours.totals, name)), name
    assert by_days.totals.active_h == pytest.approx(4 * (1 + 3 / 7))
    assert by_days.totals.unpartitioned_h == pytest.approx(8 * 4 / 7)


def test_mig_mode_switched_on_mid_window(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    uid = "GPU-switched"
    feeder.feed([gpu(0, uid=uid)], start=t0, hours=1, fn=busy(80))
    on = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    feeder.feed([on], start=t0 + H, hours=1, fn=busy(50))
    a = analyst.waste(t0, t0 + 2 * H)
    kinds = sorted(u.kind for u in a.units)
    assert kinds == [GPU, SLICE, UNPARTITIONED]
    f = a.totals
    # One passthrough hour at 80%, then 3/7 busy and 4/7 unpartitioned for an hour.
    assert f.active_h == pytest.approx(1 + 3 / 7)
    assert f.unpartitioned_h == pytest.approx(4 / 7)
    assert f.cost == pytest.approx(2 * P4D_PER_GPU_HOUR)
    assert f.offline_h == 0


def test_figures_add_covers_every_field() -> None:
    from dataclasses import fields

    from app.analyse.figures import Figures

    one = Figures(**{f.name: 1.0 for f in fields(Figures)})
    total = Figures()
    total.add(one)
    total.add(one)
    assert all(getattr(total, f.name) == 2.0 for f in fields(Figures))


def test_a_slice_of_unknown_size_is_neither_priced_nor_free(feeder: Feeder, analyst: Analyst) -> None:
    """An A100 with a 3g slice, a slice the agent could not size, and 2 compute slices it calls free: the 2
    might be part of the unsized slice, so nothing of this GPU is unpartitioned, and the unsized slice has
    hours but no GPU-hours and no dollars."""
    t0 = feeder.t0
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2, uid="MIG-unsized")], unpartitioned=2)
    feeder.feed([g], start=t0, hours=2, fn=idle)
    a = analyst.waste(t0, t0 + 2 * H)
    f = a.totals
    assert f.unpartitioned_h == 0 and f.unpartitioned_cost == 0
    # Only the 3g slice is priced: idle for 2 h at 3/7 of a GPU.
    assert f.gpu_hours == pytest.approx(2 * 3 / 7)
    assert f.idle_h == pytest.approx(2 * 3 / 7)
    assert f.cost == f.idle_cost == f.waste == pytest.approx(2 * 3 / 7 * P4D_PER_GPU_HOUR)
    assert f.unpriced_gpu_hours == 0
    # What is left out is counted apart and said to be unknown.
    assert f.unsized_slice_h == pytest.approx(2.0)
    assert f.free_unknown_h == pytest.approx(2.0)
    assert f.capacity_unknown and not f.only_unknown
    [unsized] = [u for u in a.units if u.slice is not None and u.slice.uuid == "MIG-unsized"]
    assert not unsized.sized and unsized.weight is None and unsized.usd_per_hour is None
    assert unsized.figures().gpu_hours == 0 and unsized.figures().cost == 0 and unsized.figures().only_unknown
    # Its own seconds and utilization are still known, for the under-used test.
    assert unsized.covered_s == pytest.approx(2 * 3600) and unsized.no_proc_s == pytest.approx(2 * 3600)
    assert unsized.avg_util == pytest.approx(0.0)
    [free] = [u for u in a.units if u.kind == UNPARTITIONED]
    assert free.figures().only_unknown
    rows = {r.label: r.figures for r in a.group("slice")}
    assert rows[unsized.label].only_unknown and "unknown profile" in unsized.label


def test_an_incomplete_layout_has_no_unpartitioned_time(feeder: Feeder, analyst: Analyst) -> None:
    t0 = feeder.t0
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    g["layout_complete"] = False
    feeder.feed([g], start=t0, hours=2, fn=idle)
    f = analyst.waste(t0, t0 + 2 * H).totals
    assert f.unpartitioned_h == 0 and f.unpartitioned_cost == 0
    assert f.cost == pytest.approx(2 * 3 / 7 * P4D_PER_GPU_HOUR)
    assert f.free_unknown_h == pytest.approx(2.0) and f.unsized_slice_h == 0
    # The same GPU with its layout read in full: the 4 free slices are idle capacity.
    g2 = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4, uid="GPU-complete")
    feeder.feed([g2], start=t0, hours=2, fn=idle, instance_id="i-complete")
    f = analyst.waste(t0, t0 + 2 * H, filters=Filters(instance_ids=("i-complete",))).totals
    assert f.unpartitioned_h == pytest.approx(2 * 4 / 7) and f.free_unknown_h == 0


def test_an_unsized_slice_in_the_window_makes_the_whole_window_unknown(feeder: Feeder, analyst: Analyst) -> None:
    """The simple rule: one unsized slice anywhere in the window, and no hour of its GPU counts as free."""
    t0 = feeder.t0
    uid = "GPU-sized-later"
    first = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=None)
    then = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb", uid=first["slices"][0]["uuid"])], unpartitioned=4)
    feeder.feed([first], start=t0, hours=1, fn=idle)
    feeder.feed([then], start=t0 + H, hours=2, fn=idle)
    f = analyst.waste(t0, t0 + 2 * H).totals
    assert f.unpartitioned_h == 0 and f.free_unknown_h == pytest.approx(2.0)
    assert f.unsized_slice_h == pytest.approx(1.0)
    # A window after the unsized slice was gone is known again.
    f = analyst.waste(t0 + 2 * H, t0 + 3 * H).totals
    assert f.free_unknown_h == 0 and f.unpartitioned_h == pytest.approx(4 / 7)
