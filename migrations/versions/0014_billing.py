"""Billing: the Cost and Usage Report's GPU instance-hours and the exports they came from, and the EC2 spot price
history with how far it has been read (app/billing/tables.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
# As app.billing.tables has them when this revision was made.
PURCHASES = ("on-demand", "spot", "savings plan", "reserved", "capacity block", "capacity reservation")
RESERVATION_KINDS = ("capacity block", "capacity reservation")


def _in(values: Sequence[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    op.create_table(
        "billing_exports",
        sa.Column("payer_account", sa.Text(), nullable=False, comment="bill_payer_account_id of the export's lines."),
        sa.Column("billing_period", sa.Date(), nullable=False, comment="First day of the billed month (UTC)."),
        sa.Column(
            "files",
            postgresql.JSONB(),
            nullable=False,
            comment="The files the stored lines came from: [{source, sha256, bytes}], sorted by source.",
        ),
        sa.Column(
            "digest", sa.Text(), nullable=False, comment="SHA-256 over the files' digests: the same files, no change."
        ),
        sa.Column(
            "lines", sa.Integer(), nullable=False, comment="CUR lines kept: EC2 instance-hours of GPU instance types."
        ),
        sa.Column("instance_hours", sa.Float(), nullable=False, comment="Instance-hours those lines bill."),
        sa.Column("usd", sa.Float(), nullable=False, comment="Their effective cost, USD."),
        sa.Column("newest_hour", TZ, comment="Start of the newest billed hour in the export."),
        sa.Column("imported_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("payer_account", "billing_period", name="pk_billing_exports"),
        comment="One Cost and Usage Report export per payer account and month, as last imported; a newer export of "
        "the month replaces the lines of the one before.",
    )
    op.create_table(
        "billed_hours",
        sa.Column("instance_id", sa.Text(), nullable=False, comment="EC2 instance id (line_item_resource_id)."),
        sa.Column("hour", TZ, nullable=False, comment="Start of the billed UTC hour."),
        sa.Column("payer_account", sa.Text(), nullable=False),
        sa.Column("billing_period", sa.Date(), nullable=False),
        sa.Column("usage_account", sa.Text(), comment="line_item_usage_account_id."),
        sa.Column("instance_type", sa.Text(), nullable=False),
        sa.Column("region", sa.Text()),
        sa.Column("availability_zone", sa.Text()),
        sa.Column(
            "purchase", sa.Text(), nullable=False, comment="How the hour was bought: " + ", ".join(PURCHASES) + "."
        ),
        sa.Column(
            "usage_h", sa.Float(), nullable=False, comment="Instance-hours billed in this hour (1 for a whole hour)."
        ),
        sa.Column("usd", sa.Float(), nullable=False, comment="Effective cost of those instance-hours, USD."),
        sa.Column(
            "reservation_id", sa.Text(), comment="The Capacity Block or Capacity Reservation the instance ran in."
        ),
        sa.Column("reservation_kind", sa.Text(), comment=", ".join(RESERVATION_KINDS) + "; NULL outside one."),
        sa.PrimaryKeyConstraint("instance_id", "hour", name="pk_billed_hours"),
        sa.CheckConstraint(f"purchase IN {_in(PURCHASES)}", name="purchase"),
        sa.CheckConstraint(
            f"reservation_kind IS NULL OR reservation_kind IN {_in(RESERVATION_KINDS)}", name="reservation_kind"
        ),
        comment="What the bill says each GPU instance cost, per hour: the lines of one instance-hour summed.",
    )
    op.create_index("ix_billed_hours_export", "billed_hours", ["payer_account", "billing_period"])
    op.create_index("ix_billed_hours_hour", "billed_hours", ["hour"])
    op.create_table(
        "spot_prices",
        sa.Column("instance_type", sa.Text(), nullable=False),
        sa.Column("availability_zone", sa.Text(), nullable=False),
        sa.Column("ts", TZ, nullable=False, comment="When this price took effect."),
        sa.Column(
            "usd_per_hour",
            sa.Float(),
            nullable=False,
            comment="Spot price of the whole instance, USD/h (Linux/UNIX).",
        ),
        sa.PrimaryKeyConstraint("instance_type", "availability_zone", "ts", name="pk_spot_prices"),
        comment="EC2 spot price history (DescribeSpotPriceHistory, Linux/UNIX): each price from `ts` to the next.",
    )
    op.create_table(
        "spot_price_reads",
        sa.Column("instance_type", sa.Text(), nullable=False),
        sa.Column("availability_zone", sa.Text(), nullable=False),
        sa.Column("read_until", TZ, comment="The history is complete up to here."),
        sa.Column("read_at", TZ, comment="When it was last read."),
        sa.Column(
            "failures", sa.Integer(), nullable=False, server_default=sa.text("0"), comment="Failed reads in a row."
        ),
        sa.Column("next_try", TZ, comment="No read before this (back-off after failures)."),
        sa.Column("last_error", sa.Text(), comment="Why the last read failed, one line."),
        sa.PrimaryKeyConstraint("instance_type", "availability_zone", name="pk_spot_price_reads"),
        comment="How far the spot price history of each type and zone has been read.",
    )


def downgrade() -> None:
    op.drop_table("spot_price_reads")
    op.drop_table("spot_prices")
    op.drop_index("ix_billed_hours_hour", table_name="billed_hours")
    op.drop_index("ix_billed_hours_export", table_name="billed_hours")
    op.drop_table("billed_hours")
    op.drop_table("billing_exports")
