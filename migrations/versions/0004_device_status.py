"""Device status: one row per device with its newest sample and its current idle stretch, back-filled from samples.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 06:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rollup histogram's bounds as of this revision; written out so the migration does not change with the app.
_UTIL_BOUNDS = (1, 5, 10, 25, 50)

# The held bound the back-fill applies: GPUFLEET_MEM_HELD_MIB's default. A migration cannot see the server's
# settings; a server run with another bound corrects the stretches as new busy intervals restart them.
_MEM_HELD_MIB = 256

# A device whose instance has no collection interval on record counts its samples as the agent's default.
_DEFAULT_INTERVAL_S = 10.0

_NEWEST = ("ts", "dur", "util", "mem_used_mib", "util_source", "procs", "power_w", "temp_c")


def _tz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _seconds(name: str, comment: str) -> sa.Column[float]:
    return sa.Column(name, sa.Float(), server_default=sa.text("0"), nullable=False, comment=comment)


def _columns() -> list[sa.Column[Any]]:
    columns: list[sa.Column[Any]] = [
        sa.Column("device_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", _tz(), nullable=False, comment="Start of the newest interval seen."),
        sa.Column("dur", sa.Float(), nullable=False, comment="Length of the newest interval, s."),
        sa.Column("util", sa.REAL(), nullable=True, comment="Newest sample: utilization, %; NULL when unmeasurable."),
        sa.Column("mem_used_mib", sa.Integer(), nullable=True, comment="Newest sample: memory allocated, MiB."),
        sa.Column("util_source", sa.SmallInteger(), nullable=False, comment="Newest sample: where util came from."),
        sa.Column("procs", sa.SmallInteger(), nullable=True, comment="Newest sample: compute processes."),
        sa.Column("power_w", sa.SmallInteger(), nullable=True, comment="Newest sample: mean power, W."),
        sa.Column("temp_c", sa.SmallInteger(), nullable=True, comment="Newest sample: temperature, degrees C."),
    ]
    for b in _UTIL_BOUNDS:
        columns += [
            sa.Column(
                f"busy_until_{b}",
                _tz(),
                nullable=True,
                comment=f"End of the newest interval at or above {b}% or of unknown utilization; NULL if never.",
            ),
            _seconds(
                f"quiet_s_{b}", f"Seconds of samples starting at or after busy_until_{b}: the current idle stretch."
            ),
            _seconds(f"quiet_free_s_{b}", f"Of quiet_s_{b}, seconds with no process and memory under the held bound."),
        ]
    return columns


def backfill_sql() -> str:
    """Each device's row from the samples raw retention still holds, as the write path would have built it from
    the same samples arriving in order.

    A sample's length is its instance's collection interval (a GPU's instance is where it was last seen; a slice's
    is its GPU's). Two passes, each a hash aggregate over samples rather than a sort of all of them: the first
    finds per device the newest start and each bound's busy_until, the second sums the seconds after busy_until
    and picks the newest row's values. No date is truncated, and adding seconds to a timestamptz does not depend
    on the session's time zone, which Alembic's connection leaves at the server's default.
    """
    free = f"(coalesce(s.procs, 0) = 0 AND coalesce(s.mem_used_mib, 0) < {_MEM_HELD_MIB})"
    busy_until = ", ".join(
        f"max(s.ts + s.dur * interval '1 second') FILTER (WHERE s.util IS NULL OR s.util >= {b}) AS busy_until_{b}"
        for b in _UTIL_BOUNDS
    )
    # max() over the one row that starts at the device's newest start: that row's values. The first pass's
    # per-device figures are the same on every row of the device; max() carries them through the GROUP BY.
    selects = ["max(f.ts)"] + [f"max(s.{n}) FILTER (WHERE s.ts = f.ts)" for n in _NEWEST[1:]]
    columns = list(_NEWEST)
    for b in _UTIL_BOUNDS:
        quiet = f"(f.busy_until_{b} IS NULL OR s.ts >= f.busy_until_{b})"
        columns += [f"busy_until_{b}", f"quiet_s_{b}", f"quiet_free_s_{b}"]
        selects += [
            f"max(f.busy_until_{b})",
            f"coalesce(sum(s.dur) FILTER (WHERE {quiet}), 0)",
            f"coalesce(sum(s.dur) FILTER (WHERE {quiet} AND {free}), 0)",
        ]
    # Per device, not per sample: the inventory is small, and the samples are read twice but never materialized.
    durations = (
        f"SELECT dev.id AS device_id, coalesce(i.interval_s, {_DEFAULT_INTERVAL_S}) AS dur "
        "FROM (SELECT id, instance_pk FROM gpus "
        "UNION ALL SELECT m.id, g.instance_pk FROM mig_slices m JOIN gpus g ON g.id = m.gpu_pk) dev "
        "LEFT JOIN instances i ON i.id = dev.instance_pk"
    )
    timed = (
        f"SELECT smp.*, coalesce(d.dur, {_DEFAULT_INTERVAL_S}) AS dur FROM samples smp "
        "LEFT JOIN durations d ON d.device_id = smp.device_id"
    )
    return (
        f"WITH durations AS MATERIALIZED ({durations}), timed AS NOT MATERIALIZED ({timed}), "
        f"firsts AS (SELECT s.device_id, max(s.ts) AS ts, {busy_until} FROM timed s GROUP BY s.device_id) "
        f"INSERT INTO device_status (device_id, {', '.join(columns)}) "
        f"SELECT s.device_id, {', '.join(selects)} FROM timed s JOIN firsts f ON f.device_id = s.device_id "
        "GROUP BY s.device_id"
    )


def upgrade() -> None:
    # Every batch updates its devices' rows and no indexed column changes: free space on each page keeps those
    # updates HOT.
    op.create_table(
        "device_status",
        *_columns(),
        sa.PrimaryKeyConstraint("device_id", name=op.f("pk_device_status")),
        postgresql_with={"fillfactor": 70},
    )
    op.execute(backfill_sql())


def downgrade() -> None:
    op.drop_table("device_status")
