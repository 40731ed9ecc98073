"""Alembic environment: the target schema is app.models; the URL comes from app.migrate.alembic_config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from app.migrate import include_name
from app.models import Base

target_metadata = Base.metadata


def run_migrations() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "alembic_config() sets sqlalchemy.url"
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_name=include_name,
            compare_type=True,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
