"""Per-instance rollups (hourly and daily) for the charts over time, filled from the device rollups.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 05:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BOUNDS = (1, 5, 10, 25, 50)
NAMES = (
    "secs_w",
    "known_w",
    *[f"lt{b}_w" for b in BOUNDS],
    *[f"free{b}_w" for b in BOUNDS],
    "cap_s",
    "sliced_w",
    "gpu_s",
)
# As app/store/instance_rollups.py weighs devices (written out: a migration stays as it was).
# A GPU's layout is known in full when the agent sized every MIG device and no live slice lacks a size
# (app/analyse/fleet.py, layout_known).
_KNOWN = (
    "g.layout_complete AND NOT EXISTS (SELECT FROM mig_slices u WHERE u.gpu_pk = g.id AND u.retired_at IS NULL "
    "AND u.compute_slices IS NULL)"
)
WEIGHTS = (
    "SELECT g.id AS device_id, g.instance_pk, CASE WHEN g.mig_mode THEN 0.0 ELSE 1.0 END AS w, "
    f"CASE WHEN g.mig_mode AND {_KNOWN} THEN 1.0 ELSE 0.0 END AS cap, 0.0 AS sliced, 1.0 AS own FROM gpus g "
    "UNION ALL SELECT s.id, g.instance_pk, s.compute_slices / 7.0, 0.0, "
    f"CASE WHEN {_KNOWN} THEN s.compute_slices / 7.0 ELSE 0.0 END, 0.0 "
    "FROM mig_slices s JOIN gpus g ON g.id = s.gpu_pk WHERE s.compute_slices IS NOT NULL"
)


COMMENTS = {
    "secs_w": "GPU-seconds covered: passthrough GPUs x 1, sized MIG slices x compute slices / 7.",
    "known_w": "Of which with a utilization figure.",
    **{f"lt{b}_w": f"Of which with utilization under {b}%." for b in BOUNDS},
    **{f"free{b}_w": f"Of which under {b}% with no process and memory under the held bound." for b in BOUNDS},
    "cap_s": "Seconds of MIG-mode GPUs whose layout is known in full: capacity to split into slices.",
    "sliced_w": "GPU-seconds of the sized slices of those GPUs (unpartitioned = cap_s - sliced_w).",
    "gpu_s": "Seconds of every GPU's own data, MIG or not (offline = expected - gpu_s).",
}


def _create(name: str, time_column: str, time_comment: str) -> None:
    op.create_table(
        name,
        sa.Column(time_column, sa.DateTime(timezone=True), nullable=False, comment=time_comment),
        sa.Column("instance_pk", sa.BigInteger(), nullable=False),
        *[sa.Column(n, sa.Float(), server_default=sa.text("0"), nullable=False, comment=COMMENTS[n]) for n in NAMES],
        sa.PrimaryKeyConstraint(time_column, "instance_pk", name=f"pk_{name}"),
        postgresql_with={"fillfactor": 70},
    )


def _fill(name: str, time_column: str, source: str) -> None:
    sums = [
        "sum(x.secs * r.w)",
        "sum(x.util_known_s * r.w)",
        *[f"sum(x.util_lt{b}_s * r.w)" for b in BOUNDS],
        *[f"sum(x.free_lt{b}_s * r.w)" for b in BOUNDS],
        "sum(x.secs * r.cap)",
        "sum(x.secs * r.sliced)",
        "sum(x.secs * r.own)",
    ]
    op.execute(
        f"INSERT INTO {name} ({time_column}, instance_pk, {', '.join(NAMES)}) "
        f"SELECT x.{time_column}, r.instance_pk, {', '.join(sums)} FROM {source} x "
        f"JOIN ({WEIGHTS}) r ON r.device_id = x.device_id GROUP BY 1, 2"
    )


def upgrade() -> None:
    _create("instance_rollups_hourly", "hour", "Start of the UTC hour.")
    _create("instance_rollups_daily", "day", "Start of the UTC day.")
    op.create_index("ix_instance_rollups_hourly_instance", "instance_rollups_hourly", ["instance_pk", "hour"])
    _fill("instance_rollups_hourly", "hour", "rollups_hourly")
    _fill("instance_rollups_daily", "day", "rollups_daily")


def downgrade() -> None:
    op.drop_table("instance_rollups_daily")
    op.drop_table("instance_rollups_hourly")
