"""Holder rollups gain the device's utilization over each holder's share: seconds with a figure and the sum of
utilization x those seconds, so a holder's row has an average utilization and its unknown time, as a device's does.

Rows written before hold 0 in both: their time reads as utilization unknown, apart from the idle-held seconds,
which had a figure (app.analyse.holders counts those as known).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 10:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("holder_rollups_hourly", "holder_rollups_daily")


def upgrade() -> None:
    # A constant default: PostgreSQL adds the columns without rewriting the tables or their partitions.
    for table in _TABLES:
        op.add_column(
            table,
            sa.Column(
                "util_known_s",
                sa.Float(),
                server_default=sa.text("0"),
                nullable=False,
                comment="Of secs, those with a utilization figure for the device, s.",
            ),
        )
        op.add_column(
            table,
            sa.Column(
                "util_sum",
                sa.Float(),
                server_default=sa.text("0"),
                nullable=False,
                comment="The device's utilization x those seconds (%*s).",
            ),
        )


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "util_sum")
        op.drop_column(table, "util_known_s")
