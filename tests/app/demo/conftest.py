from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine, make_sessionmaker
from app.main import run_upkeep
from app.settings import Settings
from tests.conftest import TABLES


@pytest.fixture(scope="module")
def module_sessions(database_url: str, settings: Settings) -> Iterator[sessionmaker[Session]]:
    """Sessions on the test database that outlive one test, for a history loaded once per module: the tables are
    emptied when the module ends, not after each test (as the `engine` fixture has them)."""
    engine = make_engine(database_url, pool_size=2)
    run_upkeep(engine, settings)
    yield make_sessionmaker(engine)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    engine.dispose()


def last_wednesday_afternoon() -> int:
    """The latest Wednesday 16:00 UTC (11:00 in the p4d team's UTC-5) before now: inside the test database's
    partitions, and a working hour for the p4d team whichever hour its day starts."""
    now = datetime.now(UTC)
    t = now.replace(hour=16, minute=0, second=0, microsecond=0) - timedelta(days=(now.weekday() - 2) % 7)
    if t > now:
        t -= timedelta(days=7)
    return int(t.timestamp())
