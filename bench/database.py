"""The database a benchmark runs on: a scratch one on a PostgreSQL server (`--database-url`) or an embedded
PostgreSQL in a temporary folder; its schema, partitions and tokens.

psycopg, SQLAlchemy and the app are imported by the functions that use them (see bench/harness.py).
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import log, quiet

if TYPE_CHECKING:
    import psycopg


def libpq_url(url: str) -> str:
    """`url` as libpq takes it: no `+driver` in the scheme."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, name: str) -> str:
    """`url` naming the database `name` on the same server."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


def server_name(url: str) -> str:
    """The host `url` names, or "local socket"."""
    from sqlalchemy.engine import make_url

    return make_url(url).host or "local socket"


def connect(url: str) -> psycopg.Connection[Any]:
    """A psycopg connection in autocommit mode, to use in a `with` block."""
    import psycopg

    return psycopg.connect(libpq_url(url), autocommit=True)


def create_bench_database(server_url: str) -> tuple[str, str, str]:
    """A new, empty database on `server_url`'s server: (its URL, the server's admin URL, its name)."""
    admin = libpq_url(server_url)
    name = f"gpufleet_bench_{secrets.token_hex(4)}"
    with connect(admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(admin, name), admin, name


def drop_bench_database(admin: str, name: str) -> None:
    with connect(admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    log(f"dropped database {name}")


@dataclass(frozen=True)
class Scratch:
    url: str
    where: str
    """"external" (a database made on `--database-url`'s server) or "embedded"."""


def open_scratch(database_url: str | None, folder: Path, stack: contextlib.ExitStack) -> Scratch:
    """A fresh database for one run, gone when `stack` closes: made on `database_url`'s server and dropped, or
    an embedded PostgreSQL in `folder`/db, stopped (the folder is the caller's to remove)."""
    if database_url:
        url, admin, name = create_bench_database(database_url)
        stack.callback(quiet("drop bench database", lambda: drop_bench_database(admin, name)))
        log(f"created database {name}")
        return Scratch(url, "external")
    from app.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(folder / "db")
    stack.callback(quiet("stop embedded PostgreSQL", embedded.stop))
    log(f"starting embedded PostgreSQL in {embedded.pgdata}")
    return Scratch(embedded.start(), "embedded")


def prepare_database(url: str) -> str:
    """Schema, partitions, and an ingest token; returns the token's secret."""
    from app.auth import create_token
    from app.db import make_engine, make_sessionmaker, session_scope
    from app.main import run_upkeep
    from app.migrate import upgrade
    from app.settings import Settings

    upgrade(url)
    engine = make_engine(url, pool_size=1)
    try:
        run_upkeep(engine, Settings(database_url=url))
        with session_scope(make_sessionmaker(engine)) as session:
            _token, secret = create_token(session, name="bench", scope="ingest")
    finally:
        engine.dispose()
    return secret


def make_read_token(url: str, name: str) -> str:
    """A token of scope read, made in the database (the dashboard and the report need a reader); its secret."""
    from app.auth import create_token
    from app.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(url, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            _token, secret = create_token(session, name=name, scope="read")
    finally:
        engine.dispose()
    log(f"made the token {name} with scope read for the requests")
    return secret


def revoke_token(url: str, name: str) -> None:
    from app.auth import revoke_token as revoke
    from app.db import make_engine, make_sessionmaker, session_scope

    engine = make_engine(url, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            revoke(session, name, now=datetime.now(UTC))
    finally:
        engine.dispose()


def postmaster_pid(url: str) -> int | None:
    """The database server's main process if it runs on this machine (its CPU is then measured)."""
    import psycopg

    try:
        with connect(url) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is None:
            return None
        with open(f"/proc/{int(row[0])}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, psycopg.Error, ValueError):
        return None


def database_size_mib(url: str) -> float:
    """Size of the current database, MiB (one decimal)."""
    with connect(url) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return round(int(row[0]) / 2**20, 1) if row else 0.0
