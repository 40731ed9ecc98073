"""5-minute rollups: one row per device per 5 minutes for the charts, partitioned by day, back-filled from samples.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 07:00:00.000000
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A device whose instance has no collection interval on record counts its samples as the agent's default.
_DEFAULT_INTERVAL_S = 10.0

# The bucket as the write path cuts it. The origin is a UTC instant written out, so the buckets do not depend on
# the session's time zone, which Alembic's connection leaves at the server's default.
_BUCKET = "date_bin('5 minutes', s.ts, timestamptz '2000-01-01 00:00:00+00')"

_SAMPLES_PARTITION = re.compile(r"^samples_p(\d{8})$")


def _seconds(name: str, comment: str) -> sa.Column[float]:
    return sa.Column(name, sa.Float(), server_default=sa.text("0"), nullable=False, comment=comment)


def _columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False, comment="Start of the 5-minute bucket, UTC."),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("mem_max", sa.Integer(), nullable=True),
        _seconds("secs", "Seconds covered by samples."),
        _seconds("util_known_s", "Seconds with a utilization figure."),
        _seconds("util_sum", "Sum of utilization x seconds (%*s)."),
        _seconds("mem_known_s", "Seconds with a memory figure."),
        _seconds("mem_sum", "Sum of memory used x seconds (MiB*s)."),
        _seconds("power_known_s", "Seconds with a power figure."),
        _seconds("power_sum", "Sum of power x seconds (J)."),
        sa.Column("util_max", sa.REAL(), nullable=True),
        sa.Column("power_max", sa.SmallInteger(), nullable=True),
    ]


def backfill_sql() -> str:
    """Each device's 5-minute rows from the samples raw retention still holds, as the write path would have built
    them: an interval counts in the bucket it starts in.

    A sample's length is its instance's collection interval (a GPU's instance is where it was last seen; a slice's
    is its GPU's), looked up per device, not per sample: the inventory is small.
    """
    aggregates = {
        "mem_max": "max(s.mem_used_mib)",
        "secs": "sum(s.dur)",
        "util_known_s": "sum(s.dur) FILTER (WHERE s.util IS NOT NULL)",
        "util_sum": "sum(s.util * s.dur)",
        "mem_known_s": "sum(s.dur) FILTER (WHERE s.mem_used_mib IS NOT NULL)",
        "mem_sum": "sum(s.mem_used_mib * s.dur)",
        "power_known_s": "sum(s.dur) FILTER (WHERE s.power_w IS NOT NULL)",
        "power_sum": "sum(s.power_w * s.dur)",
        "util_max": "max(s.util)",
        "power_max": "max(s.power_w)",
    }
    selects = ", ".join(e if n.endswith("_max") else f"coalesce({e}, 0)" for n, e in aggregates.items())
    durations = (
        f"SELECT dev.id AS device_id, coalesce(i.interval_s, {_DEFAULT_INTERVAL_S}) AS dur "
        "FROM (SELECT id, instance_pk FROM gpus "
        "UNION ALL SELECT m.id, g.instance_pk FROM mig_slices m JOIN gpus g ON g.id = m.gpu_pk) dev "
        "LEFT JOIN instances i ON i.id = dev.instance_pk"
    )
    timed = (
        f"SELECT smp.ts, smp.device_id, smp.mem_used_mib, smp.util, smp.power_w, "
        f"coalesce(d.dur, {_DEFAULT_INTERVAL_S}) AS dur FROM samples smp "
        "LEFT JOIN durations d ON d.device_id = smp.device_id"
    )
    return (
        f"WITH durations AS MATERIALIZED ({durations}) "
        f"INSERT INTO rollups_5m (bucket, device_id, {', '.join(aggregates)}) "
        f"SELECT {_BUCKET}, s.device_id, {selects} FROM ({timed}) s GROUP BY 1, 2"
    )


def _samples_days() -> list[datetime]:
    names = op.get_bind().execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'samples'"
        )
    )
    return sorted(datetime.strptime(m.group(1), "%Y%m%d") for (name,) in names if (m := _SAMPLES_PARTITION.match(name)))


def upgrade() -> None:
    # The primary key comes after the back-fill: one index build per partition is cheaper than an index insert
    # per row.
    op.create_table("rollups_5m", *_columns(), postgresql_partition_by="RANGE (bucket)")
    # The same days as samples, as the server makes them (app.store.partitions): a day's bounds are UTC midnights
    # written out. Rows are updated in place as batches arrive; free space on each page keeps those updates HOT.
    for day in _samples_days():
        lo, hi = (f"{d:%Y-%m-%d} 00:00:00+00" for d in (day, day + timedelta(days=1)))
        op.execute(
            f"CREATE TABLE rollups_5m_p{day:%Y%m%d} PARTITION OF rollups_5m "
            f"FOR VALUES FROM ('{lo}') TO ('{hi}') WITH (fillfactor = 70)"
        )
    op.execute(backfill_sql())
    op.create_primary_key(op.f("pk_rollups_5m"), "rollups_5m", ["device_id", "bucket"])


def downgrade() -> None:
    op.drop_table("rollups_5m")
