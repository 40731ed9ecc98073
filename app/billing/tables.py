"""The billing tables (docs/billing.md): what the bill says each GPU instance cost per hour, which exports that
came from, and the EC2 spot price history of the types and zones the fleet runs on spot."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Date,
    Float,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from ..models import TZ, Base

PURCHASES = ("on-demand", "spot", "savings plan", "reserved", "capacity block", "capacity reservation")
"""How an instance-hour was bought, as the bill says (docs/billing.md, "How each price is chosen")."""

RESERVATION_KINDS = ("capacity block", "capacity reservation")
"""Capacity paid for whether or not an instance runs in it: its instances' offline hours cost money too."""

billing_exports = Table(
    "billing_exports",
    Base.metadata,
    Column("payer_account", Text, nullable=False, comment="bill_payer_account_id of the export's lines."),
    Column("billing_period", Date, nullable=False, comment="First day of the billed month (UTC)."),
    Column(
        "files",
        JSONB,
        nullable=False,
        comment="The files the stored lines came from: [{source, sha256, bytes}], sorted by source.",
    ),
    Column("digest", Text, nullable=False, comment="SHA-256 over the files' digests: the same files, no change."),
    Column("lines", Integer, nullable=False, comment="CUR lines kept: EC2 instance-hours of GPU instance types."),
    Column("instance_hours", Float, nullable=False, comment="Instance-hours those lines bill."),
    Column("usd", Float, nullable=False, comment="Their effective cost, USD."),
    Column("newest_hour", TZ, comment="Start of the newest billed hour in the export."),
    Column("imported_at", TZ, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("payer_account", "billing_period", name="pk_billing_exports"),
    comment="One Cost and Usage Report export per payer account and month, as last imported; a newer export of "
    "the month replaces the lines of the one before.",
)

billed_hours = Table(
    "billed_hours",
    Base.metadata,
    Column("instance_id", Text, nullable=False, comment="EC2 instance id (line_item_resource_id)."),
    Column("hour", TZ, nullable=False, comment="Start of the billed UTC hour."),
    Column("payer_account", Text, nullable=False),
    Column("billing_period", Date, nullable=False),
    Column("usage_account", Text, comment="line_item_usage_account_id."),
    Column("instance_type", Text, nullable=False),
    Column("region", Text),
    Column("availability_zone", Text),
    Column("purchase", Text, nullable=False, comment="How the hour was bought: " + ", ".join(PURCHASES) + "."),
    Column("usage_h", Float, nullable=False, comment="Instance-hours billed in this hour (1 for a whole hour)."),
    Column("usd", Float, nullable=False, comment="Effective cost of those instance-hours, USD."),
    Column("reservation_id", Text, comment="The Capacity Block or Capacity Reservation the instance ran in."),
    Column("reservation_kind", Text, comment=", ".join(RESERVATION_KINDS) + "; NULL outside one."),
    PrimaryKeyConstraint("instance_id", "hour", name="pk_billed_hours"),
    CheckConstraint("purchase IN (" + ", ".join(f"'{p}'" for p in PURCHASES) + ")", name="purchase"),
    CheckConstraint(
        "reservation_kind IS NULL OR reservation_kind IN (" + ", ".join(f"'{k}'" for k in RESERVATION_KINDS) + ")",
        name="reservation_kind",
    ),
    Index("ix_billed_hours_export", "payer_account", "billing_period"),
    Index("ix_billed_hours_hour", "hour"),
    comment="What the bill says each GPU instance cost, per hour: the lines of one instance-hour summed.",
)

billed_prices = Table(
    "billed_prices",
    Base.metadata,
    Column("instance_id", Text, nullable=False),
    Column("starts", TZ, nullable=False),
    Column("ends", TZ, nullable=False),
    Column("usd_per_hour", Float, nullable=False, comment="What one instance-hour cost over [starts, ends), USD/h."),
    Column("reservation_kind", Text, comment="Set when the instance ran in a capacity it pays for whether it runs."),
    PrimaryKeyConstraint("instance_id", "starts", name="pk_billed_prices"),
    Index("ix_billed_prices_ends", "ends"),
    comment="billed_hours merged: each run of consecutive hours of one instance at the same price is one row, so "
    "an analysis reads a few rows per instance, not one per hour. Remade from billed_hours on every import.",
)

spot_prices = Table(
    "spot_prices",
    Base.metadata,
    Column("instance_type", Text, nullable=False),
    Column("availability_zone", Text, nullable=False),
    Column("ts", TZ, nullable=False, comment="When this price took effect."),
    Column("usd_per_hour", Float, nullable=False, comment="Spot price of the whole instance, USD/h (Linux/UNIX)."),
    PrimaryKeyConstraint("instance_type", "availability_zone", "ts", name="pk_spot_prices"),
    comment="EC2 spot price history (DescribeSpotPriceHistory, Linux/UNIX): each price from `ts` to the next.",
)

spot_price_reads = Table(
    "spot_price_reads",
    Base.metadata,
    Column("instance_type", Text, nullable=False),
    Column("availability_zone", Text, nullable=False),
    Column("read_until", TZ, comment="The history is complete up to here."),
    Column("read_at", TZ, comment="When it was last read."),
    Column("failures", Integer, nullable=False, server_default=text("0"), comment="Failed reads in a row."),
    Column("next_try", TZ, comment="No read before this (back-off after failures)."),
    Column("last_error", Text, comment="Why the last read failed, one line."),
    PrimaryKeyConstraint("instance_type", "availability_zone", name="pk_spot_price_reads"),
    comment="How far the spot price history of each type and zone has been read.",
)

price_pieces_version = Table(
    "price_pieces_version",
    Base.metadata,
    Column("id", Integer, primary_key=True, comment="Always 1: one row."),
    Column(
        "n",
        BigInteger,
        nullable=False,
        comment="A new number after every statement that changes a source of price pieces.",
    ),
    CheckConstraint("id = 1", name="one_row"),
    comment="A number that changes whenever billed_prices, spot_prices or spot_price_reads do (statement triggers "
    "of migration 0018): the analysis reuses price pieces read at the same number.",
)
# Its number comes from price_pieces_version_seq (migration 0018), which the triggers draw from.
PRICE_PIECES_VERSION_SQL = "SELECT n FROM price_pieces_version WHERE id = 1"
"""The current version of the price pieces' sources; no row where the table was emptied and nothing has changed
since."""

__all__ = [
    "PURCHASES",
    "RESERVATION_KINDS",
    "billed_hours",
    "billed_prices",
    "billing_exports",
    "price_pieces_version",
    "spot_price_reads",
    "spot_prices",
]
