"""The key that signs snooze links when GPUFLEET_ALERTS_SIGNING_KEY is unset (app/alerts/snooze.py): made by the first
server process that needs one and kept here, so every process and every restart checks links with the same key.
Also an index to find an incident's snoozes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25 02:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_signing_key",
        sa.Column("id", sa.SmallInteger(), nullable=False, comment="Always 1: one row."),
        sa.Column("key", sa.LargeBinary(), nullable=False, comment="32 random bytes, the HMAC-SHA256 key."),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_alert_signing_key_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_signing_key")),
        comment="The key that signs snooze links when GPUFLEET_ALERTS_SIGNING_KEY is unset; deleting the row ends "
        "every link sent so far.",
    )
    op.create_index("ix_alert_snoozes_incident", "alert_snoozes", ["incident_id", "created_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_alert_snoozes_incident", table_name="alert_snoozes")
    op.drop_table("alert_signing_key")
