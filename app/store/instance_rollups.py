"""The per-instance rollups: one row per instance per UTC hour and per UTC day, its devices' rollup sums already
weighed by what each device is (docs/storage.md, "Per-instance rollups"). The charts over time read them: a
fleet's hour is a few hundred of these rows instead of one per GPU and MIG slice.

Weights are those of the window analysis (app/analyse/waste.py, build_units), taken when the seconds arrive:

- a passthrough GPU weighs 1, a MIG slice of known size compute slices / 7 (`*_w` columns: GPU-seconds);
- a MIG-mode GPU's own seconds are capacity (`cap_s`) when its layout is known in full; its sized slices'
  weighed seconds (`sliced_w`) are what is partitioned of it, so unpartitioned = cap_s - sliced_w;
- every GPU's own seconds (`gpu_s`) say how much of the time it was expected in the instance had data;
- a slice of unknown size is left out.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, Float, Index, PrimaryKeyConstraint, Table, text

from ..models import TZ, UTIL_BOUNDS, Base

WEIGHED = (
    "secs_w",
    "known_w",
    *[f"lt{b}_w" for b in UTIL_BOUNDS],
    *[f"free{b}_w" for b in UTIL_BOUNDS],
    "cap_s",
    "sliced_w",
    "gpu_s",
)
"""The sum columns, in table order."""

_COMMENTS = {
    "secs_w": "GPU-seconds covered: passthrough GPUs x 1, sized MIG slices x compute slices / 7.",
    "known_w": "Of which with a utilization figure.",
    "cap_s": "Seconds of MIG-mode GPUs whose layout is known in full: capacity to split into slices.",
    "sliced_w": "GPU-seconds of the sized slices of those GPUs (unpartitioned = cap_s - sliced_w).",
    "gpu_s": "Seconds of every GPU's own data, MIG or not (offline = expected - gpu_s).",
}


def _comment(name: str) -> str:
    if name in _COMMENTS:
        return _COMMENTS[name]
    bound = name.removeprefix("lt").removeprefix("free").removesuffix("_w")
    if name.startswith("lt"):
        return f"Of which with utilization under {bound}%."
    return f"Of which under {bound}% with no process and memory under the held bound."


def _columns(time_name: str, time_comment: str) -> list[Column[Any]]:
    return [
        Column(time_name, TZ, nullable=False, comment=time_comment),
        Column("instance_pk", BigInteger, nullable=False),
        *[Column(n, Float, nullable=False, server_default=text("0"), comment=_comment(n)) for n in WEIGHED],
    ]


instance_rollups_hourly = Table(
    "instance_rollups_hourly",
    Base.metadata,
    *_columns("hour", "Start of the UTC hour."),
    PrimaryKeyConstraint("hour", "instance_pk"),
    postgresql_with={"fillfactor": 70},
)
instance_rollups_daily = Table(
    "instance_rollups_daily",
    Base.metadata,
    *_columns("day", "Start of the UTC day."),
    PrimaryKeyConstraint("day", "instance_pk"),
    postgresql_with={"fillfactor": 70},
)
Index("ix_instance_rollups_hourly_instance", instance_rollups_hourly.c.instance_pk, instance_rollups_hourly.c.hour)

# What each device weighs (see the module docstring), as of now: the write path joins it per batch.
# A GPU's layout is known in full when the agent sized every MIG device and no live slice lacks a size
# (app/analyse/fleet.py, layout_known).
_KNOWN = (
    "g.layout_complete AND NOT EXISTS (SELECT FROM mig_slices u WHERE u.gpu_pk = g.id AND u.retired_at IS NULL "
    "AND u.compute_slices IS NULL)"
)
DEVICE_WEIGHTS_SQL = (
    "SELECT g.id AS device_id, g.instance_pk, CASE WHEN g.mig_mode THEN 0.0 ELSE 1.0 END AS w, "
    f"CASE WHEN g.mig_mode AND {_KNOWN} THEN 1.0 ELSE 0.0 END AS cap, 0.0 AS sliced, 1.0 AS own FROM gpus g "
    "UNION ALL SELECT s.id, g.instance_pk, s.compute_slices / 7.0, 0.0, "
    f"CASE WHEN {_KNOWN} THEN s.compute_slices / 7.0 ELSE 0.0 END, 0.0 "
    "FROM mig_slices s JOIN gpus g ON g.id = s.gpu_pk WHERE s.compute_slices IS NOT NULL"
)


def weighed_exprs(*, secs: str, known: str, lt: str, free: str) -> dict[str, str]:
    """Each sum column as an aggregate over rows joined to DEVICE_WEIGHTS_SQL as `r`: `secs`, `known` are the
    seconds expressions of the source, `lt` and `free` format strings with `{b}` for the bound."""
    exprs = {"secs_w": f"sum(({secs}) * r.w)", "known_w": f"sum(({known}) * r.w)"}
    for b in UTIL_BOUNDS:
        exprs[f"lt{b}_w"] = f"sum(({lt.format(b=b)}) * r.w)"
        exprs[f"free{b}_w"] = f"sum(({free.format(b=b)}) * r.w)"
    exprs["cap_s"] = f"sum(({secs}) * r.cap)"
    exprs["sliced_w"] = f"sum(({secs}) * r.sliced)"
    exprs["gpu_s"] = f"sum(({secs}) * r.own)"
    return exprs


def _upsert(table: Table, time_column: str, bucket: str, mem_held_mib: int) -> str:
    """Fold a batch's new pieces (`ingest_piece`, app/store/samples.py) into one per-instance rollup table. The
    pieces are summed per device and hour first, so each device's weight is looked up once per hour, not once
    per piece."""
    free = f"coalesce(procs, 0) = 0 AND coalesce(mem_used_mib, 0) < {int(mem_held_mib)}"
    per_hour = ["sum(new_s) AS secs", "coalesce(sum(new_s) FILTER (WHERE util IS NOT NULL), 0) AS known"]
    for b in UTIL_BOUNDS:
        per_hour.append(f"coalesce(sum(new_s) FILTER (WHERE util < {b}), 0) AS lt{b}")
        per_hour.append(f"coalesce(sum(new_s) FILTER (WHERE util < {b} AND {free}), 0) AS free{b}")
    exprs = weighed_exprs(secs="p.secs", known="p.known", lt="p.lt{b}", free="p.free{b}")
    sums = ", ".join(f"coalesce({exprs[n]}, 0)" for n in WEIGHED)
    updates = ", ".join(f"{n} = {table.name}.{n} + excluded.{n}" for n in WEIGHED)
    return (
        f"INSERT INTO {table.name} ({time_column}, instance_pk, {', '.join(WEIGHED)}) "
        f"SELECT {bucket}, r.instance_pk, {sums} "
        f"FROM (SELECT device_id, hour, {', '.join(per_hour)} FROM ingest_piece GROUP BY 1, 2) p "
        f"JOIN ({DEVICE_WEIGHTS_SQL}) r ON r.device_id = p.device_id GROUP BY 1, 2 "
        f"ON CONFLICT ({time_column}, instance_pk) DO UPDATE SET {updates}"
    )


def instance_upserts(mem_held_mib: int) -> tuple[str, str]:
    """The hourly and the daily per-instance upserts of a batch's pieces."""
    return (
        _upsert(instance_rollups_hourly, "hour", "p.hour", mem_held_mib),
        _upsert(instance_rollups_daily, "day", "date_trunc('day', p.hour)", mem_held_mib),
    )
