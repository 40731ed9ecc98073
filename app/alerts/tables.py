"""The alert tables (docs/alerts.md): rules, the incidents they open, the outbox of messages about them, snoozes
and actions. Incidents and their messages are written in one transaction; the outbox is what gets sent."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from ..models import TZ, Base

CONDITIONS = (
    "gpu_idle",
    "slice_underused",
    "mig_unpartitioned",
    "agent_offline",
    "tag_waste",
    "spot_interruption",
)
"""What a rule watches: a passthrough GPU idle or idle-held for N hours; a MIG slice under-used over N hours; MIG
capacity unpartitioned for N hours; an agent offline while its instance should run; a tag value's waste over $X
per day; a spot interruption notice."""

CHANNELS = ("slack", "webhook", "email")
"""How a message leaves: a Slack incoming webhook, a generic signed webhook, email over SMTP."""

ACTION_STATUSES = ("pending", "cancelled", "done", "dry-run", "failed")

alert_rules = Table(
    "alert_rules",
    Base.metadata,
    Column("id", Integer, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True, comment="Unique name; the rule file's key."),
    Column("condition", Text, nullable=False),
    Column("for_hours", Float, comment="How long the condition must hold before an incident opens, hours."),
    Column("usd_per_day", Float, comment="tag_waste: waste above this per day, USD."),
    Column("tag_key", Text, comment="tag_waste: the tag whose values are compared (team, project, ...)."),
    Column(
        "scope",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="Filters as on the dashboard: {regions, instance_types, lifecycles, tags: {k: v}, holders: {user: "
        "[...]}}; empty: the whole fleet.",
    ),
    Column(
        "route",
        JSONB,
        nullable=False,
        comment="Where messages go: {channel, url | to, secret} or {owner: true, fallback: ...} (docs/alerts.md).",
    ),
    Column(
        "quiet_s",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="No new incident for a subject this long after one closed, s.",
    ),
    Column("remind_s", Integer, comment="A reminder after an incident has stayed open this long, s; NULL: none."),
    Column("stop", JSONB, comment="The stop action, {dry_run, grace_s, spot, capacity_block}; NULL: none."),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("source", Text, nullable=False, server_default=text("'api'"), comment="api, page or file."),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    Column("updated_at", TZ, nullable=False, server_default=text("now()")),
    Column("updated_by", Text, comment="Who last changed it: a token name, an admin session, the rule file."),
    CheckConstraint(f"condition IN ({', '.join(repr(c) for c in CONDITIONS)})", name="condition"),
    comment="What to watch, where it applies, who hears of it.",
)

alert_incidents = Table(
    "alert_incidents",
    Base.metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("rule_id", Integer, ForeignKey("alert_rules.id", ondelete="CASCADE"), nullable=False),
    Column(
        "subject",
        Text,
        nullable=False,
        comment="What it is about: gpu:<uuid>, slice:<uuid>, instance:<id>, tag:<k>=<v>.",
    ),
    Column("instance_pk", BigInteger, comment="The instance it concerns, when one."),
    Column("device_id", Integer, comment="The GPU or slice it concerns, when one."),
    Column("since", TZ, nullable=False, comment="When the condition started holding."),
    Column("opened_at", TZ, nullable=False, server_default=text("now()")),
    Column("closed_at", TZ, comment="When the condition stopped holding; NULL: open."),
    Column("reminded_at", TZ, comment="When the last reminder was queued."),
    Column("snoozed_until", TZ),
    Column(
        "details",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="The figures of the last evaluation: dollars, holders, names.",
    ),
    comment="One per stretch of time a rule's condition holds for a subject.",
)
# One open incident per rule and subject, however many server processes evaluate at once.
Index(
    "ux_alert_incidents_open",
    alert_incidents.c.rule_id,
    alert_incidents.c.subject,
    unique=True,
    postgresql_where=alert_incidents.c.closed_at.is_(None),
)
Index("ix_alert_incidents_opened", alert_incidents.c.opened_at)

alert_outbox = Table(
    "alert_outbox",
    Base.metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "message_id",
        UUID(as_uuid=True),
        nullable=False,
        unique=True,
        comment="Carried by the payload and the email headers: receivers deduplicate by it.",
    ),
    Column("incident_id", BigInteger, ForeignKey("alert_incidents.id", ondelete="SET NULL")),
    Column("kind", Text, nullable=False, comment="open, reminder, closed, digest, action."),
    Column("channel", Text, nullable=False),
    Column(
        "target", Text, nullable=False, comment="The URL or email address: messages to one target wait for it alone."
    ),
    Column("secret", Text, comment="Webhook signing secret."),
    Column("payload", JSONB, nullable=False, comment="The message: JSON body, or {subject, text} of an email."),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    Column("due_at", TZ, nullable=False, server_default=text("now()"), comment="Next attempt not before this."),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text),
    Column("leased_until", TZ, comment="A sender has claimed it until then."),
    Column("sent_at", TZ),
    CheckConstraint("channel IN ('slack', 'webhook', 'email')", name="channel"),
    comment="Messages to send, written with what they are about; sent with retries, each once.",
)
Index("ix_alert_outbox_due", alert_outbox.c.due_at, postgresql_where=alert_outbox.c.sent_at.is_(None))

alert_snoozes = Table(
    "alert_snoozes",
    Base.metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("incident_id", BigInteger, ForeignKey("alert_incidents.id", ondelete="CASCADE"), nullable=False),
    Column("until", TZ, nullable=False),
    Column("reason", Text),
    Column("by", Text, comment="Who: the snooze link's recipient, an admin session, a token."),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    comment="Every snooze, as recorded and shown on the dashboard.",
)

alert_actions = Table(
    "alert_actions",
    Base.metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("rule_id", Integer, ForeignKey("alert_rules.id", ondelete="SET NULL")),
    Column("incident_id", BigInteger, ForeignKey("alert_incidents.id", ondelete="SET NULL")),
    Column("instance_id", Text, nullable=False, comment="EC2 instance id."),
    Column("action", Text, nullable=False, server_default=text("'stop'")),
    Column("dry_run", Boolean, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("due_at", TZ, nullable=False, comment="Not before the notice's grace period ends."),
    Column("done_at", TZ),
    Column("by", Text, nullable=False, comment="Who: the rule, or who cancelled it."),
    Column("detail", Text, comment="The EC2 answer or the reason it did not happen."),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    CheckConstraint(f"status IN ({', '.join(repr(s) for s in ACTION_STATUSES)})", name="status"),
    comment="Every action taken, or about to be, on an instance.",
)

# An incident's snoozes, newest last: the /alerts page shows the latest of each.
Index("ix_alert_snoozes_incident", alert_snoozes.c.incident_id, alert_snoozes.c.created_at)

alert_signing_key = Table(
    "alert_signing_key",
    Base.metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False, comment="Always 1: one row."),
    Column("key", LargeBinary, nullable=False, comment="32 random bytes, the HMAC-SHA256 key."),
    Column("created_at", TZ, nullable=False, server_default=text("now()")),
    CheckConstraint("id = 1", name="one_row"),
    comment="The key that signs snooze links when GPUFLEET_ALERTS_SIGNING_KEY is unset; deleting the row ends every "
    "link sent so far.",
)
