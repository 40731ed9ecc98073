"""The demo's bill and spot prices: a Cost and Usage Report 2.0 export of its fleet and the EC2 spot price history
of its spot pools, both simulated (the demo asks AWS nothing), stored through the real import (app/billing/).

The bill follows the history: each instance is billed, hour by hour, for the seconds it ran (a spot instance not
while away, the Capacity Block's instance only inside its block, less its stop), from the history's start to
BILL_LAG_H hours before now, as AWS's export runs a day behind. On-demand hours cost the catalog's price, a few
instances are covered by a Savings Plan, spot hours cost their pool's price in force, second by second, and the
Capacity Block is an upfront fee with $0 hours. One GPU instance in the bill has no agent: the unmonitored one.
"""

from __future__ import annotations

import math
import shutil
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from sqlalchemy import func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from ..billing.cur_writer import (
    CurLine,
    LineFields,
    capacity_block_fee_line,
    capacity_reservation_arn,
    export_path,
    instance_hour_lines,
    unused_capacity_line,
    write_cur,
)
from ..billing.imports import ExportResult, import_source
from ..billing.spot import SpotPool
from ..billing.tables import billed_hours, spot_price_reads, spot_prices
from ..db import session_scope
from ..pricing.catalog import load_catalog
from .fleet import DAY, HOUR, DemoFleet, SimInstance, digest
from .signer import DEMO_ACCOUNT

PAYER = "111122223333"
"""The organization's management account, which pays for the demo's member account (DEMO_ACCOUNT)."""
FOLDER = "billing"
"""Where in the demo's folder the export goes, as `aws s3 sync` would copy one."""
BILL_LAG_H = 25
"""Hours between the end of the newest billed hour and the start of the current one."""
SAVINGS_PLAN_OFF = 0.28
"""What the Savings Plan takes off the on-demand price of the instances it covers."""
SAVINGS_PLAN = frozenset({"llm-pretrain-a", "llm-pretrain-b", "inference-serving", "research-p5"})
"""The instances (Name tag) the Savings Plan covers; the others pay on demand."""
BLOCK_USD_PER_HOUR = 31.464
"""The Capacity Block's price per instance-hour, paid up front: below on-demand, as blocks are."""
BLOCK_BOUGHT_DAYS = 3
"""The block was bought this long before it started."""
UNMONITORED_TYPE = "p4d.24xlarge"
UNMONITORED_TAGS = {"Name": "a100-benchmark-old", "team": "ml-platform"}
SPOT_SHARE_PCT = (30, 45)
"""A pool's first spot price, % of the on-demand price: from the first to the second."""


@dataclass(frozen=True)
class Unmonitored:
    """The GPU instance the bill has and no agent reports."""

    instance_id: str
    instance_type: str
    region: str
    zone: str


def unmonitored(fleet: DemoFleet) -> Unmonitored:
    h = digest(fleet.seed, "unmonitored")
    return Unmonitored(f"i-0{h:016x}", UNMONITORED_TYPE, "us-east-1", "us-east-1" + "abc"[h % 3])


def block_reservation(fleet: DemoFleet) -> str:
    """The Capacity Block's reservation id, `cr-0` and 16 hex digits as EC2 gives them."""
    return f"cr-0{digest(fleet.seed, 'capacity block'):016x}"


def on_demand_usd(instance_type: str) -> float:
    usd = load_catalog()[instance_type].on_demand_usd_per_hour
    assert usd is not None, f"the demo's {instance_type} has a catalog price"
    return usd


# --------------------------------------------------------------------------------------------------------------
# Spot price history


Changes = list[tuple[int, float]]
"""A pool's prices, each (UTC epoch s it took effect, USD/h), oldest first."""


def spot_pools(fleet: DemoFleet) -> list[SpotPool]:
    return sorted({SpotPool(i.story.instance_type, i.zone) for i in fleet.instances if i.spot})


def spot_history(fleet: DemoFleet, *, begin: int) -> dict[SpotPool, Changes]:
    """Each spot pool's prices: one in force from before the history's start `begin`, then one or two changes
    before the epoch's day, each in the middle of an hour (whose price is then a mean of two, as EC2 bills spot by
    the second). A function of the fleet and `begin` only: a demo started again finds the same history."""
    history: dict[SpotPool, Changes] = {}
    for pool in spot_pools(fleet):
        h = digest(fleet.seed, "spot", *pool)
        low, high = SPOT_SHARE_PCT
        usd = round(on_demand_usd(pool.instance_type) * (low + h % (high - low + 1)) / 100, 4)
        changes = [(begin - 3 * DAY, usd)]
        count = 1 + (h >> 8) % 2
        span = max(fleet.epoch - DAY - begin, HOUR)
        for k in range(count):
            hour = (begin + span * (k + 1) // (count + 1)) // HOUR * HOUR
            at = hour + 600 + (h >> (12 + 12 * k)) % 2400  # from :10 to :50
            usd = round(usd * (85 + (h >> (36 + 8 * k)) % 36) / 100, 4)  # 85 % to 120 % of the price before
            changes.append((at, usd))
        history[pool] = changes
    return history


def spot_usd(changes: Changes, a: float, b: float) -> float:
    """What running from `a` to `b` (UTC epoch s) costs at the prices in force, USD."""
    usd = 0.0
    for (at, price), (until, _next) in zip(changes, [*changes[1:], (math.inf, 0.0)], strict=True):
        overlap = min(b, until) - max(a, at)
        if overlap > 0:
            usd += price * overlap / HOUR
    return usd


def store_spot_history(session: Session, history: dict[SpotPool, Changes], *, now: datetime) -> int:
    """Replace the pools' stored prices with `history` and mark each read up to `now`, as app/billing/spot.py
    would after reading EC2; returns how many prices were stored."""
    pools = list(history)
    if not pools:
        return 0
    key = tuple_(spot_prices.c.instance_type, spot_prices.c.availability_zone)
    session.execute(spot_prices.delete().where(key.in_([tuple(p) for p in pools])))
    rows = [
        {
            "instance_type": p.instance_type,
            "availability_zone": p.availability_zone,
            "ts": _utc(at),
            "usd_per_hour": usd,
        }
        for p, changes in history.items()
        for at, usd in changes
    ]
    session.execute(insert(spot_prices), rows)
    read = {"read_until": now, "read_at": now, "failures": 0, "next_try": None, "last_error": None}
    upsert = insert(spot_price_reads).values(
        [{"instance_type": p.instance_type, "availability_zone": p.availability_zone, **read} for p in pools]
    )
    session.execute(upsert.on_conflict_do_update(index_elements=["instance_type", "availability_zone"], set_=read))
    return len(rows)


# --------------------------------------------------------------------------------------------------------------
# The bill


def running(fleet: DemoFleet, inst: SimInstance, a: float, b: float) -> list[tuple[float, float]]:
    """When `inst` ran within [a, b), UTC epoch s: all of it but the spans it was away."""
    out: list[tuple[float, float]] = []
    t = a
    for g0, g1 in sorted(fleet.offline(inst, a, b)):
        if g0 > t:
            out.append((t, min(g0, b)))
        t = max(t, g1)
    if t < b:
        out.append((t, b))
    return out


def by_hour(spans: Iterable[tuple[float, float]]) -> dict[int, list[tuple[float, float]]]:
    """The spans cut at UTC hours, by hour (UTC epoch s)."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for a, b in spans:
        hour = int(a) // HOUR * HOUR
        while hour < b:
            x, y = max(a, hour), min(b, hour + HOUR)
            if y > x:
                out[hour].append((x, y))
            hour += HOUR
    return out


def bill_lines(fleet: DemoFleet, *, begin: float, until: int) -> list[CurLine]:
    """The CUR lines of every instance from `begin` to `until` (UTC epoch s, on the hour), with the unmonitored
    instance and the Capacity Block's fee and unused hours."""
    history = spot_history(fleet, begin=int(begin))
    lines: list[CurLine] = []
    for inst in fleet.instances:
        common: LineFields = {
            "payer_account": PAYER,
            "usage_account": DEMO_ACCOUNT,
            "region": inst.story.region,
            "availability_zone": inst.zone,
            "tags": dict(inst.tags),
        }
        itype = inst.story.instance_type
        od = on_demand_usd(itype)
        block = fleet.block(inst)
        arn = capacity_reservation_arn(block_reservation(fleet), DEMO_ACCOUNT, inst.story.region) if block else None
        hours = by_hour(running(fleet, inst, begin, until))
        for hour, spans in sorted(hours.items()):
            used_h = sum(y - x for x, y in spans) / HOUR
            at = _utc(hour)
            if inst.spot:
                usd = sum(spot_usd(history[SpotPool(itype, inst.zone)], x, y) for x, y in spans)
                lines += instance_hour_lines(
                    inst.instance_id, itype, at, purchase="spot", usd=usd, hours=used_h, **common
                )
            elif arn is not None:
                lines += instance_hour_lines(
                    inst.instance_id,
                    itype,
                    at,
                    purchase="capacity block",
                    usd=0.0,
                    on_demand_usd=od * used_h,
                    hours=used_h,
                    reservation_arn=arn,
                    **common,
                )
            elif inst.tags["Name"] in SAVINGS_PLAN:
                usd = od * (1 - SAVINGS_PLAN_OFF) * used_h
                lines += instance_hour_lines(
                    inst.instance_id,
                    itype,
                    at,
                    purchase="savings plan",
                    usd=usd,
                    on_demand_usd=od * used_h,
                    hours=used_h,
                    **common,
                )
            else:
                lines += instance_hour_lines(
                    inst.instance_id, itype, at, purchase="on-demand", usd=od * used_h, hours=used_h, **common
                )
        if block is not None and arn is not None:
            lines += _block_lines(block.start, block.end, arn, itype, hours, common)
    lines += _unmonitored_lines(unmonitored(fleet), begin, until)
    return lines


def _block_lines(
    start: int, end: int, arn: str, itype: str, used: dict[int, list[tuple[float, float]]], common: LineFields
) -> list[CurLine]:
    """The block's upfront fee, billed when it was bought, and its hours no instance ran in, billed $0."""
    fee = BLOCK_USD_PER_HOUR * (end - start) / HOUR
    bought = _utc((start - BLOCK_BOUGHT_DAYS * DAY) // HOUR * HOUR)
    lines = [capacity_block_fee_line(arn, itype, bought, usd=fee, **common)]
    for hour, spans in sorted(by_hour([(start, end)]).items()):
        reserved = sum(y - x for x, y in spans)
        idle_h = (reserved - sum(y - x for x, y in used.get(hour, []))) / HOUR
        if idle_h > 1e-9:
            lines.append(unused_capacity_line(arn, itype, _utc(hour), hours=idle_h, usd=0.0, block=True, **common))
    return lines


def _unmonitored_lines(inst: Unmonitored, begin: float, until: int) -> list[CurLine]:
    od = on_demand_usd(inst.instance_type)
    common: LineFields = {
        "payer_account": PAYER,
        "usage_account": DEMO_ACCOUNT,
        "region": inst.region,
        "availability_zone": inst.zone,
        "tags": dict(UNMONITORED_TAGS),
    }
    lines: list[CurLine] = []
    for hour, spans in sorted(by_hour([(begin, until)]).items()):
        used_h = sum(y - x for x, y in spans) / HOUR
        at = _utc(hour)
        lines += instance_hour_lines(
            inst.instance_id, inst.instance_type, at, purchase="on-demand", usd=od * used_h, hours=used_h, **common
        )
    return lines


def write_bill(root: Path, lines: Sequence[CurLine]) -> list[Path]:
    """The lines as one export, a file per billing period, under `root` (emptied first: the newest delivery
    replaces the one before, as an export that overwrites its files)."""
    shutil.rmtree(root, ignore_errors=True)
    months: dict[date, list[CurLine]] = defaultdict(list)
    for line in lines:
        months[line.start.date().replace(day=1)].append(line)
    return [write_cur(export_path(root, month), month_lines) for month, month_lines in sorted(months.items())]


# --------------------------------------------------------------------------------------------------------------
# The step of the demo


@dataclass(frozen=True)
class Shipped:
    """What `ship_billing` stored."""

    root: Path
    exports: list[ExportResult]
    unmonitored: Unmonitored
    unmonitored_usd: float
    pools: int

    def summary(self, url: str = "/") -> str:
        """One line: the months imported, their instance-hours and dollars, the unmonitored instance, and where the
        server at `url` shows them."""
        months = ", ".join(f"{r.billing_period:%Y-%m}" for r in self.exports)
        hours = sum(r.instance_hours for r in self.exports)
        usd = sum(r.usd for r in self.exports)
        newest = max((r.newest_hour for r in self.exports if r.newest_hour), default=None)
        through = f", newest hour {newest:%Y-%m-%d %H:00} UTC" if newest else ""
        u = self.unmonitored
        return (
            f"billing: imported {months} payer {PAYER}: {hours:,.0f} instance-hours, ${usd:,.2f}{through}; "
            f"unmonitored (no agent): {u.instance_id} ({u.instance_type}) ${self.unmonitored_usd:,.2f}; "
            f"{url}billing, GET {url}api/v1/billing"
        )


def ship_billing(
    sessions: sessionmaker[Session], fleet: DemoFleet, folder: Path, *, begin: float, now: float
) -> Shipped:
    """Write the fleet's bill up to BILL_LAG_H before `now` under `folder`/FOLDER and import it, then store the
    simulated spot price history read up to `now`: one transaction."""
    until = (int(now) // HOUR - BILL_LAG_H) * HOUR
    root = folder / FOLDER
    write_bill(root, bill_lines(fleet, begin=begin, until=until))
    history = spot_history(fleet, begin=int(begin))
    lost = unmonitored(fleet)
    with session_scope(sessions) as session:
        exports = import_source(session, str(root))
        store_spot_history(session, history, now=_utc(now))
        usd = session.scalar(select(func.sum(billed_hours.c.usd)).where(billed_hours.c.instance_id == lost.instance_id))
    return Shipped(root, exports, lost, float(usd or 0.0), len(history))


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


__all__ = [
    "PAYER",
    "Shipped",
    "Unmonitored",
    "bill_lines",
    "block_reservation",
    "ship_billing",
    "spot_history",
    "spot_usd",
    "unmonitored",
]
