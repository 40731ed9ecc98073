"""Holder groups: holder time per UTC hour or day, instance, grouping by holder (user, process, container,
namespace, pod, job) and value, weighed as the window analysis weighs devices; filled from the holder rollups
already stored.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 11:10:00.000000
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOURLY_PARTITION = re.compile(r"^holder_rollups_hourly_p(\d{6})$")
BOUNDS = (1, 5, 10, 25, 50)
TZ = sa.DateTime(timezone=True)
WEIGHED = ("secs_w", "known_w", "usum_w", *[f"lt{b}_w" for b in BOUNDS], "unsized_s")
_COMMENTS = {
    "secs_w": "GPU-seconds held: the holders' shares of the devices' seconds, x the device's weight.",
    "known_w": "Of which with a utilization figure for the device.",
    "usum_w": "The device's utilization x those GPU-seconds (%*s).",
    "unsized_s": "Seconds (of the clock) held on MIG slices of unknown size: no weight, no GPU-seconds.",
    **{f"lt{b}_w": f"Of secs_w, those with the device's utilization under {b}%: idle-held." for b in BOUNDS},
}
# As app.store.holder_groups has them when this revision was made.
VALUES_SQL = (
    "(VALUES ('user', coalesce(nullif(h.user_name, ''), 'uid ' || h.uid, ''), NULL), "
    "('process', coalesce(h.executable, ''), NULL), "
    "('container', coalesce(h.container_id, ''), left(h.container_id, 12)), "
    "('namespace', coalesce(h.namespace, ''), NULL), "
    "('pod', coalesce(h.pod_uid, h.namespace || '/' || h.pod, h.pod, ''), "
    "CASE WHEN h.pod IS NULL THEN NULL WHEN h.namespace IS NULL THEN h.pod ELSE h.namespace || '/' || h.pod END), "
    "('job', coalesce(h.job_id, ''), NULL)) AS g(grouping, key, label)"
)
WEIGHTS_SQL = (
    "SELECT g.id AS device_id, CASE WHEN g.mig_mode THEN 0.0 ELSE 1.0 END AS w, false AS unsized FROM gpus g "
    "UNION ALL SELECT s.id, coalesce(s.compute_slices / 7.0, 0.0), s.compute_slices IS NULL FROM mig_slices s"
)


def _columns(time_name: str, time_comment: str) -> list[sa.Column[Any]]:
    return [
        sa.Column(time_name, TZ, nullable=False, comment=time_comment),
        sa.Column("instance_pk", sa.BigInteger(), nullable=False),
        sa.Column("grouping", sa.Text(), nullable=False, comment="user, process, container, namespace, pod or job."),
        sa.Column("key", sa.Text(), nullable=False, comment="The value grouped by; empty for holders without one."),
        sa.Column(
            "label",
            sa.Text(),
            nullable=True,
            comment="How the value reads, where that is not the key (a pod's namespace/name).",
        ),
        *[sa.Column(n, sa.Float(), server_default=sa.text("0"), nullable=False, comment=_COMMENTS[n]) for n in WEIGHED],
    ]


def _months() -> list[date]:
    """The months holder_rollups_hourly has partitions for (app.store.partitions names them)."""
    names = op.get_bind().execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'holder_rollups_hourly'"
        )
    )
    return sorted(
        datetime.strptime(m.group(1), "%Y%m").date() for (name,) in names if (m := _HOURLY_PARTITION.match(name))
    )


def _backfill(target: str, source: str, time_column: str) -> None:
    """What the write path would have written, from the per-device holder rollups."""
    exprs = ["r.secs * w.w", "r.util_known_s * w.w", "r.util_sum * w.w", *[f"r.lt{b}_s * w.w" for b in BOUNDS]]
    sums = ", ".join([*(f"coalesce(sum({e}), 0)" for e in exprs), "coalesce(sum(r.secs) FILTER (WHERE w.unsized), 0)"])
    op.execute(
        f"INSERT INTO {target} ({time_column}, instance_pk, grouping, key, label, {', '.join(WEIGHED)}) "
        f"SELECT r.{time_column}, h.instance_pk, g.grouping, g.key, max(g.label), {sums} "
        f"FROM {source} r JOIN holders h ON h.id = r.holder_id JOIN ({WEIGHTS_SQL}) w ON w.device_id = r.device_id "
        f"CROSS JOIN LATERAL {VALUES_SQL} GROUP BY 1, 2, 3, 4"
    )


def upgrade() -> None:
    op.create_table(
        "holder_groups_hourly",
        *_columns("hour", "Start of the UTC hour."),
        sa.PrimaryKeyConstraint("grouping", "hour", "instance_pk", "key", name="pk_holder_groups_hourly"),
        postgresql_partition_by="RANGE (hour)",
    )
    for month in _months():
        end = (month.replace(day=28) + timedelta(days=4)).replace(day=1)
        op.execute(
            f"CREATE TABLE holder_groups_hourly_p{month:%Y%m} PARTITION OF holder_groups_hourly "
            f"FOR VALUES FROM ('{month:%Y-%m-%d} 00:00:00+00') TO ('{end:%Y-%m-%d} 00:00:00+00') "
            "WITH (fillfactor = 70)"
        )
    op.create_table(
        "holder_groups_daily",
        *_columns("day", "Start of the UTC day."),
        sa.PrimaryKeyConstraint("grouping", "day", "instance_pk", "key", name="pk_holder_groups_daily"),
        postgresql_with={"fillfactor": 70},
    )
    _backfill("holder_groups_hourly", "holder_rollups_hourly", "hour")
    _backfill("holder_groups_daily", "holder_rollups_daily", "day")


def downgrade() -> None:
    op.drop_table("holder_groups_daily")
    op.drop_table("holder_groups_hourly")
