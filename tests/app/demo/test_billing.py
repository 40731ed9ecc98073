"""The demo's bill and spot prices: lines that match the fleet, imported through the real path, and the report by
instance that they price."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from app.billing.spot import SpotPool
from app.billing.tables import billed_hours
from app.demo import billing, history
from app.demo.fleet import DAY, DEFAULT_INSTANCES, GRID_S, HOUR, STORIES, DemoFleet, SimInstance, make_fleet
from app.main import create_app
from app.settings import Settings
from tests.conftest import make_token

DAYS = 7
FINE_S = 60
EPOCH = 1_795_000_000 // GRID_S * GRID_S  # 2026-11-18 11:05 UTC
P5_USD = 55.04
P4D_USD = 21.957642


def fleet_of(size: int = DEFAULT_INSTANCES, epoch: int = EPOCH) -> DemoFleet:
    return make_fleet(size, seed=1, epoch=epoch)


def named(fleet: DemoFleet, name: str) -> SimInstance:
    return next(i for i in fleet.instances if i.tags["Name"] == name)


def block_instance(fleet: DemoFleet) -> SimInstance:
    return next(i for i in fleet.instances if i.story.capacity_block)


def lines_of(lines: list[Any], instance_id: str, line_type: str = "Usage") -> list[Any]:
    return [x for x in lines if x.resource_id == instance_id and x.line_item_type == line_type]


# --------------------------------------------------------------------------------------------------------------
# The lines, without a database


def test_each_spot_pool_changes_price_once_or_twice_mid_hour() -> None:
    fleet = fleet_of()
    begin = EPOCH - 14 * DAY
    spot = billing.spot_history(fleet, begin=begin)
    assert spot == billing.spot_history(fleet_of(), begin=begin)
    assert set(spot) == {SpotPool(i.story.instance_type, i.zone) for i in fleet.instances if i.spot}
    for changes in spot.values():
        (first, _usd), *later = changes
        assert first < begin and 1 <= len(later) <= 2
        assert all(begin < at < EPOCH - DAY and at % HOUR != 0 for at, _usd in later)
    # An hour across a change costs each price for its seconds.
    pool = next(iter(spot))
    (_t, before), (at, after), *_ = spot[pool]
    hour = at // HOUR * HOUR
    expected = (before * (at - hour) + after * (hour + HOUR - at)) / HOUR
    assert billing.spot_usd(spot[pool], hour, hour + HOUR) == pytest.approx(expected)


def test_the_bill_follows_the_fleet_and_runs_a_day_behind() -> None:
    fleet = fleet_of()
    begin = EPOCH - 14 * DAY
    until = (EPOCH // HOUR - billing.BILL_LAG_H) * HOUR
    lines = billing.bill_lines(fleet, begin=begin, until=until)
    assert {x.payer_account for x in lines} == {billing.PAYER}
    assert max(x.start for x in lines if x.resource_id) == datetime.fromtimestamp(until - HOUR, UTC)

    g5 = named(fleet, "vision-finetune-dev")
    hours = lines_of(lines, g5.instance_id)
    assert (hours[0].instance_type, hours[0].availability_zone) == ("g5.xlarge", g5.zone)
    assert sum(x.usage_amount for x in hours) == pytest.approx((until - begin) / HOUR)
    assert [x.unblended_cost / x.usage_amount for x in hours] == [pytest.approx(1.006)] * len(hours)

    p4d = named(fleet, "llm-pretrain-a")
    [covered] = {x.line_item_type for x in lines if x.resource_id == p4d.instance_id}
    assert covered == "SavingsPlanCoveredUsage"
    plan = lines_of(lines, p4d.instance_id, covered)
    assert [x.savings_plan_effective_cost / x.usage_amount for x in plan] == [pytest.approx(P4D_USD * 0.72)] * len(plan)

    # A spot instance is billed only while it runs, at its pool's price in force.
    spot = named(fleet, "embeddings-spot")
    ran = sum(b - a for a, b in billing.running(fleet, spot, begin, until))
    spot_lines = lines_of(lines, spot.instance_id)
    assert sum(x.usage_amount for x in spot_lines) == pytest.approx(ran / HOUR)
    assert ran < until - begin - HOUR
    assert {x.pricing_term for x in spot_lines} == {"Spot"}


def test_the_capacity_block_is_a_fee_and_hours_billed_nothing() -> None:
    fleet = fleet_of()
    inst = block_instance(fleet)
    block = fleet.block(inst)
    assert block is not None
    lines = billing.bill_lines(fleet, begin=EPOCH - 14 * DAY, until=(EPOCH // HOUR - billing.BILL_LAG_H) * HOUR)
    [fee] = [x for x in lines if x.line_item_type == "Fee"]
    assert fee.unblended_cost == pytest.approx(billing.BLOCK_USD_PER_HOUR * 96)
    used = lines_of(lines, inst.instance_id)
    assert {x.unblended_cost for x in used} == {0.0}
    unused = [x for x in lines if x.capacity_reservation_status == "Unused"]
    stopped = (block.down[1] - block.down[0]) / HOUR
    assert sum(x.usage_amount for x in unused) == pytest.approx(stopped)
    assert sum(x.usage_amount for x in used) + stopped == pytest.approx(96)


# --------------------------------------------------------------------------------------------------------------
# Imported, and read back through the report


@dataclass
class Shipped:
    fleet: DemoFleet
    shipped: billing.Shipped
    begin: int
    until: int
    report: dict[str, dict[str, Any]]
    """GET /api/v1/report?window=30d&group_by=instance, rows by instance id."""


@pytest.fixture(scope="module")
def demo_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def shipped(
    module_sessions: sessionmaker[Session], demo_client: TestClient, tmp_path_factory: pytest.TempPathFactory
) -> Shipped:
    """A week of the stories' spot instances and Capacity Block instance up to now, their bill and spot history."""
    now = time.time()
    epoch = int(now) // GRID_S * GRID_S
    fleet = fleet_of(len(STORIES), epoch)
    hosts = [h for h in history.make_hosts(fleet, FINE_S) if h.inst.spot or h.inst.story.capacity_block]
    begin = epoch - DAYS * DAY
    history.register(module_sessions, hosts, first=begin)
    starts = {h.inst.instance_id: float(begin) for h in hosts}
    history.write_history(
        module_sessions, fleet, hosts, starts=starts, end=float(epoch), fine_s=FINE_S, mem_held_mib=256
    )
    done = billing.ship_billing(module_sessions, fleet, tmp_path_factory.mktemp("demo"), begin=begin, now=now)
    token = make_token(module_sessions, "read")
    answer = demo_client.get(
        "/api/v1/report",
        params={"window": "30d", "group_by": "instance"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    rows = {r["group"]["instance"]: r for r in answer.json()["rows"]}
    return Shipped(fleet, done, begin, (int(now) // HOUR - billing.BILL_LAG_H) * HOUR, rows)


def test_spot_instances_are_priced_from_the_bill_then_the_spot_history(shipped: Shipped) -> None:
    spot = [i for i in shipped.fleet.instances if i.spot]
    assert len(spot) == 3
    for inst in spot:
        row = shipped.report[inst.instance_id]
        assert set(row["price_sources"]) == {"billed", "spot history"}, row["price_sources"]
        assert row["price_sources"]["billed"] > 0.5
        assert row["price_source"] == "billed; spot history"


def test_the_unmonitored_instance_is_billed_with_no_agent(
    shipped: Shipped, module_sessions: sessionmaker[Session]
) -> None:
    lost = shipped.shipped.unmonitored
    with module_sessions() as session:
        hours = session.execute(
            select(billed_hours.c.instance_type, billed_hours.c.usage_h, billed_hours.c.usd).where(
                billed_hours.c.instance_id == lost.instance_id
            )
        ).all()
        agents = session.scalar(text("SELECT count(*) FROM instances WHERE instance_id = :i"), {"i": lost.instance_id})
    assert agents == 0 and lost.instance_id not in shipped.report
    assert {h.instance_type for h in hours} == {"p4d.24xlarge"}
    assert sum(h.usage_h for h in hours) == pytest.approx((shipped.until - shipped.begin) / HOUR)
    assert shipped.shipped.unmonitored_usd == pytest.approx(sum(h.usage_h for h in hours) * P4D_USD)
    line = shipped.shipped.summary("http://127.0.0.1:8000/")
    assert f"payer {billing.PAYER}" in line
    assert f"unmonitored (no agent): {lost.instance_id} (p4d.24xlarge) ${shipped.shipped.unmonitored_usd:,.2f}" in line
    assert line.endswith("GET http://127.0.0.1:8000/api/v1/billing")


def test_the_capacity_block_instance_pays_for_its_offline_hours(
    shipped: Shipped, module_sessions: sessionmaker[Session]
) -> None:
    inst = block_instance(shipped.fleet)
    block = shipped.fleet.block(inst)
    assert block is not None
    with module_sessions() as session:
        billed = session.execute(
            select(billed_hours.c.hour, billed_hours.c.usage_h, billed_hours.c.usd, billed_hours.c.reservation_kind)
            .where(billed_hours.c.instance_id == inst.instance_id)
            .order_by(billed_hours.c.hour)
        ).all()
    assert {h.reservation_kind for h in billed} == {"capacity block"}
    assert {round(h.usd / h.usage_h, 6) for h in billed} == {billing.BLOCK_USD_PER_HOUR}
    stopped = {int(h.hour.timestamp()) for h in billed} & set(range(block.down[0] + HOUR, block.down[1], HOUR))
    assert stopped == set(), "no billed hour while stopped: the bill has its block's unused hours instead"

    row = shipped.report[inst.instance_id]
    assert row["price_sources"] == {"billed": 1.0}
    stopped_h = (block.down[1] - block.down[0]) / HOUR
    assert row["offline_h"] >= 8 * stopped_h - 1e-6  # eight GPUs
    # The offline hours are paid, at the block's price, as idle waste.
    assert row["idle_cost"] == pytest.approx(row["offline_h"] / 8 * billing.BLOCK_USD_PER_HOUR, rel=1e-6)
    assert row["cost"] >= billing.BLOCK_USD_PER_HOUR * 96 - 1e-6


def test_a_demo_started_again_imports_nothing_new(shipped: Shipped, module_sessions: sessionmaker[Session]) -> None:
    root = shipped.shipped.root
    again = billing.ship_billing(module_sessions, shipped.fleet, root.parent, begin=shipped.begin, now=time.time())
    if (int(time.time()) // HOUR - billing.BILL_LAG_H) * HOUR == shipped.until:
        assert [r.status for r in again.exports] == ["unchanged"] * len(again.exports)
    assert again.unmonitored_usd == pytest.approx(shipped.shipped.unmonitored_usd, rel=0.01)
