"""A bill and spot price history for the benchmark fleet (bench/fleet.py), so the pages and the report are timed
with hourly prices in play (docs/billing.md, "How each price is chosen").

The bill is a Cost and Usage Report 2.0 export written with app/billing/cur_writer.py and stored through the real
import (`import_source`). It bills every instance from the fleet's start (or its month's, whichever is later) to a
day before the fleet's end, as AWS's export runs a day behind: spot instances at their pool's price in force, second
by second; a third of the on-demand instances under a Savings Plan, a tenth under a reservation, the rest on demand;
and UNMONITORED instances with no agent. Spot history: each pool of the fleet's spot instances changes price every
one to three days, mid-hour, from 90 days before the fleet's end; the pools are marked read up to the fleet's end.

Deterministic from the fleet: the same fleet gets the same bill.

    ensure_bill(url, fleet)     # imports once; a database that has a bill keeps it
    drop_bill(url)              # empties the billing tables (to time the pages without a bill)
"""

from __future__ import annotations

import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.fleet import DAY, HOUR, Fleet
from bench.harness import log

BILL_LAG_S = DAY
UNMONITORED = 12
"""Billed GPU instances no agent reports."""
SAVINGS_PLAN_OFF = 0.28
RESERVED_OFF = 0.40
Changes = list[tuple[int, float]]
"""A pool's prices: (from, UTC epoch s; USD/h), in time order."""


def spot_history(fleet: Fleet, on_demand: dict[str, float]) -> dict[tuple[str, str], Changes]:
    """Per spot pool (instance type, zone): its price changes from 90 days before the fleet's end."""
    pools = sorted({(i.instance_type, i.zone) for i in fleet.instances if i.lifecycle == "spot"})
    out: dict[tuple[str, str], Changes] = {}
    for itype, zone in pools:
        rng = random.Random(f"{fleet.seed} spot {itype} {zone}")
        t = fleet.end - 90 * DAY
        usd = on_demand[itype] * rng.uniform(0.30, 0.45)
        changes = [(t, round(usd, 4))]
        while True:
            t += rng.randrange(DAY, 3 * DAY) // HOUR * HOUR + rng.randrange(600, 3000)
            if t >= fleet.end:
                break
            usd = min(on_demand[itype] * 0.9, max(on_demand[itype] * 0.2, usd * rng.uniform(0.85, 1.15)))
            changes.append((t, round(usd, 4)))
        out[itype, zone] = changes
    return out


def _spot_usd(changes: Changes, a: int, b: int) -> float:
    usd = 0.0
    for (at, price), (until, _next) in zip(changes, [*changes[1:], (1 << 62, 0.0)], strict=True):
        overlap = min(b, until) - max(a, at)
        if overlap > 0:
            usd += price * overlap / HOUR
    return usd


def bill_lines(fleet: Fleet, history: dict[tuple[str, str], Changes], on_demand: dict[str, float]) -> list[Any]:
    """The CUR lines of the fleet's instances and of the unmonitored ones (app.billing.cur_writer.CurLine)."""
    from app.billing.cur_writer import LineFields, instance_hour_lines

    first = max(fleet.start // HOUR * HOUR, _month_start(fleet.end - BILL_LAG_S))
    until = (fleet.end - BILL_LAG_S) // HOUR * HOUR
    lines: list[Any] = []
    for inst in fleet.instances:
        rng = random.Random(f"{fleet.seed} bill {inst.instance_id}")
        common: LineFields = {"region": inst.region, "availability_zone": inst.zone, "tags": dict(inst.tags)}
        od = on_demand[inst.instance_type]
        pick = rng.random()
        stop = min(until, inst.gone_at) if inst.gone_at is not None else until
        for hour in range(first, stop, HOUR):
            at = datetime.fromtimestamp(hour, UTC)
            if inst.lifecycle == "spot":
                usd = _spot_usd(history[inst.instance_type, inst.zone], hour, hour + HOUR)
                kw: dict[str, Any] = {"purchase": "spot", "usd": usd}
            elif pick < 0.33:
                kw = {"purchase": "savings plan", "usd": od * (1 - SAVINGS_PLAN_OFF), "on_demand_usd": od}
            elif pick < 0.43:
                kw = {"purchase": "reserved", "usd": od * (1 - RESERVED_OFF)}
            else:
                kw = {"purchase": "on-demand", "usd": od}
            lines += instance_hour_lines(inst.instance_id, inst.instance_type, at, **kw, **common)
    for k in range(UNMONITORED):
        itype = ("p4d.24xlarge", "g5.12xlarge", "g6e.xlarge")[k % 3]
        instance_id = f"i-0bench{k:012x}"
        for hour in range(first, until, HOUR):
            at = datetime.fromtimestamp(hour, UTC)
            lines += instance_hour_lines(instance_id, itype, at, purchase="on-demand", usd=on_demand[itype])
    return lines


def _month_start(t: int) -> int:
    d = datetime.fromtimestamp(t, UTC)
    return int(datetime(d.year, d.month, 1, tzinfo=UTC).timestamp())


def has_bill(url: str) -> bool:
    from bench.database import connect

    with connect(url) as conn:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM billing_exports)").fetchone() == (True,)


def drop_bill(url: str) -> None:
    """Empty the billing tables: the fleet at its own prices."""
    from bench.database import connect

    with connect(url) as conn:
        conn.execute("TRUNCATE billing_exports, billed_hours, billed_prices, spot_prices, spot_price_reads")
        conn.commit()


def ensure_bill(url: str, fleet: Fleet) -> dict[str, Any]:
    """Import the fleet's bill and store its spot history unless the database has a bill; what was done."""
    if has_bill(url):
        log("the fleet's bill is there")
        return {}
    from app.billing.cur_writer import export_path, write_cur
    from app.billing.imports import import_source
    from app.billing.spot import SpotPool
    from app.db import make_engine, make_sessionmaker, session_scope
    from app.demo.billing import store_spot_history
    from app.pricing.catalog import load_catalog

    t = time.perf_counter()
    on_demand = {n: e.on_demand_usd_per_hour for n, e in load_catalog().items() if e.on_demand_usd_per_hour}
    history = spot_history(fleet, on_demand)
    lines = bill_lines(fleet, history, on_demand)
    made_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-bill-") as tmp:
        months: dict[Any, list[Any]] = {}
        for line in lines:
            months.setdefault(line.start.date().replace(day=1), []).append(line)
        for month, month_lines in months.items():
            write_cur(export_path(Path(tmp), month), month_lines)
        engine = make_engine(url, pool_size=1)
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                exports = import_source(session, tmp)
                pools = {SpotPool(*pool): changes for pool, changes in history.items()}
                store_spot_history(session, pools, now=datetime.fromtimestamp(fleet.end, UTC))
        finally:
            engine.dispose()
    hours = sum(r.instance_hours for r in exports)
    log(
        f"bill: {len(lines):,} CUR lines, {hours:,.0f} instance-hours, {len(history)} spot pools "
        f"({sum(len(c) for c in history.values())} prices) in {time.perf_counter() - t:.1f} s "
        f"(lines made in {made_s:.1f} s)"
    )
    return {"bill_instance_hours": hours, "spot_pools": len(history)}
