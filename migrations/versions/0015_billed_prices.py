"""billed_prices: the billed hours of each instance merged into runs at one price, filled from billed_hours
(app/billing/prices.py remakes them on every import).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24 15:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
# As app.billing.prices has it when this revision was made.
MERGE_SQL = """
INSERT INTO billed_prices (instance_id, starts, ends, usd_per_hour, reservation_kind)
SELECT instance_id, min(hour), max(hour) + interval '1 hour', min(rate), nullif(min(reservation_kind), '')
FROM (
    SELECT instance_id, hour, rate, reservation_kind,
           hour - interval '1 hour' * row_number() OVER (
               PARTITION BY instance_id, rate, reservation_kind ORDER BY hour) AS run
    FROM (SELECT instance_id, hour, round(CAST(usd / usage_h AS numeric), 6) AS rate,
                 coalesce(reservation_kind, '') AS reservation_kind
          FROM billed_hours WHERE usage_h > 0) h
) r
GROUP BY instance_id, rate, reservation_kind, run
"""


def upgrade() -> None:
    op.create_table(
        "billed_prices",
        sa.Column("instance_id", sa.Text(), nullable=False),
        sa.Column("starts", TZ, nullable=False),
        sa.Column("ends", TZ, nullable=False),
        sa.Column(
            "usd_per_hour",
            sa.Float(),
            nullable=False,
            comment="What one instance-hour cost over [starts, ends), USD/h.",
        ),
        sa.Column(
            "reservation_kind",
            sa.Text(),
            comment="Set when the instance ran in a capacity it pays for whether it runs.",
        ),
        sa.PrimaryKeyConstraint("instance_id", "starts", name="pk_billed_prices"),
        comment="billed_hours merged: each run of consecutive hours of one instance at the same price is one row, "
        "so an analysis reads a few rows per instance, not one per hour. Remade from billed_hours on every import.",
    )
    op.create_index("ix_billed_prices_ends", "billed_prices", ["ends"])
    op.execute(MERGE_SQL)


def downgrade() -> None:
    op.drop_index("ix_billed_prices_ends", table_name="billed_prices")
    op.drop_table("billed_prices")
