"""Initial schema: inventory, tokens, events, batches, and the partitioned samples and rollups.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 03:32:10.459336
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # GPUs and MIG slices share one id space, so a sample row names any device with one int4.
    op.execute(sa.schema.CreateSequence(sa.Sequence("device_id_seq")))
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column(
            "hint",
            sa.String(length=16),
            nullable=False,
            comment="First characters of the secret, for listings.",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("scope IN ('ingest', 'read', 'admin')", name=op.f("ck_api_tokens_scope")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
        sa.UniqueConstraint("secret_sha256", name=op.f("uq_api_tokens_secret_sha256")),
    )
    op.create_table(
        "instances",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("instance_type", sa.String(length=64), nullable=True),
        sa.Column("region", sa.String(length=32), nullable=True),
        sa.Column("availability_zone", sa.String(length=32), nullable=True),
        sa.Column("lifecycle", sa.String(length=16), nullable=True),
        sa.Column("ami_id", sa.String(length=64), nullable=True),
        sa.Column(
            "tags",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("agent_version", sa.String(length=32), nullable=True),
        sa.Column("interval_s", sa.Float(), nullable=True, comment="Agent collection interval, s."),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("lifecycle IN ('spot', 'on-demand', 'on-prem')", name=op.f("ck_instances_lifecycle")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
        sa.UniqueConstraint("instance_id", name=op.f("uq_instances_instance_id")),
    )
    op.create_index("ix_instances_last_seen", "instances", ["last_seen"], unique=False)
    op.create_table(
        "rollups_hourly",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False, comment="Start of the UTC hour."),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column(
            "secs",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds covered by samples.",
        ),
        sa.Column(
            "util_known_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with a utilization figure.",
        ),
        sa.Column(
            "util_sum",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Sum of utilization x seconds (%*s).",
        ),
        sa.Column("util_max", sa.REAL(), nullable=True),
        sa.Column(
            "sm_known_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with an SM activity figure.",
        ),
        sa.Column(
            "sm_sum",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Sum of SM activity x seconds (%*s).",
        ),
        sa.Column("sm_max", sa.REAL(), nullable=True),
        sa.Column(
            "mem_known_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with a memory figure.",
        ),
        sa.Column(
            "mem_sum",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Sum of memory used x seconds (MiB*s).",
        ),
        sa.Column("mem_max", sa.Integer(), nullable=True),
        sa.Column(
            "power_known_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with a power figure.",
        ),
        sa.Column(
            "power_sum",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Sum of power x seconds (J).",
        ),
        sa.Column("power_max", sa.SmallInteger(), nullable=True),
        sa.Column("temp_max", sa.SmallInteger(), nullable=True),
        sa.Column(
            "no_proc_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with no compute process.",
        ),
        sa.Column(
            "mem_held_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with memory used at or above the held bound.",
        ),
        sa.Column(
            "util_lt1_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with utilization under 1%.",
        ),
        sa.Column(
            "util_lt5_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with utilization under 5%.",
        ),
        sa.Column(
            "util_lt10_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with utilization under 10%.",
        ),
        sa.Column(
            "util_lt25_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with utilization under 25%.",
        ),
        sa.Column(
            "util_lt50_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds with utilization under 50%.",
        ),
        sa.Column(
            "free_lt1_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds under 1% with no process and memory under the held bound.",
        ),
        sa.Column(
            "free_lt5_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds under 5% with no process and memory under the held bound.",
        ),
        sa.Column(
            "free_lt10_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds under 10% with no process and memory under the held bound.",
        ),
        sa.Column(
            "free_lt25_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds under 25% with no process and memory under the held bound.",
        ),
        sa.Column(
            "free_lt50_s",
            sa.Float(),
            server_default=sa.text("0"),
            nullable=False,
            comment="Seconds under 50% with no process and memory under the held bound.",
        ),
        sa.PrimaryKeyConstraint("device_id", "hour", name=op.f("pk_rollups_hourly")),
        postgresql_partition_by="RANGE (hour)",
    )
    op.create_index("ix_rollups_hourly_hour", "rollups_hourly", ["hour"], unique=False)
    op.create_table(
        "samples",
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False, comment="Interval start, UTC."),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column(
            "mem_used_mib",
            sa.Integer(),
            nullable=True,
            comment="Memory allocated, MiB (NVML v2: reserved memory not counted).",
        ),
        sa.Column(
            "util",
            sa.REAL(),
            nullable=True,
            comment="Mean utilization over the interval, %; NULL when unmeasurable.",
        ),
        sa.Column("sm_active", sa.REAL(), nullable=True, comment="Mean SM activity, %, where the hardware gives it."),
        sa.Column("power_w", sa.SmallInteger(), nullable=True, comment="Mean power over the interval, W."),
        sa.Column("temp_c", sa.SmallInteger(), nullable=True, comment="Temperature, degrees C."),
        sa.Column("procs", sa.SmallInteger(), nullable=True, comment="Compute processes on the device."),
        sa.Column("util_source", sa.SmallInteger(), nullable=False, comment="Where util came from: see app.sources."),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index(
        "ix_samples_device_bloom",
        "samples",
        ["device_id"],
        unique=False,
        postgresql_using="brin",
        postgresql_ops={"device_id": "int4_bloom_ops(n_distinct_per_range = 256)"},
        postgresql_with={"pages_per_range": 4, "autosummarize": "on"},
    )
    op.create_index(
        "ix_samples_ts_brin",
        "samples",
        ["ts"],
        unique=False,
        postgresql_using="brin",
        postgresql_with={"pages_per_range": 32, "autosummarize": "on"},
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("instance_pk", sa.BigInteger(), nullable=True),
        sa.Column("device_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["instance_pk"],
            ["instances.id"],
            name=op.f("fk_events_instance_pk_instances"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_instance_pk_ts", "events", ["instance_pk", "ts"], unique=False)
    op.create_index(op.f("ix_events_ts"), "events", ["ts"], unique=False)
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), server_default=sa.text("nextval('device_id_seq')"), nullable=False),
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("instance_pk", sa.BigInteger(), nullable=False),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("memory_total_mib", sa.Integer(), nullable=True),
        sa.Column("mig_mode", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "unpartitioned_slices",
            sa.SmallInteger(),
            nullable=True,
            comment="MIG compute slices (of 7) in no GPU instance, as last reported.",
        ),
        sa.Column("util_reason", sa.Text(), nullable=True, comment="Why utilization is absent, if it is."),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_pk"], ["instances.id"], name=op.f("fk_gpus_instance_pk_instances"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("uuid", name=op.f("uq_gpus_uuid")),
    )
    op.create_index(op.f("ix_gpus_instance_pk"), "gpus", ["instance_pk"], unique=False)
    op.create_table(
        "ingest_batches",
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("instance_pk", sa.BigInteger(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("dropped_batches", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_pk"],
            ["instances.id"],
            name=op.f("fk_ingest_batches_instance_pk_instances"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name=op.f("fk_ingest_batches_token_id_api_tokens"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_ingest_batches")),
    )
    op.create_index("ix_ingest_batches_received_at", "ingest_batches", ["received_at"], unique=False)
    op.create_table(
        "mig_slices",
        sa.Column("id", sa.Integer(), server_default=sa.text("nextval('device_id_seq')"), nullable=False),
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("gpu_pk", sa.Integer(), nullable=False),
        sa.Column("gpu_instance_id", sa.Integer(), nullable=False),
        sa.Column("compute_instance_id", sa.Integer(), nullable=False),
        sa.Column("profile", sa.String(length=32), nullable=False),
        sa.Column("compute_slices", sa.SmallInteger(), nullable=False, comment="Compute slices out of 7."),
        sa.Column("memory_total_mib", sa.Integer(), nullable=True),
        sa.Column("util_reason", sa.Text(), nullable=True, comment="Why utilization is absent, if it is."),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("compute_slices BETWEEN 1 AND 7", name=op.f("ck_mig_slices_compute_slices")),
        sa.ForeignKeyConstraint(["gpu_pk"], ["gpus.id"], name=op.f("fk_mig_slices_gpu_pk_gpus"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mig_slices")),
    )
    op.create_index(op.f("ix_mig_slices_gpu_pk"), "mig_slices", ["gpu_pk"], unique=False)
    op.create_index(
        "uq_mig_slices_live_uuid",
        "mig_slices",
        ["uuid"],
        unique=True,
        postgresql_where=sa.text("retired_at IS NULL"),
    )
    op.create_index(
        "uq_mig_slices_live_slot",
        "mig_slices",
        ["gpu_pk", "gpu_instance_id", "compute_instance_id"],
        unique=True,
        postgresql_where=sa.text("retired_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_mig_slices_live_slot", table_name="mig_slices", postgresql_where=sa.text("retired_at IS NULL"))
    op.drop_index("uq_mig_slices_live_uuid", table_name="mig_slices")
    op.drop_index(op.f("ix_mig_slices_gpu_pk"), table_name="mig_slices")
    op.drop_table("mig_slices")
    op.drop_index("ix_ingest_batches_received_at", table_name="ingest_batches")
    op.drop_table("ingest_batches")
    op.drop_index(op.f("ix_gpus_instance_pk"), table_name="gpus")
    op.drop_table("gpus")
    op.drop_index(op.f("ix_events_ts"), table_name="events")
    op.drop_index("ix_events_instance_pk_ts", table_name="events")
    op.drop_table("events")
    op.drop_index(
        "ix_samples_ts_brin",
        table_name="samples",
        postgresql_using="brin",
        postgresql_with={"pages_per_range": 32, "autosummarize": "on"},
    )
    op.drop_index(
        "ix_samples_device_bloom",
        table_name="samples",
        postgresql_using="brin",
        postgresql_ops={"device_id": "int4_bloom_ops(n_distinct_per_range = 256)"},
        postgresql_with={"pages_per_range": 4, "autosummarize": "on"},
    )
    op.drop_table("samples")
    op.drop_index("ix_rollups_hourly_hour", table_name="rollups_hourly")
    op.drop_table("rollups_hourly")
    op.drop_index("ix_instances_last_seen", table_name="instances")
    op.drop_table("instances")
    op.drop_table("api_tokens")
    op.execute(sa.schema.DropSequence(sa.Sequence("device_id_seq")))
