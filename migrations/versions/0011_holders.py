"""Holders: the processes on each device (one row per process per instance), what each held per device and UTC hour
or day, and each device's holders as of its newest sample.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 08:10:00.000000
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BOUNDS = (1, 5, 10, 25, 50)
TZ = sa.DateTime(timezone=True)
_HOURLY_PARTITION = re.compile(r"^rollups_hourly_p(\d{6})$")


def _text(name: str, comment: str) -> sa.Column[Any]:
    return sa.Column(name, sa.Text(), nullable=True, comment=comment)


def _seconds(name: str, comment: str) -> sa.Column[float]:
    return sa.Column(name, sa.Float(), server_default=sa.text("0"), nullable=False, comment=comment)


def _rollup_columns(time_name: str, time_comment: str) -> list[sa.Column[Any]]:
    return [
        sa.Column(time_name, TZ, nullable=False, comment=time_comment),
        sa.Column("holder_id", sa.BigInteger(), nullable=False, comment="holders.id"),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column(
            "mem_max_mib",
            sa.Integer(),
            nullable=True,
            comment="Most memory the holder held on the device in one interval, MiB.",
        ),
        _seconds("secs", "The holder's share of the device's seconds: each interval split equally among its holders."),
        _seconds("mem_known_s", "Seconds (whole, not shared) with a memory figure for the holder."),
        _seconds("mem_mib_s", "Sum of memory held x those seconds (MiB*s)."),
        *[
            _seconds(f"lt{b}_s", f"Of secs, those with the device's utilization under {b}%: idle-held, s.")
            for b in BOUNDS
        ],
    ]


def _hourly_months() -> list[date]:
    """The months rollups_hourly has partitions for, as the server names them (app.store.partitions)."""
    names = op.get_bind().execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'rollups_hourly'"
        )
    )
    return sorted(
        datetime.strptime(m.group(1), "%Y%m").date() for (name,) in names if (m := _HOURLY_PARTITION.match(name))
    )


def upgrade() -> None:
    op.create_table(
        "holders",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("instance_pk", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", TZ, nullable=False, comment="Start of the first interval it was seen in."),
        sa.Column("last_seen", TZ, nullable=False, comment="End of the last interval it was seen in."),
        sa.Column("started_at", TZ, nullable=True, comment="When the process started."),
        sa.Column("uid", sa.BigInteger(), nullable=True, comment="Real Unix user id."),
        sa.Column("pid", sa.Integer(), nullable=False, comment="Host process id."),
        sa.Column(
            "identity",
            sa.Text(),
            nullable=False,
            comment="What tells the process apart from others of its pid: 'start:' and started_at in microseconds "
            "since 1970 when known, else 'exe:' and the executable name.",
        ),
        _text("executable", "Executable name (/proc/<pid>/comm)."),
        _text("user_name", "The host's name for uid."),
        _text("container_id", "Container id, from the cgroup."),
        _text("pod_uid", "Kubernetes pod UID, from the cgroup."),
        _text("namespace", "Kubernetes namespace."),
        _text("pod", "Kubernetes pod name."),
        _text("job_id", "Slurm job id."),
        _text("job_step", "Slurm job step."),
        _text("command", "Command line, arguments separated by spaces."),
        sa.ForeignKeyConstraint(
            ["instance_pk"], ["instances.id"], name="fk_holders_instance_pk_instances", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_holders"),
        sa.UniqueConstraint("instance_pk", "pid", "identity", name="uq_holders_instance_pk_pid_identity"),
        # Every batch moves its holders' last_seen: free space, and no index on it, keep those updates HOT.
        postgresql_with={"fillfactor": 70},
    )
    # Partitioned by month like rollups_hourly, with its months; the server makes later ones
    # (app.store.partitions). Rows are updated in place as batches arrive: free space keeps those updates HOT.
    op.create_table(
        "holder_rollups_hourly",
        *_rollup_columns("hour", "Start of the UTC hour."),
        sa.PrimaryKeyConstraint("hour", "device_id", "holder_id", name="pk_holder_rollups_hourly"),
        postgresql_partition_by="RANGE (hour)",
    )
    for month in _hourly_months():
        end = (month.replace(day=28) + timedelta(days=4)).replace(day=1)
        op.execute(
            f"CREATE TABLE holder_rollups_hourly_p{month:%Y%m} PARTITION OF holder_rollups_hourly "
            f"FOR VALUES FROM ('{month:%Y-%m-%d} 00:00:00+00') TO ('{end:%Y-%m-%d} 00:00:00+00') "
            "WITH (fillfactor = 70)"
        )
    op.create_table(
        "holder_rollups_daily",
        *_rollup_columns("day", "Start of the UTC day."),
        sa.PrimaryKeyConstraint("day", "device_id", "holder_id", name="pk_holder_rollups_daily"),
        postgresql_with={"fillfactor": 70},
    )
    op.create_table(
        "device_holders_now",
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("holder_id", sa.BigInteger(), nullable=False, comment="holders.id"),
        sa.Column(
            "ts", TZ, nullable=False, comment="Start of the newest interval the holder was seen in on the device."
        ),
        sa.Column(
            "since", TZ, nullable=False, comment="Start of the first interval the holder was seen in on the device."
        ),
        sa.Column(
            "used_mib", sa.Integer(), nullable=True, comment="Memory held on the device in that newest interval, MiB."
        ),
        sa.PrimaryKeyConstraint("device_id", "holder_id", name="pk_device_holders_now"),
        postgresql_with={"fillfactor": 70},
    )


def downgrade() -> None:
    op.drop_table("device_holders_now")
    op.drop_table("holder_rollups_daily")
    op.drop_table("holder_rollups_hourly")
    op.drop_table("holders")
