"""Unknown MIG layouts and NVML permission gaps: a slice's size may be unknown, a GPU's layout incomplete.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Constant defaults are stored once in the catalog: neither ADD COLUMN rewrites the table.
    op.add_column(
        "gpus",
        sa.Column(
            "layout_complete",
            sa.Boolean(),
            server_default=sa.text("true"),
            nullable=False,
            comment="False when the agent found a MIG device it could not size: free MIG capacity unknown.",
        ),
    )
    op.add_column(
        "gpus",
        sa.Column(
            "permission_denied",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
            comment="Figures NVML refused at the agent's privilege, as last reported: [{figure, call, grant}].",
        ),
    )
    # The CHECK (compute_slices BETWEEN 1 AND 7) stays: NULL passes it, any number must still be 1 to 7.
    op.alter_column(
        "mig_slices",
        "compute_slices",
        existing_type=sa.SmallInteger(),
        nullable=True,
        comment="Compute slices out of 7; NULL when the agent could not read the size.",
        existing_comment="Compute slices out of 7.",
    )


def downgrade() -> None:
    unsized = op.get_bind().execute(sa.text("SELECT count(*) FROM mig_slices WHERE compute_slices IS NULL")).scalar()
    if unsized:
        raise RuntimeError(
            f"{unsized} MIG slices have no known size, which the schema before 0007 cannot hold: "
            "delete them (DELETE FROM mig_slices WHERE compute_slices IS NULL) before downgrading"
        )
    op.alter_column(
        "mig_slices",
        "compute_slices",
        existing_type=sa.SmallInteger(),
        nullable=False,
        comment="Compute slices out of 7.",
        existing_comment="Compute slices out of 7; NULL when the agent could not read the size.",
    )
    op.drop_column("gpus", "permission_denied")
    op.drop_column("gpus", "layout_complete")
