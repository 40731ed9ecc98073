"""Who may report an instance: its signed EC2 identity, an instance-bound token, or a fleet token.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns without defaults: neither ADD COLUMN rewrites its table.
    op.add_column(
        "api_tokens",
        sa.Column(
            "instance_id",
            sa.String(length=128),
            nullable=True,
            comment="The one instance an ingest token may report; NULL: any not bound otherwise.",
        ),
    )
    op.create_index("ix_api_tokens_instance_id", "api_tokens", ["instance_id"])
    op.add_column(
        "instances",
        sa.Column(
            "identity_account_id",
            sa.String(length=12),
            nullable=True,
            comment="AWS account of the signed instance identity this instance reported with; once set, only a "
            "verified identity may report it.",
        ),
    )


def downgrade() -> None:
    op.drop_column("instances", "identity_account_id")
    op.drop_index("ix_api_tokens_instance_id", table_name="api_tokens")
    op.drop_column("api_tokens", "instance_id")
