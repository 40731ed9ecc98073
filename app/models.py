"""Tables. Inventory and tokens are ORM classes; the time-series tables are Core tables, written in bulk.

Devices (whole GPUs and MIG slices) draw their ids from one sequence, so a sample row names its device with
one int4 whatever its kind.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSTZMULTIRANGE
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TZ = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


device_id_seq = Sequence("device_id_seq", metadata=Base.metadata, start=1)

SCOPES = ("ingest", "read", "admin")


class ApiToken(Base):
    """A bearer token. Only the SHA-256 of the secret is kept; the secret is shown once at creation."""

    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("scope IN ('ingest', 'read', 'admin')", name="scope"),)

    id: Mapped[int] = mapped_column(Integer, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16), comment="First characters of the secret, for listings.")
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    last_used_at: Mapped[datetime | None] = mapped_column(TZ)
    revoked_at: Mapped[datetime | None] = mapped_column(TZ)
    # Added by migration 0009.
    instance_id: Mapped[str | None] = mapped_column(
        String(128), index=True, comment="The one instance an ingest token may report; NULL: any not bound otherwise."
    )


class WebSession(Base):
    """A dashboard login. The browser's cookie holds a random id; only its SHA-256 is kept. A session opened with
    a token ends when the token is revoked (or deleted); one opened with the admin password ends when the
    configured password hash changes."""

    __tablename__ = "web_sessions"
    __table_args__ = (
        CheckConstraint("(token_id IS NULL) <> (password_sha256 IS NULL)", name="one_credential"),
        Index("ix_web_sessions_expires_at", "expires_at"),
    )

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    password_sha256: Mapped[str | None] = mapped_column(
        String(64), comment="SHA-256 of the admin password hash the session was opened with."
    )
    csrf_secret: Mapped[str] = mapped_column(String(64), comment="Token that the session's state-changing forms carry.")
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    expires_at: Mapped[datetime] = mapped_column(TZ)


class Instance(Base):
    """One host that runs an agent: an EC2 instance, or an on-premises machine named by host id."""

    __tablename__ = "instances"
    __table_args__ = (
        CheckConstraint("lifecycle IN ('spot', 'on-demand', 'on-prem')", name="lifecycle"),
        Index("ix_instances_last_seen", "last_seen"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    instance_id: Mapped[str] = mapped_column(String(128), unique=True)
    hostname: Mapped[str | None] = mapped_column(String(255))
    instance_type: Mapped[str | None] = mapped_column(String(64))
    region: Mapped[str | None] = mapped_column(String(32))
    availability_zone: Mapped[str | None] = mapped_column(String(32))
    lifecycle: Mapped[str | None] = mapped_column(String(16))
    ami_id: Mapped[str | None] = mapped_column(String(64))
    tags: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    agent_version: Mapped[str | None] = mapped_column(String(32))
    interval_s: Mapped[float | None] = mapped_column(Float, comment="Agent collection interval, s.")
    first_seen: Mapped[datetime] = mapped_column(TZ)
    last_seen: Mapped[datetime] = mapped_column(TZ)
    # Added by migration 0002, which appends them: declared in that order so models and migrations agree.
    price_usd_per_hour: Mapped[float | None] = mapped_column(
        Float, comment="Price configured on the agent (on-premises hosts), USD per hour."
    )
    agent_errors: Mapped[dict[str, int]] = mapped_column(
        JSONB,
        server_default=text("'{}'::jsonb"),
        comment="NVML call failures per 'call:reason' in the newest batch, count since the agent's previous batch.",
    )
    # Added by migration 0009.
    identity_account_id: Mapped[str | None] = mapped_column(
        String(12),
        comment="AWS account of the signed instance identity this instance reported with; once set, only a "
        "verified identity may report it.",
    )


class Gpu(Base):
    """A physical GPU, known by its NVML UUID; `instance_pk` is where it was last seen."""

    __tablename__ = "gpus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, server_default=device_id_seq.next_value())
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    instance_pk: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), index=True)
    gpu_index: Mapped[int] = mapped_column(SmallInteger)
    name: Mapped[str] = mapped_column(String(128))
    memory_total_mib: Mapped[int | None] = mapped_column(Integer)
    mig_mode: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    unpartitioned_slices: Mapped[int | None] = mapped_column(
        SmallInteger, comment="MIG compute slices (of 7) in no GPU instance, as last reported."
    )
    util_reason: Mapped[str | None] = mapped_column(Text, comment="Why utilization is absent, if it is.")
    first_seen: Mapped[datetime] = mapped_column(TZ)
    updated_at: Mapped[datetime] = mapped_column(TZ)
    # Added by migration 0007, which appends them.
    layout_complete: Mapped[bool] = mapped_column(
        Boolean,
        server_default=text("true"),
        comment="False when the agent found a MIG device it could not size: free MIG capacity unknown.",
    )
    permission_denied: Mapped[list[dict[str, str]]] = mapped_column(
        JSONB,
        server_default=text("'[]'::jsonb"),
        comment="Figures NVML refused at the agent's privilege, as last reported: [{figure, call, grant}].",
    )


class MigSlice(Base):
    """A MIG device (GPU instance + compute instance). A reconfigured slot retires the old row."""

    __tablename__ = "mig_slices"
    __table_args__ = (
        CheckConstraint("compute_slices BETWEEN 1 AND 7", name="compute_slices"),
        Index("uq_mig_slices_live_uuid", "uuid", unique=True, postgresql_where=text("retired_at IS NULL")),
        Index(
            "uq_mig_slices_live_slot",
            "gpu_pk",
            "gpu_instance_id",
            "compute_instance_id",
            unique=True,
            postgresql_where=text("retired_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, server_default=device_id_seq.next_value())
    uuid: Mapped[str] = mapped_column(String(96))
    gpu_pk: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    gpu_instance_id: Mapped[int] = mapped_column(Integer)
    compute_instance_id: Mapped[int] = mapped_column(Integer)
    profile: Mapped[str] = mapped_column(String(32))
    compute_slices: Mapped[int | None] = mapped_column(
        SmallInteger, comment="Compute slices out of 7; NULL when the agent could not read the size."
    )
    memory_total_mib: Mapped[int | None] = mapped_column(Integer)
    util_reason: Mapped[str | None] = mapped_column(Text, comment="Why utilization is absent, if it is.")
    first_seen: Mapped[datetime] = mapped_column(TZ)
    retired_at: Mapped[datetime | None] = mapped_column(TZ)


class Event(Base):
    """Something that happened to the inventory (GPU moved, MIG reconfigured) or that an agent reported."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_instance_pk_ts", "instance_pk", "ts"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    ts: Mapped[datetime] = mapped_column(TZ, index=True)
    instance_pk: Mapped[int | None] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    device_id: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))


class IngestBatch(Base):
    """One accepted batch, by the id its agent chose: a re-sent batch finds its row and writes nothing."""

    __tablename__ = "ingest_batches"
    __table_args__ = (Index("ix_ingest_batches_received_at", "received_at"),)

    batch_id: Mapped[Any] = mapped_column(Uuid(as_uuid=True), primary_key=True)
    instance_pk: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"))
    received_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    samples: Mapped[int] = mapped_column(Integer)
    dropped_batches: Mapped[int] = mapped_column(Integer, server_default=text("0"))


# Column order is storage order: widest first, so no alignment padding between fields. ALTER TABLE can only
# append, so columns added later form their own widest-first group after the first, which ends on an 8-byte
# boundary.
samples = Table(
    "samples",
    Base.metadata,
    Column("ts", TZ, nullable=False, comment="Interval start, UTC."),
    Column("device_id", Integer, nullable=False),
    Column("mem_used_mib", Integer, comment="Memory allocated, MiB (NVML v2: reserved memory not counted)."),
    Column("util", REAL, comment="Mean utilization over the interval, %; NULL when unmeasurable."),
    Column("sm_active", REAL, comment="Mean SM activity, %, where the hardware gives it."),
    Column("power_w", SmallInteger, comment="Mean power over the interval, W."),
    Column("temp_c", SmallInteger, comment="Temperature, degrees C."),
    Column("procs", SmallInteger, comment="Compute processes on the device."),
    Column("util_source", SmallInteger, nullable=False, comment="Where util came from: see app.sources."),
    # Migration 0002: figures for charts and health checks, not rolled up.
    Column("gr_active", REAL, comment="Mean graphics-engine activity over the interval, % (NVML GPM)."),
    Column("ecc_uncorrected", Integer, comment="Volatile uncorrected ECC errors since the driver loaded, count."),
    Column("procs_mem_mib", Integer, comment="Memory held by the device's compute processes, MiB."),
    Column("sm_clock_mhz", SmallInteger, comment="SM clock at the interval end, MHz."),
    postgresql_partition_by="RANGE (ts)",
)
Index(
    "ix_samples_ts_brin",
    samples.c.ts,
    postgresql_using="brin",
    postgresql_with={"pages_per_range": 32, "autosummarize": "on"},
)
Index(
    "ix_samples_device_bloom",
    samples.c.device_id,
    postgresql_using="brin",
    postgresql_ops={"device_id": "int4_bloom_ops(n_distinct_per_range = 256)"},
    postgresql_with={"pages_per_range": 4, "autosummarize": "on"},
)

# Fixed utilization bounds (%) of the rollup histogram; later analysis picks its idle threshold among them.
UTIL_BOUNDS = (1, 5, 10, 25, 50)


def _seconds(name: str, comment: str) -> Column[float]:
    return Column(name, Float, nullable=False, server_default=text("0"), comment=comment)


def _rollup_columns(time_name: str, time_comment: str) -> list[Column[Any]]:
    """The columns of a rollup table: its time bucket, the device, then sums and maxima.

    Shared by the hourly and daily tables so that they cannot drift apart: the write path folds the same
    expressions into both, and a daily row is the sum (or maximum) of the hourly rows of its day.
    """
    return [
        Column(time_name, TZ, nullable=False, comment=time_comment),
        Column("device_id", Integer, nullable=False),
        _seconds("secs", "Seconds covered by samples."),
        _seconds("util_known_s", "Seconds with a utilization figure."),
        _seconds("util_sum", "Sum of utilization x seconds (%*s)."),
        Column("util_max", REAL),
        _seconds("sm_known_s", "Seconds with an SM activity figure."),
        _seconds("sm_sum", "Sum of SM activity x seconds (%*s)."),
        Column("sm_max", REAL),
        _seconds("mem_known_s", "Seconds with a memory figure."),
        _seconds("mem_sum", "Sum of memory used x seconds (MiB*s)."),
        Column("mem_max", Integer),
        _seconds("power_known_s", "Seconds with a power figure."),
        _seconds("power_sum", "Sum of power x seconds (J)."),
        Column("power_max", SmallInteger),
        Column("temp_max", SmallInteger),
        _seconds("no_proc_s", "Seconds with no compute process."),
        _seconds("mem_held_s", "Seconds with memory used at or above the held bound."),
        *[_seconds(f"util_lt{b}_s", f"Seconds with utilization under {b}%.") for b in UTIL_BOUNDS],
        *[
            _seconds(f"free_lt{b}_s", f"Seconds under {b}% with no process and memory under the held bound.")
            for b in UTIL_BOUNDS
        ],
    ]


rollups_hourly = Table(
    "rollups_hourly",
    Base.metadata,
    *_rollup_columns("hour", "Start of the UTC hour."),
    # Migration 0008, which appends it.
    Column(
        "covered",
        TSTZMULTIRANGE,
        comment="Time of the hour already counted for the device, gaps under a second closed; NULL: not recorded.",
    ),
    PrimaryKeyConstraint("device_id", "hour"),
    postgresql_partition_by="RANGE (hour)",
)
Index("ix_rollups_hourly_hour", rollups_hourly.c.hour)

# One row per device per UTC day, so a 30-day view reads about as many rows as a 1-day view of the hourly
# table. Small enough to need no partitions: retention deletes old days (app.store.partitions.upkeep). Rows
# are updated in place as data arrives; free space on each page keeps those updates HOT.
rollups_daily = Table(
    "rollups_daily",
    Base.metadata,
    *_rollup_columns("day", "Start of the UTC day."),
    PrimaryKeyConstraint("device_id", "day"),
    postgresql_with={"fillfactor": 70},
)
Index("ix_rollups_daily_day", rollups_daily.c.day)

# One row per device per 5 minutes, for the instance page's charts over 6 to 24 hours: samples have only BRIN
# indexes, so one instance's devices over a day would scan the whole day's partition, and hours are too coarse
# for a day chart. Only what the charts draw (utilization, memory, power). Partitioned by day like `samples`,
# with the same partitions and retention (app.store.partitions); each partition keeps free space for the HOT
# updates of rows still filling. Column order is storage order: `mem_max`, nearly always present, fills the
# 4 bytes after `device_id` that would otherwise pad the float8 sums to their 8-byte boundary.
rollups_5m = Table(
    "rollups_5m",
    Base.metadata,
    Column("bucket", TZ, nullable=False, comment="Start of the 5-minute bucket, UTC."),
    Column("device_id", Integer, nullable=False),
    Column("mem_max", Integer),
    _seconds("secs", "Seconds covered by samples."),
    _seconds("util_known_s", "Seconds with a utilization figure."),
    _seconds("util_sum", "Sum of utilization x seconds (%*s)."),
    _seconds("mem_known_s", "Seconds with a memory figure."),
    _seconds("mem_sum", "Sum of memory used x seconds (MiB*s)."),
    _seconds("power_known_s", "Seconds with a power figure."),
    _seconds("power_sum", "Sum of power x seconds (J)."),
    Column("util_max", REAL),
    Column("power_max", SmallInteger),
    PrimaryKeyConstraint("device_id", "bucket"),
    postgresql_partition_by="RANGE (bucket)",
)


def _status_bound_columns(b: int) -> list[Column[Any]]:
    """The idle-stretch columns of one utilization bound (%)."""
    return [
        Column(
            f"busy_until_{b}",
            TZ,
            comment=f"End of the newest interval at or above {b}% or of unknown utilization; NULL if never.",
        ),
        _seconds(f"quiet_s_{b}", f"Seconds of samples starting at or after busy_until_{b}: the current idle stretch."),
        _seconds(
            f"quiet_free_s_{b}",
            f"Of quiet_s_{b}, seconds with no process and memory under the held bound.",
        ),
    ]


# One row per device: its newest sample, and per utilization bound how long it has been idle. The dashboard's
# "now" and "idle since" read this instead of scanning samples or rollups. It is written in the ingest
# transaction; every batch updates its devices' rows, and no indexed column changes, so the free space that
# fillfactor leaves on each page keeps those updates HOT. Columns widest first among the newest sample's values,
# so the row carries no padding beyond the 4 bytes after device_id.
device_status = Table(
    "device_status",
    Base.metadata,
    Column("device_id", Integer, primary_key=True, autoincrement=False),
    Column("ts", TZ, nullable=False, comment="Start of the newest interval seen."),
    Column("dur", Float, nullable=False, comment="Length of the newest interval, s."),
    Column("util", REAL, comment="Newest sample: utilization, %; NULL when unmeasurable."),
    Column("mem_used_mib", Integer, comment="Newest sample: memory allocated, MiB."),
    Column("util_source", SmallInteger, nullable=False, comment="Newest sample: where util came from."),
    Column("procs", SmallInteger, comment="Newest sample: compute processes."),
    Column("power_w", SmallInteger, comment="Newest sample: mean power, W."),
    Column("temp_c", SmallInteger, comment="Newest sample: temperature, degrees C."),
    *[c for b in UTIL_BOUNDS for c in _status_bound_columns(b)],
    # Migration 0008, which appends them: what lets the ingest path skip the coverage check (app.store.coverage).
    Column("covered_from", TZ, comment="Start of a stretch known to be counted, up to covered_until; NULL: none."),
    Column("covered_until", TZ, comment="End of the device's counted time, its latest; NULL: none recorded."),
    postgresql_with={"fillfactor": 70},
)

PARTITIONED_TABLES = ("samples", "rollups_hourly", "rollups_5m", "holder_rollups_hourly", "holder_groups_hourly")

# The per-instance rollups live with their write path's weights, the holders' tables with theirs, the billing tables
# with billing; imported here so the metadata holds them.
from .alerts import tables as _alert_tables  # noqa: E402, F401
from .billing import tables as _billing_tables  # noqa: E402, F401
from .store import holder_groups as _holder_groups  # noqa: E402, F401
from .store import holders as _holders  # noqa: E402, F401
from .store import instance_rollups as _instance_rollups  # noqa: E402, F401
