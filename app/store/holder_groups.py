"""Holder time per instance and per value of each grouping by holder: one row per UTC hour or day, instance, grouping
(`user`, `process`, `container`, `namespace`, `pod`, `job`) and value, the seconds weighed as the window analysis
weighs its units (docs/storage.md, "Holder groups").

A month of the fleet by user is then a few rows per instance and user, whatever number of processes ran: the
per-device holder rollups (app/store/holders.py) have a row per process, and processes come and go by the thousand.
Written in the batch's transaction with the other holder rollups, from the same new pieces, so the two agree.

Weights are those of app/store/instance_rollups.py, taken when the seconds arrive: a passthrough GPU weighs 1, a MIG
slice of known size compute slices / 7; a slice of unknown size adds clock seconds to `unsized_s` only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, Float, Index, PrimaryKeyConstraint, Table, Text, text

from ..models import TZ, UTIL_BOUNDS, Base

WEIGHED = ("secs_w", "known_w", "usum_w", *[f"lt{b}_w" for b in UTIL_BOUNDS], "unsized_s")
"""The sum columns, in table order."""

_COMMENTS = {
    "secs_w": "GPU-seconds held: the holders' shares of the devices' seconds, x the device's weight.",
    "known_w": "Of which with a utilization figure for the device.",
    "usum_w": "The device's utilization x those GPU-seconds (%*s).",
    "unsized_s": "Seconds (of the clock) held on MIG slices of unknown size: no weight, no GPU-seconds.",
}


def _comment(name: str) -> str:
    if name in _COMMENTS:
        return _COMMENTS[name]
    return f"Of secs_w, those with the device's utilization under {name[2:-2]}%: idle-held."


def holder_group_columns(time_name: str, time_comment: str) -> list[Column[Any]]:
    """Shared by the hourly and daily tables: a day's row is what its hours add up to."""
    return [
        Column(time_name, TZ, nullable=False, comment=time_comment),
        Column("instance_pk", BigInteger, nullable=False),
        Column("grouping", Text, nullable=False, comment="user, process, container, namespace, pod or job."),
        Column("key", Text, nullable=False, comment="The value grouped by; empty for holders without one."),
        Column("label", Text, comment="How the value reads, where that is not the key (a pod's namespace/name)."),
        *[Column(n, Float, nullable=False, server_default=text("0"), comment=_comment(n)) for n in WEIGHED],
    ]


# Keyed by grouping first: a report by user reads a range of the key. Partitioned by month like rollups_hourly, with
# the same partitions and retention (app.store.partitions).
holder_groups_hourly = Table(
    "holder_groups_hourly",
    Base.metadata,
    *holder_group_columns("hour", "Start of the UTC hour."),
    PrimaryKeyConstraint("grouping", "hour", "instance_pk", "key"),
    postgresql_partition_by="RANGE (hour)",
)
# Not partitioned, like rollups_daily: retention deletes old days. Rows are updated in place as batches arrive.
holder_groups_daily = Table(
    "holder_groups_daily",
    Base.metadata,
    *holder_group_columns("day", "Start of the UTC day."),
    PrimaryKeyConstraint("grouping", "day", "instance_pk", "key"),
    postgresql_with={"fillfactor": 70},
)
# By instance too: a grouping by holder reads the hours of each price piece of an instance
# (app/analyse/holder_groups.py).
Index(
    "ix_holder_groups_hourly_instance",
    holder_groups_hourly.c.grouping,
    holder_groups_hourly.c.instance_pk,
    holder_groups_hourly.c.hour,
)
Index(
    "ix_holder_groups_daily_instance",
    holder_groups_daily.c.grouping,
    holder_groups_daily.c.instance_pk,
    holder_groups_daily.c.day,
)

# Each holder's value in each grouping, as app/analyse/holders.py names them: (grouping, key, label). A user the
# host could not name is its uid; a pod is its UID, read as namespace/name where the name is known.
VALUES_SQL = (
    "(VALUES ('user', coalesce(nullif(h.user_name, ''), 'uid ' || h.uid, ''), NULL), "
    "('process', coalesce(h.executable, ''), NULL), "
    "('container', coalesce(h.container_id, ''), left(h.container_id, 12)), "
    "('namespace', coalesce(h.namespace, ''), NULL), "
    "('pod', coalesce(h.pod_uid, h.namespace || '/' || h.pod, h.pod, ''), "
    "CASE WHEN h.pod IS NULL THEN NULL WHEN h.namespace IS NULL THEN h.pod ELSE h.namespace || '/' || h.pod END), "
    "('job', coalesce(h.job_id, ''), NULL)) AS v(grouping, key, label)"
)

_SECONDS = ("secs", "known", "usum", *[f"lt{b}" for b in UTIL_BOUNDS])


def _on_conflict(table: Table, time_column: str) -> str:
    updates = ", ".join(f"{n} = {table.name}.{n} + excluded.{n}" for n in WEIGHED)
    return (
        f"ON CONFLICT (grouping, {time_column}, instance_pk, key) DO UPDATE SET "
        f"label = coalesce(excluded.label, {table.name}.label), {updates}"
    )


def _upsert() -> str:
    """Fold a batch's new pieces of held devices into both holder group tables, in one statement (`ingest_piece`,
    `ingest_holder_ref`, `ingest_holder_map`: app/store/holders.py). The pieces are summed per hour, device and
    holder first, so each device's weight and each holder's row are looked up once, by key; the hours' rows are
    made once and summed again per day. A label already stored stays unless the new one is known."""
    share = "p.new_s * r.share"
    per_holder = [
        f"sum({share}) AS secs",
        f"coalesce(sum({share}) FILTER (WHERE p.util IS NOT NULL), 0) AS known",
        f"coalesce(sum({share} * p.util), 0) AS usum",
        *[f"coalesce(sum({share}) FILTER (WHERE p.util < {b}), 0) AS lt{b}" for b in UTIL_BOUNDS],
    ]
    weighed = [f"sum(q.{n} * q.w) AS {w}" for n, w in zip(_SECONDS, WEIGHED, strict=False)]
    weighed.append("coalesce(sum(q.secs) FILTER (WHERE q.unsized), 0) AS unsized_s")
    columns = f"instance_pk, grouping, key, label, {', '.join(WEIGHED)}"
    daily = ", ".join(f"sum({n})" for n in WEIGHED)
    return (
        f"WITH q AS (SELECT p.hour, p.device_id, m.holder_id, {', '.join(per_holder)} FROM ingest_piece p "
        "JOIN ingest_holder_ref r ON r.ord = p.ord JOIN ingest_holder_map m ON m.slot = r.slot GROUP BY 1, 2, 3), "
        "wq AS (SELECT q.*, CASE WHEN g.id IS NOT NULL THEN CASE WHEN g.mig_mode THEN 0.0 ELSE 1.0 END "
        "ELSE coalesce(s.compute_slices / 7.0, 0.0) END AS w, s.id IS NOT NULL AND s.compute_slices IS NULL AS unsized "
        "FROM q LEFT JOIN gpus g ON g.id = q.device_id LEFT JOIN mig_slices s ON s.id = q.device_id), "
        f"a AS (SELECT q.hour, h.instance_pk, v.grouping, v.key, max(v.label) AS label, {', '.join(weighed)} "
        f"FROM wq q JOIN holders h ON h.id = q.holder_id CROSS JOIN LATERAL {VALUES_SQL} GROUP BY 1, 2, 3, 4), "
        f"hourly AS (INSERT INTO holder_groups_hourly (hour, {columns}) SELECT * FROM a "
        f"{_on_conflict(holder_groups_hourly, 'hour')}) "
        f"INSERT INTO holder_groups_daily (day, {columns}) SELECT date_trunc('day', hour), instance_pk, grouping, key, "
        f"max(label), {daily} FROM a GROUP BY 1, 2, 3, 4 {_on_conflict(holder_groups_daily, 'day')}"
    )


UPSERT = _upsert()
"""The statement that folds a batch's holders' new pieces into the hourly and daily holder groups."""
