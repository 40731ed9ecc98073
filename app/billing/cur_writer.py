"""Writes Cost and Usage Report 2.0 Parquet files as AWS Data Exports delivers them, from simple line dataclasses:
for the demo, which bills its simulated fleet, and for the tests of the reader (app/billing/cur.py).

The columns and their types follow the CUR 2.0 table dictionary (https://docs.aws.amazon.com/cur/latest/userguide/
table-dictionary-cur2.html): every column the reader needs, the map columns `product`, `resource_tags`,
`cost_category` and `discount`, and enough of the others that a file looks like a real hourly export.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TypedDict, Unpack

import pyarrow as pa
import pyarrow.parquet as pq

STRING = pa.string()
DOUBLE = pa.float64()
TIMESTAMP = pa.timestamp("ms")  # UTC, as Athena's `timestamp`
STRING_MAP = pa.map_(pa.string(), pa.string())

# Table order, as the dictionary lists them; a selection, not all of CUR 2.0's columns.
SCHEMA = pa.schema(
    [
        ("bill_bill_type", STRING),
        ("bill_billing_entity", STRING),
        ("bill_billing_period_end_date", TIMESTAMP),
        ("bill_billing_period_start_date", TIMESTAMP),
        ("bill_invoice_id", STRING),
        ("bill_payer_account_id", STRING),
        ("bill_payer_account_name", STRING),
        ("capacity_reservation_capacity_reservation_arn", STRING),
        ("capacity_reservation_capacity_reservation_status", STRING),
        ("capacity_reservation_capacity_reservation_type", STRING),
        ("cost_category", STRING_MAP),
        ("discount", pa.map_(pa.string(), pa.float64())),
        ("discount_total_discount", DOUBLE),
        ("identity_line_item_id", STRING),
        ("identity_time_interval", STRING),
        ("line_item_availability_zone", STRING),
        ("line_item_blended_cost", DOUBLE),
        ("line_item_currency_code", STRING),
        ("line_item_line_item_description", STRING),
        ("line_item_line_item_type", STRING),
        ("line_item_net_unblended_cost", DOUBLE),
        ("line_item_operation", STRING),
        ("line_item_product_code", STRING),
        ("line_item_resource_id", STRING),
        ("line_item_unblended_cost", DOUBLE),
        ("line_item_unblended_rate", STRING),
        ("line_item_usage_account_id", STRING),
        ("line_item_usage_account_name", STRING),
        ("line_item_usage_amount", DOUBLE),
        ("line_item_usage_end_date", TIMESTAMP),
        ("line_item_usage_start_date", TIMESTAMP),
        ("line_item_usage_type", STRING),
        ("pricing_public_on_demand_cost", DOUBLE),
        ("pricing_term", STRING),
        ("pricing_unit", STRING),
        ("product", STRING_MAP),
        ("product_instance_family", STRING),
        ("product_instance_type", STRING),
        ("product_location", STRING),
        ("product_product_family", STRING),
        ("product_region_code", STRING),
        ("product_servicecode", STRING),
        ("product_usagetype", STRING),
        ("reservation_effective_cost", DOUBLE),
        ("reservation_net_effective_cost", DOUBLE),
        ("reservation_reservation_a_r_n", STRING),
        ("resource_tags", STRING_MAP),
        ("savings_plan_net_savings_plan_effective_cost", DOUBLE),
        ("savings_plan_savings_plan_a_r_n", STRING),
        ("savings_plan_savings_plan_effective_cost", DOUBLE),
        ("savings_plan_savings_plan_rate", DOUBLE),
    ]
)

# The prefix EC2 usage types carry per region; us-east-1's have none.
USAGE_TYPE_PREFIX = {
    "us-east-1": "",
    "us-east-2": "USE2-",
    "us-west-2": "USW2-",
    "eu-west-1": "EU-",
    "eu-central-1": "EUC1-",
}

# capacity_reservation_capacity_reservation_type: the dictionary names the two kinds (On-Demand Capacity
# Reservation, EC2 Capacity Block for ML) without spelling the values; the reader matches "block" in either case.
CAPACITY_RESERVATION_TYPE = "ODCR"
CAPACITY_BLOCK_TYPE = "EC2 Capacity Block for ML"


@dataclass(frozen=True)
class CurLine:
    """One line item. Costs in USD, `usage_amount` in the line's unit (h for instance usage); `end` defaults to
    one hour after `start` (an hourly export), `usage_account` to the payer, the billing period to `start`'s month."""

    start: datetime
    line_item_type: str = "Usage"
    product_code: str = "AmazonEC2"
    usage_type: str = ""
    operation: str = "RunInstances"
    resource_id: str | None = None
    end: datetime | None = None
    usage_amount: float = 1.0
    unblended_cost: float = 0.0
    net_unblended_cost: float | None = None
    public_on_demand_cost: float | None = None
    payer_account: str = "123456789012"
    usage_account: str | None = None
    billing_period: date | None = None
    availability_zone: str | None = None
    instance_type: str | None = None
    region: str | None = "us-east-1"
    pricing_term: str | None = "OnDemand"
    savings_plan_effective_cost: float | None = None
    savings_plan_net_effective_cost: float | None = None
    savings_plan_arn: str | None = None
    reservation_effective_cost: float | None = None
    reservation_net_effective_cost: float | None = None
    reservation_arn: str | None = None
    capacity_reservation_arn: str | None = None
    capacity_reservation_status: str | None = None
    capacity_reservation_type: str | None = None
    description: str = ""
    tags: dict[str, str] = field(default_factory=dict)


class LineFields(TypedDict, total=False):
    """The CurLine fields the helpers below pass on as they are."""

    payer_account: str
    usage_account: str | None
    billing_period: date | None
    region: str | None
    availability_zone: str | None
    net_unblended_cost: float | None
    tags: dict[str, str]


def usage_type(kind: str, instance_type: str, region: str | None) -> str:
    """`BoxUsage:p5.48xlarge`, `USE2-SpotUsage:g6.xlarge`: a usage type as EC2 names it."""
    return f"{USAGE_TYPE_PREFIX.get(region or '', '')}{kind}:{instance_type}"


def capacity_reservation_arn(reservation_id: str, account: str = "123456789012", region: str = "us-east-1") -> str:
    return f"arn:aws:ec2:{region}:{account}:capacity-reservation/{reservation_id}"


def instance_hour_lines(
    instance_id: str,
    instance_type: str,
    hour: datetime,
    *,
    purchase: str,
    usd: float,
    on_demand_usd: float | None = None,
    hours: float = 1.0,
    reservation_arn: str | None = None,
    **common: Unpack[LineFields],
) -> list[CurLine]:
    """The lines one instance-hour shows in the bill when bought as `purchase` (app.billing.tables.PURCHASES), whose
    effective cost is `usd` (USD for `hours` h of use). `on_demand_usd` is what it would have cost on demand (the
    unblended cost of a Savings Plan covered line); `reservation_arn` the Capacity Block or Capacity Reservation
    it ran in. `common`: further fields of every line (LineFields)."""
    on_demand = usd if on_demand_usd is None else on_demand_usd
    region = common.get("region", "us-east-1")
    base = CurLine(
        start=hour,
        resource_id=instance_id,
        instance_type=instance_type,
        usage_amount=hours,
        usage_type=usage_type("BoxUsage", instance_type, region),
        public_on_demand_cost=on_demand,
        description=f"{instance_type} instance hour, {purchase}",
        **common,
    )
    if reservation_arn is not None:
        kind = CAPACITY_BLOCK_TYPE if purchase == "capacity block" else CAPACITY_RESERVATION_TYPE
        base = replace(
            base,
            capacity_reservation_arn=reservation_arn,
            capacity_reservation_status="Used",
            capacity_reservation_type=kind,
        )
    if purchase in ("on-demand", "capacity block", "capacity reservation"):
        return [replace(base, unblended_cost=usd)]
    if purchase == "spot":
        spot = usage_type("SpotUsage", instance_type, region)
        return [replace(base, usage_type=spot, operation="RunInstances:SV001", pricing_term="Spot", unblended_cost=usd)]
    if purchase == "savings plan":
        plan = "arn:aws:savingsplans::123456789012:savingsplan/sp-gpufleet"
        covered = replace(
            base,
            line_item_type="SavingsPlanCoveredUsage",
            unblended_cost=on_demand,
            savings_plan_effective_cost=usd,
            savings_plan_arn=plan,
        )
        # The negation offsets the covered line's unblended cost; it is grouped by plan, usage type and zone, so
        # it names no instance.
        negation = replace(
            covered,
            line_item_type="SavingsPlanNegation",
            resource_id=None,
            unblended_cost=-on_demand,
            savings_plan_effective_cost=None,
        )
        return [covered, negation]
    if purchase == "reserved":
        return [
            replace(
                base,
                line_item_type="DiscountedUsage",
                pricing_term="Reserved",
                reservation_effective_cost=usd,
                reservation_arn="arn:aws:ec2:us-east-1:123456789012:reserved-instances/ri-gpufleet",
            )
        ]
    raise ValueError(f"unknown purchase {purchase!r}")


def capacity_block_fee_line(
    reservation_arn: str, instance_type: str, at: datetime, *, usd: float, **common: Unpack[LineFields]
) -> CurLine:
    """The upfront fee of a Capacity Block for ML, USD, billed once when it is bought (usage type
    `CapacityBlockFee:<type>`); the block's instance-hours then bill $0."""
    region = common.get("region", "us-east-1")
    return CurLine(
        start=at,
        line_item_type="Fee",
        usage_type=usage_type("CapacityBlockFee", instance_type, region),
        operation="PurchaseCapacityBlock",
        resource_id=reservation_arn.rsplit("/", 1)[-1],
        unblended_cost=usd,
        instance_type=instance_type,
        pricing_term=None,
        capacity_reservation_arn=reservation_arn,
        capacity_reservation_status="Reserved",
        capacity_reservation_type=CAPACITY_BLOCK_TYPE,
        description=f"Capacity Block for ML, {instance_type}",
        **common,
    )


def unused_capacity_line(
    reservation_arn: str,
    instance_type: str,
    hour: datetime,
    *,
    hours: float,
    usd: float,
    block: bool,
    **common: Unpack[LineFields],
) -> CurLine:
    """Reserved capacity no instance ran in during `hour`: `hours` instance-hours, billed `usd` (the on-demand rate
    for a Capacity Reservation, $0 for a Capacity Block, paid up front)."""
    region = common.get("region", "us-east-1")
    return CurLine(
        start=hour,
        usage_type=usage_type("UnusedBox", instance_type, region),
        operation="RunInstances",
        resource_id=reservation_arn.rsplit("/", 1)[-1],
        usage_amount=hours,
        unblended_cost=usd,
        instance_type=instance_type,
        capacity_reservation_arn=reservation_arn,
        capacity_reservation_status="Unused",
        capacity_reservation_type=CAPACITY_BLOCK_TYPE if block else CAPACITY_RESERVATION_TYPE,
        description=f"Unused reservation, {instance_type}",
        **common,
    )


def _month(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, 1)
    end = datetime(day.year + day.month // 12, day.month % 12 + 1, 1)
    return start, end


def _naive(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo else ts


def _row(line: CurLine) -> dict[str, object]:
    start = _naive(line.start)
    end = _naive(line.end) if line.end else start + timedelta(hours=1)
    period_start, period_end = _month(line.billing_period or start.date())
    usage_account = line.usage_account or line.payer_account
    interval = f"{start:%Y-%m-%dT%H:%M:%SZ}/{end:%Y-%m-%dT%H:%M:%SZ}"
    identity = hashlib.sha256(f"{line.resource_id}|{line.usage_type}|{line.line_item_type}|{interval}".encode())
    family = line.instance_type.split(".")[0] if line.instance_type else None
    product: dict[str, str] = (
        {"product_name": "Amazon Elastic Compute Cloud"} if line.product_code == "AmazonEC2" else {}
    )
    if line.instance_type:
        product |= {"instance_type": line.instance_type, "operating_system": "Linux", "tenancy": "Shared"}
    rate = line.unblended_cost / line.usage_amount if line.usage_amount else 0.0
    return {
        "bill_bill_type": "Anniversary",
        "bill_billing_entity": "AWS",
        "bill_billing_period_end_date": period_end,
        "bill_billing_period_start_date": period_start,
        "bill_invoice_id": None,
        "bill_payer_account_id": line.payer_account,
        "bill_payer_account_name": f"payer {line.payer_account}",
        "capacity_reservation_capacity_reservation_arn": line.capacity_reservation_arn,
        "capacity_reservation_capacity_reservation_status": line.capacity_reservation_status,
        "capacity_reservation_capacity_reservation_type": line.capacity_reservation_type,
        "cost_category": [],
        "discount": [],
        "discount_total_discount": None,
        "identity_line_item_id": identity.hexdigest()[:40],
        "identity_time_interval": interval,
        "line_item_availability_zone": line.availability_zone,
        "line_item_blended_cost": line.unblended_cost,
        "line_item_currency_code": "USD",
        "line_item_line_item_description": line.description,
        "line_item_line_item_type": line.line_item_type,
        "line_item_net_unblended_cost": line.net_unblended_cost,
        "line_item_operation": line.operation,
        "line_item_product_code": line.product_code,
        "line_item_resource_id": line.resource_id,
        "line_item_unblended_cost": line.unblended_cost,
        "line_item_unblended_rate": f"{rate:.10f}",
        "line_item_usage_account_id": usage_account,
        "line_item_usage_account_name": f"account {usage_account}",
        "line_item_usage_amount": line.usage_amount,
        "line_item_usage_end_date": end,
        "line_item_usage_start_date": start,
        "line_item_usage_type": line.usage_type,
        "pricing_public_on_demand_cost": line.public_on_demand_cost,
        "pricing_term": line.pricing_term,
        "pricing_unit": "Hrs" if line.instance_type else None,
        "product": list(product.items()),
        "product_instance_family": family,
        "product_instance_type": line.instance_type,
        "product_location": None,
        "product_product_family": "Compute Instance" if line.instance_type else None,
        "product_region_code": line.region,
        "product_servicecode": line.product_code,
        "product_usagetype": line.usage_type,
        "reservation_effective_cost": line.reservation_effective_cost,
        "reservation_net_effective_cost": line.reservation_net_effective_cost,
        "reservation_reservation_a_r_n": line.reservation_arn,
        "resource_tags": [(f"user_{k}", v) for k, v in line.tags.items()],
        "savings_plan_net_savings_plan_effective_cost": line.savings_plan_net_effective_cost,
        "savings_plan_savings_plan_a_r_n": line.savings_plan_arn,
        "savings_plan_savings_plan_effective_cost": line.savings_plan_effective_cost,
        "savings_plan_savings_plan_rate": None,
    }


def cur_table(lines: Iterable[CurLine], *, omit: Sequence[str] = ()) -> pa.Table:
    """The lines as a CUR 2.0 table, less the columns named in `omit`."""
    table = pa.Table.from_pylist([_row(line) for line in lines], schema=SCHEMA)
    return table.drop_columns(list(omit)) if omit else table


def write_cur(
    path: Path, lines: Iterable[CurLine], *, omit: Sequence[str] = (), row_group_size: int | None = None
) -> Path:
    """Write the lines as one CUR 2.0 Parquet file (snappy, as Data Exports writes them); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(cur_table(lines, omit=omit), path, compression="snappy", row_group_size=row_group_size)
    return path


def export_path(
    root: Path, period: date, *, export: str = "gpufleet-cur", delivery: str | None = None, part: int = 1
) -> Path:
    """Where Data Exports puts a data file of `period`: <root>/<export>/data/BILLING_PERIOD=YYYY-MM/ when it
    overwrites each delivery, in a folder per delivery (`delivery`, e.g. "2026-11-24T05:12:40.123Z-<uuid>") when it
    creates new files each time."""
    folder = root / export / "data" / f"BILLING_PERIOD={period:%Y-%m}"
    if delivery:
        folder /= delivery
    return folder / f"{export}-{part:05d}.snappy.parquet"


__all__ = [
    "CAPACITY_BLOCK_TYPE",
    "CAPACITY_RESERVATION_TYPE",
    "SCHEMA",
    "CurLine",
    "LineFields",
    "capacity_block_fee_line",
    "capacity_reservation_arn",
    "cur_table",
    "export_path",
    "instance_hour_lines",
    "unused_capacity_line",
    "usage_type",
    "write_cur",
]
