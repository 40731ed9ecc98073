"""Dashboard pages need a reader: tests that use `client` send a read token (the login form: test_login.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import make_token


@pytest.fixture(autouse=True)
def _reader(request: pytest.FixtureRequest) -> Iterator[None]:
    if "client" not in request.fixturenames:
        yield
        return
    client: TestClient = request.getfixturevalue("client")
    sessions: sessionmaker[Session] = request.getfixturevalue("sessions")
    client.headers["Authorization"] = f"Bearer {make_token(sessions, 'read', name='web-tests')}"
    try:
        yield
    finally:
        client.headers.pop("Authorization", None)
