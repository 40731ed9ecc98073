"""Engine and sessions. Handlers never commit: `session_scope` (or the `get_session` dependency) does, once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import orjson
from psycopg.types.json import set_json_loads
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.engine.interfaces import Compiled
from sqlalchemy.orm import Session, sessionmaker

TRANSIENT_PREFIX = "gpufleet_"
"""Connection-info keys with this prefix describe objects a rollback can undo; they are dropped on rollback."""


def sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and point them at the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername != "postgresql+psycopg":
        raise ValueError(f"not a PostgreSQL URL: {parsed.drivername}")
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 10, pool_timeout_s: float = 30.0) -> Engine:
    """`pool_timeout_s`: how long a checkout waits for a free connection before raising (the server answers
    503 then, app/failsafe.py)."""
    engine = create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=pool_timeout_s,
        pool_pre_ping=True,
        connect_args={"connect_timeout": 10},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # jsonb (tags, agent errors) is parsed on every page view for every instance: orjson does it 5x faster.
        set_json_loads(orjson.loads, dbapi_conn)
        # Every session speaks UTC, so date_trunc and ::date agree with the partition bounds.
        # No JIT: every statement here runs in milliseconds, and where the planner's estimate passes jit_above_cost
        # (a bulk write through temporary tables without statistics, a month of rollups) compiling costs tens to
        # hundreds of milliseconds more than it saves: a holder rollup upsert of a bulk load took 330 ms with JIT
        # on PostgreSQL 15 and 12 ms without.
        with dbapi_conn.cursor() as cur:
            cur.execute("SET TIME ZONE 'UTC'")
            cur.execute("SET jit = off")
        dbapi_conn.commit()

    @event.listens_for(engine, "rollback")
    def _on_rollback(conn: Any) -> None:
        # A rollback also undoes what the transaction created on the connection (the ingest path's temporary
        # staging table): forget every such marker, so the next user makes it again. A connection lost
        # mid-transaction is thrown away with its markers, and touching it would hide the error that lost it.
        if conn.invalidated:
            return
        info = conn.connection.info
        for key in [k for k in info if isinstance(k, str) and k.startswith(TRANSIENT_PREFIX)]:
            del info[key]

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@lru_cache(maxsize=256)
def _compiled(sql: str, dialect: Dialect) -> Compiled:
    return text(sql).compile(dialect=dialect)


def fetch_binary(session: Session, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """All rows of `sql` (a text query with :name parameters) read in PostgreSQL's binary format, on the session's
    connection and transaction.

    Numbers and timestamps then cross without being printed and parsed as text, which takes about half the client
    time off a query that returns thousands of rows (a heatmap page's cells). Values come as the text format
    gives them (float, int, datetime in UTC)."""
    compiled = _compiled(sql, session.get_bind().dialect)
    driver = session.connection().connection.driver_connection
    assert driver is not None
    with driver.cursor(binary=True) as cursor:
        cursor.execute(str(compiled), compiled.construct_params(dict(params)))
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows
