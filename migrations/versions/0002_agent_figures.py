"""Agent figures: graphics activity, SM clock, ECC and process memory per sample; price and NVML errors per host.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 03:56:30.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: a catalog change only, existing partitions are not rewritten, and an ALTER on
    # the partitioned parent reaches every partition. Appended in this order, 4-byte columns before the
    # 2-byte one, so none needs alignment padding.
    op.add_column(
        "samples",
        sa.Column(
            "gr_active",
            sa.REAL(),
            nullable=True,
            comment="Mean graphics-engine activity over the interval, % (NVML GPM).",
        ),
    )
    op.add_column(
        "samples",
        sa.Column(
            "ecc_uncorrected",
            sa.Integer(),
            nullable=True,
            comment="Volatile uncorrected ECC errors since the driver loaded, count.",
        ),
    )
    op.add_column(
        "samples",
        sa.Column(
            "procs_mem_mib",
            sa.Integer(),
            nullable=True,
            comment="Memory held by the device's compute processes, MiB.",
        ),
    )
    op.add_column(
        "samples",
        sa.Column("sm_clock_mhz", sa.SmallInteger(), nullable=True, comment="SM clock at the interval end, MHz."),
    )
    op.add_column(
        "instances",
        sa.Column(
            "price_usd_per_hour",
            sa.Float(),
            nullable=True,
            comment="Price configured on the agent (on-premises hosts), USD per hour.",
        ),
    )
    # A constant default is stored once in the catalog, so this does not rewrite the table either.
    op.add_column(
        "instances",
        sa.Column(
            "agent_errors",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
            comment="NVML call failures per 'call:reason' in the newest batch, count since the agent's previous batch.",
        ),
    )


def downgrade() -> None:
    op.drop_column("instances", "agent_errors")
    op.drop_column("instances", "price_usd_per_hour")
    op.drop_column("samples", "sm_clock_mhz")
    op.drop_column("samples", "procs_mem_mib")
    op.drop_column("samples", "ecc_uncorrected")
    op.drop_column("samples", "gr_active")
