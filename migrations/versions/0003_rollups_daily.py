"""Daily rollups: one row per device per UTC day, back-filled from the hourly rollups.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 04:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rollup histogram's bounds as of this revision; written out so the migration does not change with the app.
_UTIL_BOUNDS = (1, 5, 10, 25, 50)

_MAXES = ("util_max", "sm_max", "mem_max", "power_max", "temp_max")


def _seconds(name: str, comment: str) -> sa.Column[float]:
    return sa.Column(name, sa.Float(), server_default=sa.text("0"), nullable=False, comment=comment)


def _columns() -> list[sa.Column[Any]]:
    """The columns of rollups_hourly, with `day` in place of `hour`."""
    return [
        sa.Column("day", sa.DateTime(timezone=True), nullable=False, comment="Start of the UTC day."),
        sa.Column("device_id", sa.Integer(), nullable=False),
        _seconds("secs", "Seconds covered by samples."),
        _seconds("util_known_s", "Seconds with a utilization figure."),
        _seconds("util_sum", "Sum of utilization x seconds (%*s)."),
        sa.Column("util_max", sa.REAL(), nullable=True),
        _seconds("sm_known_s", "Seconds with an SM activity figure."),
        _seconds("sm_sum", "Sum of SM activity x seconds (%*s)."),
        sa.Column("sm_max", sa.REAL(), nullable=True),
        _seconds("mem_known_s", "Seconds with a memory figure."),
        _seconds("mem_sum", "Sum of memory used x seconds (MiB*s)."),
        sa.Column("mem_max", sa.Integer(), nullable=True),
        _seconds("power_known_s", "Seconds with a power figure."),
        _seconds("power_sum", "Sum of power x seconds (J)."),
        sa.Column("power_max", sa.SmallInteger(), nullable=True),
        sa.Column("temp_max", sa.SmallInteger(), nullable=True),
        _seconds("no_proc_s", "Seconds with no compute process."),
        _seconds("mem_held_s", "Seconds with memory used at or above the held bound."),
        *[_seconds(f"util_lt{b}_s", f"Seconds with utilization under {b}%.") for b in _UTIL_BOUNDS],
        *[
            _seconds(f"free_lt{b}_s", f"Seconds under {b}% with no process and memory under the held bound.")
            for b in _UTIL_BOUNDS
        ],
    ]


def backfill_sql() -> str:
    """Each day's row from its hours' rows: sums add, maxima take the greatest.

    Alembic's connection does not get the application's `SET TIME ZONE 'UTC'`, so the day is cut in UTC
    explicitly rather than in whatever zone the server defaults to.
    """
    names = [c.name for c in _columns()[2:]]
    aggregates = ", ".join(f"max({n})" if n in _MAXES else f"sum({n})" for n in names)
    return (
        f"INSERT INTO rollups_daily (day, device_id, {', '.join(names)}) "
        f"SELECT date_trunc('day', hour, 'UTC'), device_id, {aggregates} FROM rollups_hourly GROUP BY 1, 2"
    )


def upgrade() -> None:
    # Not partitioned: one row per device per day stays small, and retention deletes old days. Rows are
    # updated in place as data arrives; free space on each page keeps those updates HOT.
    op.create_table(
        "rollups_daily",
        *_columns(),
        sa.PrimaryKeyConstraint("device_id", "day", name=op.f("pk_rollups_daily")),
        postgresql_with={"fillfactor": 70},
    )
    op.execute(backfill_sql())
    # After the back-fill: one index build is cheaper than an index insert per row.
    op.create_index("ix_rollups_daily_day", "rollups_daily", ["day"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_rollups_daily_day", table_name="rollups_daily")
    op.drop_table("rollups_daily")
