"""Request dependencies shared by the pages, the report and authentication: one database session per request.

The session is opened before the handler and committed once after it (rolled back if it raised), before the
answer is sent; every dependency of the same request gets the same session (FastAPI caches it per request).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends
from sqlalchemy import Connection, event
from sqlalchemy.orm import Session, SessionTransaction
from starlette.requests import Request

from .db import session_scope
from .settings import Settings
from .state import app_state


# The pages' and the report's queries read time ranges from an hour to months. psycopg prepares a statement on
# its fifth use, and a few uses later PostgreSQL may settle on one generic plan for every range: it guesses the
# range's size and can pick a plan three times slower (a month read through an index instead of in parallel).
# Planning each query afresh costs well under a millisecond. The analysis groups tens of thousands of rollup rows
# per device (app/analyse/device_money.py): with PostgreSQL's default 4 MB of work memory that group spills into a
# sort on disk instead of a hash in memory (measured 162 ms against 136 ms for a month of 4,000 devices). Set when
# the transaction begins, not before: a request that never reaches the database (a scrape of /metrics while it is
# down) must not fail on it.
def _custom_plans(_session: Session, _transaction: SessionTransaction, connection: Connection) -> None:
    connection.exec_driver_sql(
        "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), set_config('work_mem', '64MB', true)"
    )


def db_session(request: Request) -> Iterator[Session]:
    with session_scope(app_state(request).sessions) as session:
        event.listen(session, "after_begin", _custom_plans)
        yield session


def settings(request: Request) -> Settings:
    return app_state(request).settings


SessionDep = Annotated[Session, Depends(db_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(settings)]
