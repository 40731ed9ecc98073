"""A small CUR 2.0 month for the billing tests: one instance per way of buying an hour, and lines the import drops.

Prices are chosen so that every stored USD figure is exact in binary floating point or a single line's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from app.billing.cur_writer import (
    CurLine,
    capacity_block_fee_line,
    capacity_reservation_arn,
    instance_hour_lines,
    unused_capacity_line,
)

PAYER = "123456789012"
NOV = date(2026, 11, 1)
H0 = datetime(2026, 11, 3, 5, tzinfo=UTC)
BLOCK = "cr-0b10c4000000000001"
ODCR = "cr-0dc4000000000000002"


@dataclass(frozen=True)
class Expected:
    """What one GPU instance's every hour should be stored as: USD/h for a whole hour of use."""

    instance_type: str
    purchase: str
    usd_per_hour: float
    reservation_id: str | None = None
    reservation_kind: str | None = None


EXPECTED = {
    "i-0ondemand": Expected("p5.48xlarge", "on-demand", 98.32),
    "i-0spot": Expected("g6.xlarge", "spot", 0.3512),
    "i-0savings": Expected("p4d.24xlarge", "savings plan", 14.5),
    "i-0reserved": Expected("g5.xlarge", "reserved", 0.612),
    # Billed $0 an hour; the upfront fee, $62.50 per hour of the block, over its 2 instance-hours an hour (1 used,
    # 1 unused): $31.25/h.
    "i-0block": Expected("p5.48xlarge", "capacity block", 31.25, BLOCK, "capacity block"),
    "i-0odcr": Expected("g6e.12xlarge", "capacity reservation", 10.49264, ODCR, "capacity reservation"),
    "i-0p6": Expected("p6-b200.48xlarge", "on-demand", 113.9328),  # not in the catalog: a GPU family
    "i-0noagent": Expected("g5.2xlarge", "on-demand", 1.212),  # no agent reports it: the bill is what it is
}
DROPPED = ("i-0cpu", "vol-0ebs", "my-bucket")


def month_lines(
    hours: int = 2, start: datetime = H0, *, payer: str = PAYER, skip: tuple[str, ...] = ()
) -> list[CurLine]:
    """`hours` hours of the EXPECTED instances (less `skip`), plus a CPU instance, an EBS volume, an S3 bucket and
    the month's tax, none of which the import keeps; the Capacity Block's fee is billed in the first hour."""
    common = {"payer_account": payer, "availability_zone": "us-east-1a"}
    block, odcr = capacity_reservation_arn(BLOCK, payer), capacity_reservation_arn(ODCR, payer)
    lines = [capacity_block_fee_line(block, "p5.48xlarge", start, usd=62.5 * hours, **common)]
    for n in range(hours):
        hour = start + timedelta(hours=n)
        for iid, e in EXPECTED.items():
            if iid in skip:
                continue
            extra: dict[str, object] = {}
            if e.purchase == "savings plan":
                extra["on_demand_usd"] = 21.9576
            if e.reservation_id:
                extra["reservation_arn"] = block if e.reservation_id == BLOCK else odcr
            usd = 0.0 if e.purchase == "capacity block" else e.usd_per_hour
            lines += instance_hour_lines(iid, e.instance_type, hour, purchase=e.purchase, usd=usd, **extra, **common)
        lines.append(unused_capacity_line(block, "p5.48xlarge", hour, hours=1.0, usd=0.0, block=True, **common))
        lines += instance_hour_lines("i-0cpu", "m5.large", hour, purchase="on-demand", usd=0.096, **common)
        lines.append(
            CurLine(
                start=hour,
                usage_type="EBS:VolumeUsage.gp3",
                operation="CreateVolume-Gp3",
                resource_id="vol-0ebs",
                usage_amount=0.0014,
                unblended_cost=0.00011,
                instance_type=None,
                payer_account=payer,
            )
        )
        lines.append(CurLine(start=hour, product_code="AmazonS3", usage_type="TimedStorage-ByteHrs",
                             operation="StandardStorage", resource_id="my-bucket", usage_amount=0.5,
                             unblended_cost=0.0115, instance_type=None, payer_account=payer))  # fmt: skip
    month = datetime(start.year, start.month, 1, tzinfo=UTC)
    tax_end = datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
    lines.append(CurLine(start=month, end=tax_end, line_item_type="Tax", usage_type="", resource_id=None,
                         unblended_cost=12.5, instance_type=None, payer_account=payer))  # fmt: skip
    return lines
