"""Dashboard sessions: one row per login, keyed by the SHA-256 of the cookie's random id.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_sha256", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column(
            "password_sha256",
            sa.String(length=64),
            nullable=True,
            comment="SHA-256 of the admin password hash the session was opened with.",
        ),
        sa.Column(
            "csrf_secret",
            sa.String(length=64),
            nullable=False,
            comment="Token that the session's state-changing forms carry.",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(token_id IS NULL) <> (password_sha256 IS NULL)", name=op.f("ck_web_sessions_one_credential")
        ),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_web_sessions_token_id_api_tokens"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id_sha256", name=op.f("pk_web_sessions")),
    )
    op.create_index(op.f("ix_web_sessions_token_id"), "web_sessions", ["token_id"])
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("web_sessions")
