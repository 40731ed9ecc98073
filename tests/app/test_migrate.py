"""The migrations build exactly the schema the models declare, and they run both ways."""

from __future__ import annotations

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

from app.db import sqlalchemy_url
from app.migrate import alembic_config, current_revision, head_revision, include_name, upgrade
from app.models import Base


def test_models_and_migrations_agree(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_name": include_name, "compare_type": True, "target_metadata": Base.metadata}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_database_is_at_head(engine: Engine) -> None:
    with engine.connect() as conn:
        assert current_revision(conn) == head_revision() is not None


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    from alembic import command

    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = "gpufleet_migrate_roundtrip"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        command.downgrade(alembic_config(url), "base")
        eng = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
        with eng.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
            assert conn.execute(text("SELECT count(*) FROM pg_class WHERE relname = 'device_id_seq'")).scalar() == 0
        upgrade(url)
        with eng.connect() as conn:
            assert current_revision(conn) == head_revision()
        eng.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
