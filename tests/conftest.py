"""Test database: an embedded PostgreSQL started once per run, or GPUFLEET_TEST_DATABASE_URL's server.

Either way the tests get a fresh database built by running the migrations, and every test starts from
empty tables.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.auth import create_token
from app.db import make_engine, make_sessionmaker, session_scope
from app.embedded import EmbeddedPostgres
from app.main import create_app, run_upkeep
from app.migrate import upgrade
from app.models import Base
from app.settings import Settings
from tests.feeding import Feeder

pytest_plugins = ["tests.aws_server", "tests.spot_history"]

# In this order, which the servers the tests run take their locks in, so TRUNCATE does not deadlock with a request
# still finishing; then any other table the models declare, so a new one is emptied without anyone listing it.
_ORDER = [
    "api_tokens",
    "instances",
    "gpus",
    "mig_slices",
    "events",
    "ingest_batches",
    "samples",
    "rollups_hourly",
    "rollups_daily",
    "rollups_5m",
    "instance_rollups_hourly",
    "instance_rollups_daily",
    "device_status",
    "web_sessions",
    "holders",
    "holder_rollups_hourly",
    "holder_rollups_daily",
    "holder_groups_hourly",
    "holder_groups_daily",
    "device_holders_now",
]
TABLES = ", ".join([*_ORDER, *(t.name for t in Base.metadata.sorted_tables if t.name not in _ORDER)])


def _fresh_database(server_url: str) -> tuple[str, str]:
    """Create an empty database on the server behind `server_url`; return its URL and admin URL."""
    url = make_url(server_url).set(drivername="postgresql")
    name = f"gpufleet_test_{secrets.token_hex(4)}"
    admin = url.render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False), admin


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    server_url = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    embedded: EmbeddedPostgres | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if server_url is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpufleet-test-")
        embedded = EmbeddedPostgres(Path(tmp.name))
        server_url = embedded.start()
    url, admin = _fresh_database(server_url)
    upgrade(url)
    try:
        yield url
    finally:
        name = make_url(url).database
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if embedded is not None:
            embedded.stop()
        if tmp is not None:
            tmp.cleanup()


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    # Alert jobs off: a test that makes rules or incidents by hand must not race the server's own evaluation.
    return Settings(database_url=database_url, data_dir=Path(tempfile.gettempdir()) / "unused", alerts="off")


@pytest.fixture(scope="session")
def engine(database_url: str, settings: Settings) -> Iterator[Engine]:
    eng = make_engine(database_url, pool_size=2)
    run_upkeep(eng, settings)
    yield eng
    eng.dispose()


@pytest.fixture(autouse=True)
def _empty_tables(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "engine" in request.fixturenames:
        eng: Engine = request.getfixturevalue("engine")
        with eng.begin() as conn:
            conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    if "client" in request.fixturenames:
        # Ids the server remembers refer to rows that are gone now.
        request.getfixturevalue("client").app.state.gpufleet.inventory.clear()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    with sessions() as s:
        yield s
        s.rollback()


@pytest.fixture(scope="session")
def client(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def make_token(sessions: sessionmaker[Session], scope: str = "ingest", name: str | None = None) -> str:
    with session_scope(sessions) as s:
        _token, secret = create_token(s, name=name or f"{scope}-{secrets.token_hex(3)}", scope=scope)
    return secret


@pytest.fixture
def ingest_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "ingest")


@pytest.fixture
def feeder(client: TestClient, ingest_token: str) -> Feeder:
    """Posts constructed stories; `t0` is five hours before the current hour, room for a story in the past."""
    now = datetime.now(UTC)
    return Feeder(client, ingest_token, now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=5))
