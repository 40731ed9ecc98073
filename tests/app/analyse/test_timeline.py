"""The fleet over time, on constructed data: sums agree with the window analysis, buckets are worked out by hand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.device_series import DAILY, PARTIAL, reads
from app.analyse.states import Thresholds
from app.analyse.timeline import BucketFigures, Timeline, bucket_step, timeline, window_totals
from app.analyse.window import DAY, HOUR, Window
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, busy, held, idle, unknown
from tests.factories import gpu, mig_slice, unsized_slice

H = HOUR
RATE = P4D_PER_GPU_HOUR
STATES = ("active_h", "idle_held_h", "unknown_h", "offline_h", "unpartitioned_h", "cost", "idle_cost")


def run(
    analyst: Analyst,
    sessions: sessionmaker[Session],
    start: datetime,
    end: datetime,
    *,
    now: datetime | None = None,
    step: timedelta = HOUR,
    row_of: Mapping[int, str] | None = None,
    thresholds: Thresholds | None = None,
) -> Timeline:
    window = Window(start=start, end=end, now=now or end, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        return timeline(
            session,
            fleet,
            start=start,
            end=end,
            now=window.now,
            step=step,
            thresholds=thresholds or analyst.thresholds,
            row_of=row_of,
        )


def gpu_pks(analyst: Analyst, sessions: sessionmaker[Session], t: datetime) -> dict[str, int]:
    """GPU pk by GPU uuid."""
    with sessions() as session:
        fleet = analyst.fleet(session, Window(start=t, end=t + H, now=t + H, label="test"))
        return {g.uuid: g.pk for g in fleet.gpus.values()}


def only(f: BucketFigures, **expected: float) -> None:
    """`f` holds `expected` and zeros elsewhere."""
    assert astuple(f) == pytest.approx(astuple(BucketFigures(**expected)))


def assert_same(t: BucketFigures, totals: Any) -> None:
    """Timeline figures against the window analysis's `Figures` (whose idle includes unpartitioned)."""
    for name in STATES:
        assert getattr(t, name) == pytest.approx(getattr(totals, name)), name
    assert t.idle_h + t.unpartitioned_h == pytest.approx(totals.idle_h)
    assert t.idle_held_cost == pytest.approx(totals.idle_held_cost)
    assert t.unpriced_gpu_hours == pytest.approx(totals.unpriced_gpu_hours)
    assert t.gpu_hours == pytest.approx(totals.gpu_hours)
    assert t.waste == pytest.approx(totals.waste)


def mixed_fleet(feeder: Feeder) -> None:
    """Two passthrough GPUs (one with an offline hour), an A100 with a 3g slice and 4 free slices, and an
    instance with no price, over [t0, t0 + 4 h)."""
    t0 = feeder.t0
    a, b = gpu(0, uid="GPU-a"), gpu(1, uid="GPU-b")
    sliced = gpu(2, uid="GPU-mig", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")], unpartitioned=4)
    story = {"GPU-a": busy(60), "GPU-b": idle, "GPU-mig": idle, "MIG-3g": unknown}
    feeder.feed([a, b, sliced], start=t0, hours=2, fn=story, instance_id="i-p4d")
    # GPU-b sends nothing for an hour: offline.
    feeder.feed([a, sliced], start=t0 + 2 * H, hours=1, fn=story, instance_id="i-p4d")
    feeder.feed([a, b, sliced], start=t0 + 3 * H, hours=1, fn={**story, "GPU-b": held}, instance_id="i-p4d")
    feeder.feed([gpu(0, uid="GPU-p5e")], start=t0, hours=4, fn=idle, instance_type="p5e.48xlarge", instance_id="i-p5e")


def test_bucket_step() -> None:
    assert bucket_step(timedelta(hours=1)) == HOUR
    assert bucket_step(timedelta(days=7)) == HOUR
    assert bucket_step(timedelta(days=7, hours=1)) == DAY
    assert bucket_step(timedelta(days=30)) == DAY


def test_sum_over_buckets_is_the_window_analysis(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    mixed_fleet(feeder)
    t0 = feeder.t0
    tl = run(analyst, sessions, t0, t0 + 4 * H)
    a = analyst.waste(t0, t0 + 4 * H)
    total = tl.total()
    assert_same(total, a.totals)
    # Every kind of figure is in there.
    assert total.active_h > 0 and total.idle_held_h > 0 and total.unknown_h > 0
    assert total.unpartitioned_h == pytest.approx(4 * 4 / 7) and total.offline_h == pytest.approx(1.0)
    assert total.unpriced_gpu_hours == pytest.approx(4.0)
    # Per row: each GPU's row sums to its GPU's group in the window analysis.
    pks = gpu_pks(analyst, sessions, t0)
    by_gpu = run(analyst, sessions, t0, t0 + 4 * H, row_of={pk: uid for uid, pk in pks.items()})
    groups = {r.key: r.figures for r in a.group("gpu")}
    for uid, pk in pks.items():
        assert_same(by_gpu.total(uid), groups[str(pk)])


def test_buckets_by_hand(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    t0 = feeder.t0
    g = [gpu(0, uid="GPU-p")]
    feeder.feed(g, start=t0, hours=1, fn=idle)
    feeder.feed(g, start=t0 + H, hours=1, fn=busy(50))
    # Half an hour of data, then nothing until the last hour.
    feeder.feed(g, start=t0 + 2 * H, hours=0.5, fn=held)
    feeder.feed(g, start=t0 + 4 * H, hours=1, fn=held)
    tl = run(analyst, sessions, t0, t0 + 5 * H)
    assert tl.starts == [t0 + i * H for i in range(5)] and tl.step == HOUR
    b = tl.rows[""]
    only(b[0], idle_h=1.0, cost=RATE, idle_cost=RATE)
    only(b[1], active_h=1.0, cost=RATE)
    only(b[2], idle_held_h=0.5, offline_h=0.5, cost=RATE / 2, idle_held_cost=RATE / 2)
    only(b[3], offline_h=1.0)
    assert b[4].idle_held_h == pytest.approx(1.0) and b[4].waste == pytest.approx(RATE)
    assert b[3].state_hours == {
        "active": 0,
        "idle-held": 0,
        "idle": 0,
        "unpartitioned": 0,
        "unknown": 0,
        "offline": pytest.approx(1.0),
    }
    # A current window of 2 hours against the previous 2, and the buckets summed over rows.
    assert tl.total(start=t0 + 3 * H, end=t0 + 5 * H).waste == pytest.approx(RATE)
    assert tl.total(start=t0 + H, end=t0 + 3 * H).waste == pytest.approx(RATE / 2)
    assert tl.total(start=t0 + H, end=t0 + 3 * H).offline_h == pytest.approx(0.5)
    assert [f.gpu_hours for f in tl.buckets()] == pytest.approx([1, 1, 0.5, 0, 1])


def test_mig_buckets_by_hand(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    """A 3g slice held and a 2g slice busy on an A100 with 2 free slices, the second hour without its 2g."""
    t0 = feeder.t0
    uid = "GPU-mig"
    first = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g"), mig_slice(2, "2g.10gb")])
    feeder.feed([first], start=t0, hours=1, fn={uid: idle, "MIG-3g": held, first["slices"][1]["uuid"]: busy(70)})
    then = gpu(0, uid=uid, mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")])
    feeder.feed([then], start=t0 + H, hours=1, fn={uid: idle, "MIG-3g": held})
    b = run(analyst, sessions, t0, t0 + 2 * H).rows[""]
    assert b[0].idle_held_h == pytest.approx(3 / 7) and b[0].active_h == pytest.approx(2 / 7)
    assert b[0].unpartitioned_h == pytest.approx(2 / 7) and b[0].idle_h == 0
    assert b[0].idle_cost == pytest.approx(2 / 7 * RATE) and b[0].idle_held_cost == pytest.approx(3 / 7 * RATE)
    assert b[1].unpartitioned_h == pytest.approx(4 / 7) and b[1].active_h == 0
    assert b[1].waste == pytest.approx(RATE)
    assert b[0].cost == b[1].cost == pytest.approx(RATE)
    assert b[0].offline_h == b[1].offline_h == 0


def test_a_slice_of_unknown_size_is_left_out(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    t0 = feeder.t0
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    feeder.feed([g], start=t0, hours=1, fn=idle)
    b = run(analyst, sessions, t0, t0 + H).rows[""][0]
    # Only the 3g slice: the unsized one has no GPU-hours, and with it in the layout nothing is free.
    only(b, idle_h=3 / 7, cost=3 / 7 * RATE, idle_cost=3 / 7 * RATE)


def test_daily_buckets_with_a_partial_first_day(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    now = datetime.now(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if now - midnight < 5 * H:
        midnight -= DAY
    start = midnight - 3 * H
    feeder.feed([gpu(0)], start=start, hours=6, step_s=300, fn=idle)
    at = midnight + 4 * H
    # A window that reaches now (`at`), ending on the next hour: today's daily row is read whole.
    end = midnight + 5 * H
    assert reads(start, end, at, DAY) == [(PARTIAL, start, midnight), (DAILY, midnight, midnight + DAY)]
    tl = run(analyst, sessions, start, end, now=at, step=DAY)
    assert tl.starts == [midnight - DAY, midnight] and tl.step == DAY
    first, second = tl.rows[""]
    only(first, idle_h=3.0, cost=3 * RATE, idle_cost=3 * RATE)
    # Expected until `at`, data until midnight + 3 h.
    assert second.idle_h == pytest.approx(3.0) and second.offline_h == pytest.approx(1.0)
    assert_same(tl.total(), analyst.waste(start, end, now=at).totals)
    # A span that ends mid-day in the past reads the hours of its last day.
    end = midnight + 2 * H
    assert reads(start, end, at, DAY) == [(PARTIAL, start, midnight), (PARTIAL, midnight, end)]
    tl = run(analyst, sessions, start, end, now=at, step=DAY)
    assert [f.idle_h for f in tl.rows[""]] == pytest.approx([3.0, 2.0])
    assert tl.total(start=midnight).idle_h == pytest.approx(2.0)
    assert tl.total(end=midnight).idle_h == pytest.approx(3.0)


def test_offline_starts_when_a_gpu_is_first_seen(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0 + H / 2, hours=0.5, fn=idle)
    b = run(analyst, sessions, t0, t0 + 4 * H).rows[""]
    assert [f.idle_h for f in b] == pytest.approx([0.5, 0, 0, 0])
    assert [f.offline_h for f in b] == pytest.approx([0, 1, 1, 1])
    # Daily buckets over the same hours: a span that ends mid-day in the past reads them hour by hour.
    b = run(analyst, sessions, t0, t0 + 4 * H, now=t0 + 10 * H, step=DAY).rows[""]
    assert sum(f.offline_h for f in b) == pytest.approx(3.0) and sum(f.idle_h for f in b) == pytest.approx(0.5)


def test_offline_is_floored_per_gpu_on_gpu_rows(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    """Analysed at t0 + 1.5 h, GPU-a has data past that now, which must not hide that GPU-b sent nothing. Rows of
    single GPUs floor each GPU; rows of whole instances floor per instance (data past now does not happen)."""
    t0 = feeder.t0

    def first_hour(uid: str, t: datetime) -> dict[str, Any] | None:
        return idle(uid, t) if t < t0 + H else None

    feeder.feed([gpu(0, uid="GPU-a"), gpu(1, uid="GPU-b")], start=t0, hours=2, fn={"GPU-a": idle, "GPU-b": first_hour})
    at = t0 + 3 * H / 2
    pks = gpu_pks(analyst, sessions, t0)
    rows = run(analyst, sessions, t0, t0 + 2 * H, now=at, row_of={pk: uid for uid, pk in pks.items()}).rows
    assert [f.offline_h for f in rows["GPU-b"]] == pytest.approx([0, 0.5])
    assert [f.offline_h for f in rows["GPU-a"]] == pytest.approx([0, 0])
    assert analyst.waste(t0, t0 + 2 * H, now=at).totals.offline_h == pytest.approx(0.5)


def test_rows_and_gpus_left_out(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    t0 = feeder.t0
    sliced = gpu(1, uid="GPU-mig", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")], unpartitioned=4)
    feeder.feed([gpu(0, uid="GPU-a"), sliced], start=t0, hours=1, fn=idle, instance_id="i-a")
    feeder.feed([gpu(0, uid="GPU-b")], start=t0, hours=1, fn=busy(90), instance_id="i-b")
    feeder.feed([gpu(0, uid="GPU-c")], start=t0, hours=1, fn=held, instance_id="i-c")
    pks = gpu_pks(analyst, sessions, t0)
    row_of = {pks["GPU-a"]: "team-a", pks["GPU-mig"]: "team-a", pks["GPU-b"]: "team-b", 999_999: "nobody"}
    tl = run(analyst, sessions, t0, t0 + H, row_of=row_of)
    assert list(tl.rows) == ["team-a", "team-b", "nobody"]
    a = tl.total("team-a")
    # GPU-a idle, plus the MIG GPU's slice (3/7, idle) and its free capacity (4/7), all in team-a.
    assert a.idle_h == pytest.approx(1 + 3 / 7) and a.unpartitioned_h == pytest.approx(4 / 7)
    assert a.cost == pytest.approx(2 * RATE)
    assert tl.total("team-b").active_h == pytest.approx(1.0)
    assert tl.total("nobody") == BucketFigures()
    # GPU-c is in no row: its idle-held hour is nowhere.
    assert tl.total().idle_held_h == 0
    with pytest.raises(KeyError):
        tl.total("team-c")


def test_bad_arguments_raise(analyst: Analyst, sessions: Any) -> None:
    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match="rollup bound"):
        run(analyst, sessions, t0, t0 + H, thresholds=Thresholds(idle_util_pct=7))
    with pytest.raises(ValueError, match="step"):
        run(analyst, sessions, t0, t0 + H, step=timedelta(minutes=5))
    with pytest.raises(ValueError, match="hour"):
        run(analyst, sessions, t0 + timedelta(minutes=30), t0 + H)


def test_window_totals_read_as_the_window_analysis(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    """A window's totals from the daily per-instance rows and the hours around them match the analysis and the
    hour-by-hour timeline of the same window."""
    mixed_fleet(feeder)
    t0 = feeder.t0
    window = Window(start=t0 - 20 * H, end=t0 + 4 * H, now=t0 + 4 * H, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        got = window_totals(session, fleet, window, thresholds=analyst.thresholds)
    assert_same(got, analyst.waste(window.start, window.end).totals)
    hourly = run(analyst, sessions, window.start, window.end).total()
    assert astuple(got) == pytest.approx(astuple(hourly))
