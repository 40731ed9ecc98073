"""Holder groups indexed by (grouping, instance_pk, time): the report and /waste by holder read the hours of each
price piece of an instance (app/analyse/holder_groups.py), a few rows among the fleet's.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24 18:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_holder_groups_hourly_instance", "holder_groups_hourly", ["grouping", "instance_pk", "hour"])
    op.create_index("ix_holder_groups_daily_instance", "holder_groups_daily", ["grouping", "instance_pk", "day"])


def downgrade() -> None:
    op.drop_index("ix_holder_groups_daily_instance", table_name="holder_groups_daily")
    op.drop_index("ix_holder_groups_hourly_instance", table_name="holder_groups_hourly")
