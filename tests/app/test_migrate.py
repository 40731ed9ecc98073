"""The migrations build exactly the schema the models declare, and they run both ways."""

from __future__ import annotations

import psycopg
import pytest
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


def test_0007_keeps_old_rows_and_allows_unknown_sizes(database_url: str) -> None:
    """GPUs stored before 0007 read as complete with no permission gaps; a slice may then have no size, but a
    size must still be 1 to 7; a downgrade refuses to drop what it cannot hold."""
    from alembic import command

    server = make_url(database_url).set(drivername="postgresql")
    admin = server.set(database="postgres").render_as_string(hide_password=False)
    name = "gpufleet_migrate_0007"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.set(database=name).render_as_string(hide_password=False)
    slice_sql = (
        "INSERT INTO mig_slices (uuid, gpu_pk, gpu_instance_id, compute_instance_id, profile, compute_slices, "
        "first_seen) SELECT %s, id, %s, 0, %s, %s, now() FROM gpus"
    )
    try:
        upgrade(url, "0006")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO instances (instance_id, first_seen, last_seen) VALUES ('h1', now(), now())")
            conn.execute(
                "INSERT INTO gpus (uuid, instance_pk, gpu_index, name, mig_mode, first_seen, updated_at) "
                "SELECT 'GPU-1', id, 0, 'A100', true, now(), now() FROM instances"
            )
            conn.execute(slice_sql, ("MIG-1", 1, "3g.20gb", 3))
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT layout_complete, permission_denied FROM gpus").fetchall() == [(True, [])]
            conn.execute(slice_sql, ("MIG-2", 2, "unknown", None))
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(slice_sql, ("MIG-3", 3, "8g", 8))
        with pytest.raises(RuntimeError, match="1 MIG slices have no known size"):
            command.downgrade(alembic_config(url), "0006")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM mig_slices WHERE compute_slices IS NULL")
        command.downgrade(alembic_config(url), "0006")
        with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.errors.NotNullViolation):
            conn.execute(slice_sql, ("MIG-4", 4, "unknown", None))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
