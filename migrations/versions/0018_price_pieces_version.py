"""A version of the price pieces' sources: every statement that changes billed_prices, spot_prices or
spot_price_reads sets it to a new number (statement triggers), so the analysis can reuse pieces read at the same
one (app/analyse/series_prices.py). The numbers come from a sequence of their own, which never gives one twice, even
if the table is emptied.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-25 00:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SOURCES = ("billed_prices", "spot_prices", "spot_price_reads")


def upgrade() -> None:
    op.create_table(
        "price_pieces_version",
        sa.Column("id", sa.Integer(), nullable=False, comment="Always 1: one row."),
        sa.Column(
            "n",
            sa.BigInteger(),
            nullable=False,
            comment="A new number after every statement that changes a source of price pieces.",
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_price_pieces_version_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_price_pieces_version")),
        comment="A number that changes whenever billed_prices, spot_prices or spot_price_reads do (statement triggers "
        "of migration 0018): the analysis reuses price pieces read at the same number.",
    )
    op.execute("CREATE SEQUENCE price_pieces_version_seq")
    op.execute(
        "CREATE FUNCTION bump_price_pieces_version() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO price_pieces_version (id, n) VALUES (1, nextval('price_pieces_version_seq')) "
        "ON CONFLICT (id) DO UPDATE SET n = excluded.n; RETURN NULL; END $$"
    )
    op.execute("INSERT INTO price_pieces_version (id, n) VALUES (1, nextval('price_pieces_version_seq'))")
    for table in SOURCES:
        op.execute(
            f"CREATE TRIGGER {table}_bump_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION bump_price_pieces_version()"
        )


def downgrade() -> None:
    for table in SOURCES:
        op.execute(f"DROP TRIGGER {table}_bump_version ON {table}")
    op.execute("DROP FUNCTION bump_price_pieces_version()")
    op.drop_table("price_pieces_version")
    op.execute("DROP SEQUENCE price_pieces_version_seq")
