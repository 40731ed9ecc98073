"""The charts over time priced hour by hour (app/analyse/series_prices.py): a bill whose price changes mid-day and a
Capacity Block paid while its agent is silent, worked out by hand and against the window analysis, which prices
the same pieces its own way (app/analyse/priced.py)."""

from __future__ import annotations

from dataclasses import astuple
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import FilterOptions, Fleet, InstanceInfo
from app.analyse.hour_of_week import waste_by_hour_of_week
from app.analyse.series_prices import series_prices
from app.analyse.timeline import BucketFigures, Timeline, row_totals, window_totals
from app.analyse.window import DAY, HOUR, Window, floor_day
from app.billing.prices import BILLED, SPOT_HISTORY, PricePiece, remake_billed_prices
from app.db import session_scope
from app.pricing.resolve import Price
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, busy, held, idle
from tests.app.analyse.test_priced import P5_HOUR, bill
from tests.app.analyse.test_timeline import assert_same, gpu_pks, run
from tests.conftest import make_token
from tests.factories import gpu, mig_slice

H = HOUR
OWN = P4D_PER_GPU_HOUR
BILLED_ID, PLAIN, BLOCK = "i-0d00000000000000d", "i-0e00000000000000e", "i-0c00000000000000c"
MONEY = ("cost", "idle_cost", "idle_held_cost", "unpriced_gpu_hours")


def rate_at(h: int) -> float:
    """The billed instance's price in hour `h` of the story, USD per GPU-hour: its own, then billed at $24/h from
    04:00 and $16/h from 10:00 on the first day to the end of the second, then its own again."""
    if 4 <= h < 10:
        return 24 / 8
    if 10 <= h < 48:
        return 16 / 8
    return OWN


@pytest.fixture
def story(feeder: Feeder, sessions: sessionmaker[Session]) -> datetime:
    """Three whole past UTC days from `d`. The billed p4d: GPU-a idle 12 h, busy 24 h, then held; GPU-b idle; an
    A100 in MIG mode with a busy 3g slice and 4 slices free. The plain p4d: one GPU held, at its own price."""
    d = floor_day(datetime.now(UTC)) - 3 * DAY

    def gpu_a(uid: str, t: datetime) -> dict[str, Any]:
        h = (t - d) // H
        return idle(uid, t) if h < 12 else busy(60)(uid, t) if h < 36 else held(uid, t)

    sliced = gpu(2, uid="GPU-mig", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")], unpartitioned=4)
    story = {"GPU-a": gpu_a, "GPU-b": idle, "GPU-mig": idle, "MIG-3g": busy(30)}
    devices = [gpu(0, uid="GPU-a"), gpu(1, uid="GPU-b"), sliced]
    feeder.feed(devices, start=d, hours=72, step_s=300, fn=story, instance_id=BILLED_ID)
    feeder.feed([gpu(0, uid="GPU-own")], start=d, hours=72, step_s=300, fn=held, instance_id=PLAIN)
    with session_scope(sessions) as s:
        bill(s, BILLED_ID, "p4d.24xlarge", {d + h * H: 24.0 if h < 10 else 16.0 for h in range(4, 48)}, None)
        remake_billed_prices(s)
    return d


def by_gpu(analyst: Analyst, sessions: Any, d: datetime) -> dict[int, str]:
    """Rows of single GPUs: the billed instance's GPUs are split between rows, which takes the device path."""
    return {pk: uid for uid, pk in gpu_pks(analyst, sessions, d).items()}


def money(f: BucketFigures) -> tuple[float, ...]:
    return tuple(getattr(f, name) for name in MONEY)


def test_hourly_buckets_at_each_hours_price(feeder: Feeder, analyst: Analyst, sessions: Any, story: datetime) -> None:
    d = story
    hours = range(72)
    gpus = run(analyst, sessions, d, d + 72 * H, row_of=by_gpu(analyst, sessions, d))
    a = gpus.rows["GPU-a"]
    assert [f.cost for f in a] == pytest.approx([rate_at(h) for h in hours])
    assert [f.idle_cost for f in a] == pytest.approx([rate_at(h) if h < 12 else 0 for h in hours])
    assert [f.idle_held_cost for f in a] == pytest.approx([rate_at(h) if h >= 36 else 0 for h in hours])
    assert [f.cost for f in gpus.rows["GPU-own"]] == pytest.approx([OWN] * 72)
    # The MIG GPU: its busy 3g slice and its free capacity (3/7 + 4/7 of the GPU), all at the hour's price.
    mig = gpus.rows["GPU-mig"]
    assert [f.cost for f in mig] == pytest.approx([rate_at(h) for h in hours])
    assert [f.idle_cost for f in mig] == pytest.approx([4 / 7 * rate_at(h) for h in hours])
    # Rows of whole instances (the per-instance rollups) give the same hours.
    fleet = run(analyst, sessions, d, d + 72 * H).buckets()
    assert [f.cost for f in fleet] == pytest.approx([3 * rate_at(h) + OWN for h in hours])
    assert [f.waste for f in fleet] == pytest.approx([f.waste for f in gpus.buckets()])


def day_sums(hourly: Timeline, row: str | None = None) -> list[tuple[float, ...]]:
    """The hourly buckets' money summed per UTC day."""
    out: dict[datetime, list[float]] = {}
    for t, f in zip(hourly.starts, hourly.buckets() if row is None else hourly.rows[row], strict=True):
        acc = out.setdefault(floor_day(t), [0.0] * len(MONEY))
        for n, value in enumerate(money(f)):
            acc[n] += value
    return [tuple(v) for v in out.values()]


def test_daily_buckets_are_the_sum_of_their_hours(
    feeder: Feeder, analyst: Analyst, sessions: Any, story: datetime
) -> None:
    """The first day is cut by the bill's boundaries (read hour by hour), the second lies inside one price (its daily
    row at that price), the third outside every piece (at the instance's own price)."""
    d = story
    for start in (d, d + 6 * H):
        end = d + 72 * H
        for row_of in (None, by_gpu(analyst, sessions, d)):
            hourly = run(analyst, sessions, start, end, row_of=row_of)
            daily = run(analyst, sessions, start, end, step=DAY, row_of=row_of)
            assert daily.starts == [d, d + DAY, d + 2 * DAY]
            rows = [None] if row_of is None else list(daily.rows)
            for row in rows:
                got = [money(f) for f in (daily.buckets() if row is None else daily.rows[row])]
                assert got == [pytest.approx(s) for s in day_sums(hourly, row)], row
    gpus = run(analyst, sessions, d, d + 72 * H, step=DAY, row_of=by_gpu(analyst, sessions, d))
    assert [f.cost for f in gpus.rows["GPU-a"]] == pytest.approx([4 * OWN + 6 * 3 + 14 * 2, 24 * 2, 24 * OWN])
    assert [f.idle_cost for f in gpus.rows["GPU-a"]] == pytest.approx([4 * OWN + 6 * 3 + 2 * 2, 0, 0])
    assert [f.idle_held_cost for f in gpus.rows["GPU-a"]] == pytest.approx([0, 12 * 2, 24 * OWN])


def test_totals_are_the_window_analysis(feeder: Feeder, analyst: Analyst, sessions: Any, story: datetime) -> None:
    """Windows whose first day is read as its daily row less the hours before (cut by the bill: read hour by hour),
    or as its hours, and whose last day is read as its hours."""
    d = story
    for start, end in ((d, d + 72 * H), (d + 6 * H, d + 72 * H), (d + 2 * H, d + 60 * H), (d + 14 * H, d + 47 * H)):
        window = Window(start=start, end=end, now=d + 72 * H, label="test")
        a = analyst.waste(start, end, now=window.now)
        with sessions() as session:
            fleet = analyst.fleet(session, window)
            total = window_totals(session, fleet, window, thresholds=analyst.thresholds)
            index = {inst.instance_id: n for n, inst in enumerate(fleet.instances.values())}
            rows = {pk: index[inst.instance_id] for pk, inst in fleet.instances.items()}
            per_instance = row_totals(session, fleet, window, thresholds=analyst.thresholds, rows=rows)
        assert_same(total, a.totals)
        for group in a.group("instance"):
            assert_same(per_instance[index[group.key]], group.figures)
        assert astuple(total) == pytest.approx(astuple(run(analyst, sessions, start, end, now=window.now).total()))
    assert a.totals.cost == pytest.approx(sum(3 * rate_at(h) + OWN for h in range(14, 47)))


def test_hour_of_week_is_the_waste_at_those_prices(
    feeder: Feeder, analyst: Analyst, sessions: Any, story: datetime
) -> None:
    d = story
    now = d + 72 * H
    with sessions() as session:
        fleet = analyst.fleet(session, Window(start=d, end=now, now=now, label="test"))
        grid = waste_by_hour_of_week(session, fleet, start=d, end=now, now=now, thresholds=analyst.thresholds)
    assert grid.total == pytest.approx(analyst.waste(d, now).totals.waste)
    # 05:00 on the first day: GPU-a and GPU-b idle and 4/7 of the MIG GPU free at $3, the plain GPU held at its own.
    assert grid.usd[d.weekday()][5] == pytest.approx((2 + 4 / 7) * 3.0 + OWN)
    assert grid.usd[(d + 2 * DAY).weekday()][5] == pytest.approx((3 + 4 / 7) * OWN)


def test_capacity_paid_while_offline_costs_as_idle(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    """A p5 in a Capacity Block: one GPU sends data for an hour, the other for two, then nothing; the block is
    billed at hours 0 and 3 and paid throughout: each silent GPU-hour costs the block's price, as idle waste."""
    t0 = feeder.t0

    def first_hour(uid: str, t: datetime) -> dict[str, Any] | None:
        return busy(50.0)(uid, t) if t < t0 + H else None

    h100 = "NVIDIA H100 80GB HBM3"
    feeder.feed(
        [gpu(0, uid="GPU-p0", name=h100), gpu(1, uid="GPU-p1", name=h100)],
        start=t0,
        hours=2,
        fn={"GPU-p0": first_hour, "GPU-p1": busy(50.0)},
        instance_id=BLOCK,
        instance_type="p5.48xlarge",
    )
    with session_scope(sessions) as s:
        bill(s, BLOCK, "p5.48xlarge", {t0: P5_HOUR, t0 + 3 * H: P5_HOUR}, "capacity block")
        remake_billed_prices(s)
    p5 = P5_HOUR / 8
    end = t0 + 4 * H
    hourly = run(analyst, sessions, t0, end).rows[""]
    assert [f.cost for f in hourly] == pytest.approx([2 * p5] * 4)
    assert [f.idle_cost for f in hourly] == pytest.approx([0, p5, 2 * p5, 2 * p5])
    assert [f.offline_h for f in hourly] == pytest.approx([0, 1, 2, 2])
    # Rows of single GPUs (the device path).
    gpus = run(analyst, sessions, t0, end, row_of=by_gpu(analyst, sessions, t0)).rows
    assert [f.idle_cost for f in gpus["GPU-p0"]] == pytest.approx([0, p5, p5, p5])
    assert [f.idle_cost for f in gpus["GPU-p1"]] == pytest.approx([0, 0, p5, p5])
    assert [f.cost for f in gpus["GPU-p1"]] == pytest.approx([p5] * 4)
    a = analyst.waste(t0, end)
    assert a.totals.waste == pytest.approx(5 * p5)
    window = Window(start=t0, end=end, now=end, label="test")
    with sessions() as session:
        fleet = analyst.fleet(session, window)
        total = window_totals(session, fleet, window, thresholds=analyst.thresholds)
        grid = waste_by_hour_of_week(session, fleet, start=t0, end=end, now=end, thresholds=analyst.thresholds)
    assert_same(total, a.totals)
    assert_same(run(analyst, sessions, t0, end).total(), a.totals)
    assert_same(run(analyst, sessions, t0, end, step=DAY).total(), a.totals)
    assert grid.total == pytest.approx(5 * p5)
    assert grid.usd[(t0 + 2 * H).weekday()][(t0 + 2 * H).hour] == pytest.approx(2 * p5)


def test_no_bill_is_the_own_price(feeder: Feeder, analyst: Analyst, sessions: Any) -> None:
    t0 = feeder.t0
    feeder.feed([gpu(0)], start=t0, hours=2, fn=idle, instance_id=PLAIN)
    assert [f.cost for f in run(analyst, sessions, t0, t0 + 2 * H).rows[""]] == pytest.approx([OWN, OWN])


def test_the_pages_add_up_to_the_window_analysis(
    client: TestClient, sessions: sessionmaker[Session], story: datetime
) -> None:
    """The overview's trend, the heatmap's rows and cells and the week's cells at each hour's price, against the
    window analysis behind the overview's totals (the 7-day window holds the story)."""
    token = make_token(sessions, "read")

    def get_json(url: str) -> Any:
        r = client.get(url, headers={"Accept": "application/json", "Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text[:2000]
        return r.json()

    overview = get_json("/?window=7d")
    totals = overview["totals"]
    assert totals["cost"] > 0
    assert sum(overview["trend"]["waste_usd"]) == pytest.approx(totals["waste"])
    heat = get_json("/heatmap?window=7d")
    rows = {row["key"]: row for row in heat["rows"]}
    assert sum(row["figures"]["cost"] for row in rows.values()) == pytest.approx(totals["cost"])
    billed = rows[BILLED_ID]
    assert sum(s["waste_usd"] for s in billed["spans"]) == pytest.approx(billed["figures"]["waste"])
    # GPU-a's 12 idle and 36 held hours, GPU-b idle and the MIG GPU's free 4/7 throughout, at the story's prices.
    hours = range(72)
    expected = sum((h < 12 or h >= 36) * rate_at(h) + (1 + 4 / 7) * rate_at(h) for h in hours)
    assert billed["figures"]["waste"] == pytest.approx(expected)
    assert get_json("/heatmap/week?window=7d")["total_usd"] == pytest.approx(totals["waste"])


def _spot_p4d(d: datetime) -> Fleet:
    """A fleet of one spot p4d.24xlarge (instance pk 3) at its catalog price, $24/h for 8 GPUs."""
    inst = InstanceInfo(
        pk=3, instance_id="i-3", hostname=None, instance_type="p4d.24xlarge", region=None, availability_zone=None,
        lifecycle="spot", tags={}, agent_version=None, interval_s=None, agent_errors={}, first_seen=d, last_seen=d,
        price=Price(24.0, 8, 3.0, "catalog"), gpu_model=None, status="online", tracked_until=d,
    )  # fmt: skip
    return Fleet(instances={3: inst}, gpus={}, slices={}, options=FilterOptions([], [], [], []), total_instances=1)


def test_pieces_as_query_arrays() -> None:
    """A piece at the instance's own price changes nothing; two touching pieces at one price are one run; a boundary
    off midnight cuts its day, if the query reads that day's daily row."""
    d = datetime(2026, 3, 2, tzinfo=UTC)
    fleet = _spot_p4d(d)
    pieces = {
        3: [
            PricePiece(d, d + 4 * H, 24.0, BILLED),
            PricePiece(d + 4 * H, d + 10 * H, 32.0, BILLED),
            PricePiece(d + 10 * H, d + 30 * H, 32.0, SPOT_HISTORY),
            PricePiece(d + 30 * H, d + 48 * H, 16.0, BILLED, paid_offline=True),
        ]
    }
    p = series_prices(fleet, pieces, {3}, start=d, end=d + 3 * DAY, daily=[(d, d + 2 * DAY)])
    at = {h: int((d + h * H).timestamp()) for h in (0, 4, 30, 48)}
    # The first four hours at the instance's own price change nothing; the bill and spot at one price are one run.
    assert p.runs == {3: [(at[4], at[30], 2), (at[30], at[48], 3)]}
    assert p.span == (at[0], 72)
    assert (p.cdelta, p.cdnp, p.cpay) == ([0.0, 1.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0])
    assert (p.mpk, p.mday) == ([3, 3], [d, d + DAY])
    assert p.paid == {3: [(d + 30 * H, d + 48 * H, 2.0)]}
    # Daily rows read only from the second day on: the first day's boundary cuts no daily row.
    assert series_prices(fleet, pieces, {3}, start=d, end=d + 3 * DAY, daily=[(d + DAY, d + 3 * DAY)]).mday == [d + DAY]
    # Another instance's pieces, or none at all: the plain queries.
    assert not series_prices(fleet, pieces, {4}, start=d, end=d + 3 * DAY).priced
    assert series_prices(fleet, {}, {3}, start=d, end=d + 3 * DAY).params() == {}


def test_a_part_of_the_span_is_priced_as_if_read_alone() -> None:
    """The days before today and today are queried apart (app/analyse/kept_reads.py): each part's prices, cut from the
    whole span's, are those `series_prices` gives the part itself."""
    d = datetime(2026, 3, 2, tzinfo=UTC)
    fleet = _spot_p4d(d)
    pieces = {
        3: [
            PricePiece(d + 4 * H, d + 10 * H, 32.0, BILLED),
            PricePiece(d + 10 * H, d + 30 * H, 40.0, SPOT_HISTORY),
            PricePiece(d + 30 * H, d + 60 * H, 16.0, BILLED, paid_offline=True),
        ]
    }
    whole = series_prices(fleet, pieces, {3}, start=d, end=d + 3 * DAY, daily=[(d, d + 3 * DAY)])

    for a, b, daily in ((d, d + 2 * DAY, [(d, d + 2 * DAY)]), (d + 2 * DAY, d + 3 * DAY, [(d + 2 * DAY, d + 3 * DAY)])):
        alone = series_prices(fleet, pieces, {3}, start=a, end=b, daily=daily)
        # What the query is given: the classes, the grid of each hour's class, the mixed days.
        assert whole.within(a, b, daily).params() == alone.params()
