"""Each instance's price now: the piece covering the current hour, else the newest billed hour of the last 72 h,
else its own price; and the time-weighted mean price over a span."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import ONLINE, InstanceInfo
from app.analyse.price_now import BILL_LAG, mean_price, price_at, prices_now
from app.analyse.window import Window
from app.billing.prices import BILLED, SPOT_HISTORY, PricePiece, remake_billed_prices
from app.billing.tables import spot_prices
from app.db import session_scope
from app.pricing.resolve import Price
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder, idle
from tests.app.analyse.test_priced import bill as bill_hours
from tests.factories import gpu

H = timedelta(hours=1)
T = datetime(2026, 11, 20, 12, tzinfo=UTC)


def bill(
    sessions: sessionmaker[Session],
    instance_id: str,
    hours: Iterable[datetime],
    usd_per_hour: float,
    instance_type: str = "p4d.24xlarge",
) -> None:
    """Bill the instance `usd_per_hour` for each of `hours`, and merge the bill into prices."""
    with session_scope(sessions) as s:
        bill_hours(s, instance_id, instance_type, dict.fromkeys(hours, usd_per_hour), None)
        remake_billed_prices(s)


def spot_history(
    sessions: sessionmaker[Session], prices: list[tuple[datetime, float]], zone: str = "us-east-1b"
) -> None:
    """The g5.xlarge spot pool of `zone`: each (from when, USD/h)."""
    with session_scope(sessions) as s:
        s.execute(
            insert(spot_prices),
            [
                {"instance_type": "g5.xlarge", "availability_zone": zone, "ts": ts, "usd_per_hour": usd}
                for ts, usd in prices
            ],
        )


def instance(price: Price, pk: int = 1) -> InstanceInfo:
    return InstanceInfo(
        pk, f"i-{pk}", None, "p4d.24xlarge", "us-east-1", "us-east-1a", "on-demand", {}, None, None, {},
        T - 100 * H, T, price, None, ONLINE, T,
    )  # fmt: skip


CATALOG = Price(32.0, 8, 4.0, "catalog on-demand")
"""An instance at $4 per GPU-hour of its own, from the catalog."""


def piece(start: datetime, hours: int, usd: float, source: str = BILLED) -> PricePiece:
    return PricePiece(start, start + hours * H, usd, source)


def test_the_piece_covering_the_current_hour_is_the_price_now() -> None:
    inst = instance(CATALOG)
    now = T + timedelta(minutes=20)
    found = price_at(inst, [piece(T - 5 * H, 3, 40.0), piece(T - 2 * H, 3, 16.0, SPOT_HISTORY)], now)
    assert found.usd_per_gpu_hour == pytest.approx(2.0) and found.usd_per_instance_hour == 16.0
    assert (found.source, found.detail) == (SPOT_HISTORY, SPOT_HISTORY)


def test_the_newest_billed_hour_stands_for_now_within_72_hours() -> None:
    inst = instance(CATALOG)
    now = T + timedelta(minutes=20)
    # The bill lags: its newest hour ended 30 h ago.
    found = price_at(inst, [piece(T - 40 * H, 5, 40.0), piece(T - 35 * H, 5, 24.0)], now)
    assert found.usd_per_gpu_hour == pytest.approx(3.0) and found.source == BILLED
    assert found.detail == f"billed to {T - 30 * H:%Y-%m-%d %H:%M} UTC"
    # Older than that, the bill says nothing of now: the instance's own price.
    old = price_at(inst, [piece(now - BILL_LAG - 3 * H, 2, 24.0)], now)
    assert (old.usd_per_gpu_hour, old.source, old.detail) == (4.0, "catalog", "catalog on-demand")
    assert price_at(inst, [], now) == old


def test_capacity_the_bill_shows_ending_does_not_stand_for_now() -> None:
    """A p4d ran in a Capacity Block until 30 h ago: the block's price is not what it costs now."""
    inst = instance(CATALOG)
    now = T + timedelta(minutes=20)
    block = PricePiece(T - 40 * H, T - 30 * H, 20.0, BILLED, paid_offline=True)
    assert price_at(inst, [block], now).source == "catalog"
    assert price_at(inst, [piece(T - 50 * H, 10, 24.0), block], now).source == "catalog"
    assert price_at(inst, [block, piece(T - 30 * H, 2, 24.0)], now).usd_per_instance_hour == 24.0


def test_a_piece_of_an_instance_of_unknown_gpu_count_has_no_price_per_gpu() -> None:
    inst = instance(Price(32.0, None, None, "no price: no GPU count for x (none seen)"))
    found = price_at(inst, [piece(T, 1, 40.0)], T)
    assert found.usd_per_gpu_hour is None and found.source is None and not found.known


def test_mean_price_weighs_each_price_by_its_time() -> None:
    inst = instance(CATALOG)
    start, end = T - 4 * H + timedelta(minutes=30), T
    # Half an hour and an hour at the own $4, two hours billed at $2 per GPU-hour ($16/h), then $4 again.
    rate, sources = mean_price(inst, [piece(T - 3 * H, 2, 16.0)], start, end)
    assert rate == pytest.approx((1.5 * 4 + 2 * 2) / 3.5)
    assert sources == pytest.approx({"catalog": 1.5 * 4 / 3.5, BILLED: 2 * 2 / 3.5})
    assert list(sources) == ["catalog", BILLED]  # largest share first


def test_mean_price_leaves_time_with_no_price_out_of_the_money() -> None:
    unpriced = instance(Price(None, 8, None, "no price: p5e.48xlarge is not in the catalog"))
    rate, sources = mean_price(unpriced, [piece(T - 1 * H, 1, 16.0)], T - 4 * H, T)
    assert rate == pytest.approx(2.0 / 4) and sources == pytest.approx({BILLED: 0.5})
    assert mean_price(unpriced, [], T - 4 * H, T) == (None, {})


def test_prices_now_of_a_fleet(feeder: Feeder, analyst: Analyst, sessions: sessionmaker[Session]) -> None:
    t0 = feeder.t0
    now = t0 + 3 * H + timedelta(minutes=10)
    for name in ("i-billed", "i-lagging", "i-old-bill", "i-catalog"):
        feeder.feed([gpu(0)], start=t0, hours=3, fn=idle, instance_id=name)
    spot = {"instance_type": "g5.xlarge", "lifecycle": "spot", "availability_zone": "us-east-1b"}
    feeder.feed([gpu(0, name="NVIDIA A10G")], start=t0, hours=3, fn=idle, instance_id="i-spot", **spot)
    bill(sessions, "i-billed", [t0 + i * H for i in range(4)], 40.0)
    bill(sessions, "i-lagging", [t0 - 30 * H, t0 - 29 * H], 24.0)
    bill(sessions, "i-old-bill", [t0 - 80 * H], 24.0)
    # The pool's last read price holds until the next read.
    spot_history(sessions, [(t0 - 24 * H, 0.40), (t0 + 2 * H, 0.55)])
    with sessions() as session:
        fleet = analyst.fleet(session, Window(start=t0, end=now, now=now, label="test"))
        found = prices_now(session, fleet.instances.values(), now)
    prices = {i.instance_id: found[i.pk] for i in fleet.instances.values()}
    assert prices["i-billed"].usd_per_gpu_hour == pytest.approx(40.0 / 8) and prices["i-billed"].source == BILLED
    assert prices["i-lagging"].usd_per_gpu_hour == pytest.approx(3.0) and prices["i-lagging"].source == BILLED
    assert prices["i-lagging"].detail.startswith("billed to ")
    assert prices["i-spot"].usd_per_gpu_hour == pytest.approx(0.55) and prices["i-spot"].source == SPOT_HISTORY
    for name in ("i-old-bill", "i-catalog"):
        assert prices[name].usd_per_gpu_hour == pytest.approx(P4D_PER_GPU_HOUR) and prices[name].source == "catalog"
