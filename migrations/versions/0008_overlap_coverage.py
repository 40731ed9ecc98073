"""Each device's covered time per hour, so no second or overlapping interval is counted twice.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # No default, so no table rewrite: hours written before this revision keep NULL, which the write path reads as
    # nothing recorded. Their seconds were counted without a check, and a later batch into such an hour is checked
    # only against what arrives after the upgrade. Rebuilding the ranges from `samples` is not possible, as a sample
    # row does not keep its interval's length.
    op.add_column(
        "rollups_hourly",
        sa.Column(
            "covered",
            postgresql.TSTZMULTIRANGE(),
            nullable=True,
            comment="Time of the hour already counted for the device, gaps under a second closed; NULL: not recorded.",
        ),
    )
    # Where each device's counted time ends, and a stretch before it known to be counted: a row that starts inside
    # or after it needs no look at `covered`. NULL until the device's first batch after this revision, which then
    # goes the fast path; hours before it have `covered` NULL and are not checked either way.
    op.add_column(
        "device_status",
        sa.Column(
            "covered_from",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="Start of a stretch known to be counted, up to covered_until; NULL: none.",
        ),
    )
    op.add_column(
        "device_status",
        sa.Column(
            "covered_until",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="End of the device's counted time, its latest; NULL: none recorded.",
        ),
    )


def downgrade() -> None:
    op.drop_column("device_status", "covered_until")
    op.drop_column("device_status", "covered_from")
    op.drop_column("rollups_hourly", "covered")
