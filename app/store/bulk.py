"""Sessions that load history in bulk (the demo, the benchmarks) rather than batch by batch."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import Engine, event


def quiet_server_log(dbapi_conn: Any, _record: Any) -> None:
    """At bulk-load rates the BRIN autosummarize requests overflow autovacuum's work-item queue, and PostgreSQL
    logs every one it drops, at level LOG, with the whole statement: gigabytes over a load. Where the role may
    (a superuser, as in the embedded server), the loading sessions leave the server log alone; their errors
    still reach the caller. A `connect` listener for SQLAlchemy engines."""
    try:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET log_min_messages = fatal")
            cur.execute("SET log_min_error_statement = panic")
        dbapi_conn.commit()
    except psycopg.Error:
        dbapi_conn.rollback()


def quiet_bulk_loads(engine: Engine) -> None:
    """Every new connection of `engine` keeps its bulk writes out of the server log (`quiet_server_log`)."""
    event.listen(engine, "connect", quiet_server_log)
