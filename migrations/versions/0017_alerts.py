"""Alerts: rules, the incidents they open, the outbox of messages about them, snoozes and actions
(app/alerts/tables.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24 23:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False, comment="Unique name; the rule file's key."),
        sa.Column("condition", sa.Text(), nullable=False),
        sa.Column(
            "for_hours",
            sa.Float(),
            nullable=True,
            comment="How long the condition must hold before an incident opens, hours.",
        ),
        sa.Column("usd_per_day", sa.Float(), nullable=True, comment="tag_waste: waste above this per day, USD."),
        sa.Column(
            "tag_key",
            sa.Text(),
            nullable=True,
            comment="tag_waste: the tag whose values are compared (team, project, ...).",
        ),
        sa.Column(
            "scope",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
            comment="Filters as on the dashboard: {regions, instance_types, lifecycles, tags: {k: v}, holders: {user: "
            "[...]}}; empty: the whole fleet.",
        ),
        sa.Column(
            "route",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="Where messages go: {channel, url | to, secret} or {owner: true, fallback: ...} (docs/alerts.md).",
        ),
        sa.Column(
            "quiet_s",
            sa.Integer(),
            server_default=sa.text("0"),
            nullable=False,
            comment="No new incident for a subject this long after one closed, s.",
        ),
        sa.Column(
            "remind_s",
            sa.Integer(),
            nullable=True,
            comment="A reminder after an incident has stayed open this long, s; NULL: none.",
        ),
        sa.Column(
            "stop",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="The stop action, {dry_run, grace_s, spot, capacity_block}; NULL: none.",
        ),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("source", sa.Text(), server_default=sa.text("'api'"), nullable=False, comment="api, page or file."),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column(
            "updated_by",
            sa.Text(),
            nullable=True,
            comment="Who last changed it: a token name, an admin session, the rule file.",
        ),
        sa.CheckConstraint(
            "condition IN ('gpu_idle', 'slice_underused', 'mig_unpartitioned', 'agent_offline', 'tag_waste', "
            "'spot_interruption')",
            name=op.f("ck_alert_rules_condition"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_rules")),
        sa.UniqueConstraint("name", name=op.f("uq_alert_rules_name")),
        comment="What to watch, where it applies, who hears of it.",
    )
    op.create_table(
        "alert_incidents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("rule_id", sa.Integer(), nullable=False),
        sa.Column(
            "subject",
            sa.Text(),
            nullable=False,
            comment="What it is about: gpu:<uuid>, slice:<uuid>, instance:<id>, tag:<k>=<v>.",
        ),
        sa.Column("instance_pk", sa.BigInteger(), nullable=True, comment="The instance it concerns, when one."),
        sa.Column("device_id", sa.Integer(), nullable=True, comment="The GPU or slice it concerns, when one."),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False, comment="When the condition started holding."),
        sa.Column("opened_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column(
            "closed_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="When the condition stopped holding; NULL: open.",
        ),
        sa.Column(
            "reminded_at", sa.DateTime(timezone=True), nullable=True, comment="When the last reminder was queued."
        ),
        sa.Column("snoozed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
            comment="The figures of the last evaluation: dollars, holders, names.",
        ),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["alert_rules.id"], name=op.f("fk_alert_incidents_rule_id_alert_rules"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_incidents")),
        comment="One per stretch of time a rule's condition holds for a subject.",
    )
    op.create_index("ix_alert_incidents_opened", "alert_incidents", ["opened_at"], unique=False)
    op.create_index(
        "ux_alert_incidents_open",
        "alert_incidents",
        ["rule_id", "subject"],
        unique=True,
        postgresql_where=sa.text("closed_at IS NULL"),
    )
    op.create_table(
        "alert_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("rule_id", sa.Integer(), nullable=True),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("instance_id", sa.Text(), nullable=False, comment="EC2 instance id."),
        sa.Column("action", sa.Text(), server_default=sa.text("'stop'"), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column(
            "due_at", sa.DateTime(timezone=True), nullable=False, comment="Not before the notice's grace period ends."
        ),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("by", sa.Text(), nullable=False, comment="Who: the rule, or who cancelled it."),
        sa.Column("detail", sa.Text(), nullable=True, comment="The EC2 answer or the reason it did not happen."),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'cancelled', 'done', 'dry-run', 'failed')", name=op.f("ck_alert_actions_status")
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["alert_incidents.id"],
            name=op.f("fk_alert_actions_incident_id_alert_incidents"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["alert_rules.id"], name=op.f("fk_alert_actions_rule_id_alert_rules"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_actions")),
        comment="Every action taken, or about to be, on an instance.",
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "message_id",
            sa.UUID(),
            nullable=False,
            comment="Carried by the payload and the email headers: receivers deduplicate by it.",
        ),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False, comment="open, reminder, closed, digest, action."),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column(
            "target",
            sa.Text(),
            nullable=False,
            comment="The URL or email address: messages to one target wait for it alone.",
        ),
        sa.Column("secret", sa.Text(), nullable=True, comment="Webhook signing secret."),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="The message: JSON body, or {subject, text} of an email.",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column(
            "due_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
            comment="Next attempt not before this.",
        ),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "leased_until", sa.DateTime(timezone=True), nullable=True, comment="A sender has claimed it until then."
        ),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("channel IN ('slack', 'webhook', 'email')", name=op.f("ck_alert_outbox_channel")),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["alert_incidents.id"],
            name=op.f("fk_alert_outbox_incident_id_alert_incidents"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_outbox")),
        sa.UniqueConstraint("message_id", name=op.f("uq_alert_outbox_message_id")),
        comment="Messages to send, written with what they are about; sent with retries, each once.",
    )
    op.create_index(
        "ix_alert_outbox_due", "alert_outbox", ["due_at"], unique=False, postgresql_where=sa.text("sent_at IS NULL")
    )
    op.create_table(
        "alert_snoozes",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("incident_id", sa.BigInteger(), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "by", sa.Text(), nullable=True, comment="Who: the snooze link's recipient, an admin session, a token."
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["alert_incidents.id"],
            name=op.f("fk_alert_snoozes_incident_id_alert_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_snoozes")),
        comment="Every snooze, as recorded and shown on the dashboard.",
    )


def downgrade() -> None:
    op.drop_table("alert_snoozes")
    op.drop_index("ix_alert_outbox_due", table_name="alert_outbox", postgresql_where=sa.text("sent_at IS NULL"))
    op.drop_table("alert_outbox")
    op.drop_table("alert_actions")
    op.drop_index(
        "ux_alert_incidents_open", table_name="alert_incidents", postgresql_where=sa.text("closed_at IS NULL")
    )
    op.drop_index("ix_alert_incidents_opened", table_name="alert_incidents")
    op.drop_table("alert_incidents")
    op.drop_table("alert_rules")
