"""Error answers: one shape, the database down answered 503 and logged once per outage, and a kept-alive
connection that still works after a 500 or a 503 (a real uvicorn server on loopback)."""

from __future__ import annotations

import http.client
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine, make_sessionmaker
from app.main import create_app
from app.outage import RETRY_AFTER_S
from app.sessions import SESSION_COOKIE
from app.settings import Settings
from app.web import errors
from tests.conftest import make_token
from tests.factories import batch, gpu

DEAD_URL = "postgresql://nobody@127.0.0.1:1/none"
"""Nothing listens on port 1: every connection is refused."""


def assert_error_shape(body: Any, error: str | None = None) -> None:
    assert set(body) == {"error", "detail"}
    assert isinstance(body["error"], str) and body["error"]
    assert all(set(p) == {"field", "message"} for p in body["detail"])
    if error is not None:
        assert body["error"] == error


def assert_unavailable(r: Any) -> None:
    assert r.status_code == 503
    assert r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert_error_shape(r.json(), "database unavailable")
    assert r.json()["detail"][0]["field"] == "database"


# 404, 405, 422: the error shape on API paths, a page on dashboard paths.


def test_unknown_api_path_is_json_404(client: TestClient) -> None:
    r = client.get("/api/v1/nothing", headers={"Accept": "text/html"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert_error_shape(r.json(), "not found")
    assert r.json()["detail"] == [{"field": "path", "message": "nothing is served at /api/v1/nothing"}]


def test_wrong_method_is_json_405_with_allow(client: TestClient) -> None:
    for method, path in (("GET", "/api/v1/ingest"), ("POST", "/metrics"), ("DELETE", "/api/v1/report")):
        r = client.request(method, path)
        assert r.status_code == 405, path
        assert_error_shape(r.json(), "method not allowed")
        assert r.json()["detail"][0]["field"] == "method"
        assert r.headers["allow"]


def test_unknown_dashboard_path_is_a_page(client: TestClient) -> None:
    r = client.get("/no/such/page", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    page = BeautifulSoup(r.text, "html.parser")
    assert page.h1 is not None and page.h1.text == "Not Found"
    assert "/no/such/page" in page.select_one("[data-field=path]").text  # type: ignore[union-attr]
    # A script that asks for JSON gets the error shape there too.
    r = client.get("/no/such/page", headers={"Accept": "application/json"})
    assert r.status_code == 404
    assert_error_shape(r.json(), "not found")


def test_validation_errors_use_the_shape() -> None:
    app = FastAPI()
    errors.install(app)

    @app.get("/api/v1/count")
    def count(n: int) -> int:
        return n

    r = TestClient(app).get("/api/v1/count", params={"n": "many"})
    assert r.status_code == 422
    assert_error_shape(r.json(), "invalid request")
    assert r.json()["detail"][0]["field"] == "n"


# The database down: connection refused, lost mid-request, no free pooled connection.


@pytest.fixture
def dead(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database_url=DEAD_URL, data_dir=tmp_path)
    with TestClient(create_app(settings)) as c:
        yield c


def test_refused_database_answers_503_everywhere(dead: TestClient) -> None:
    bearer = {"Authorization": "Bearer gpf_" + "0" * 43}
    assert_unavailable(dead.post("/api/v1/ingest", json=batch([gpu(0)]), headers=bearer))
    # The CSV report fails before its first byte: the whole report is built before it streams.
    r = dead.get("/api/v1/report", headers={**bearer, "Accept": "text/csv"})
    assert_unavailable(r)
    assert r.headers["content-type"] == "application/json"
    r = dead.get("/metrics", headers=bearer)
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert_error_shape(r.json())
    r = dead.get("/readyz")
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert r.json()["reason"].startswith("database unreachable")
    # The liveness probe is about the process, which is fine.
    assert dead.get("/healthz").status_code == 200


def test_refused_database_on_a_page_is_an_html_503(dead: TestClient) -> None:
    cookie = f"{SESSION_COOKIE}={secrets.token_urlsafe(32)}"  # well formed, so it is looked up
    r = dead.get("/waste", headers={"Accept": "text/html", "Cookie": cookie})
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert r.headers["content-type"].startswith("text/html")
    page = BeautifulSoup(r.text, "html.parser")
    assert page.h1 is not None and page.h1.text == "Service Unavailable"
    assert "not answering" in page.select_one("[data-field=database]").text  # type: ignore[union-attr]
    assert "Traceback" not in r.text


def test_an_outage_is_logged_once(
    client: TestClient, sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    token = make_token(sessions, "read")
    state = client.app.state.gpufleet  # type: ignore[attr-defined]
    alive = state.sessions
    dead_engine = make_engine(DEAD_URL, pool_size=1)
    caplog.set_level(logging.INFO, logger="gpufleet")
    state.sessions = make_sessionmaker(dead_engine)
    try:
        for _ in range(5):
            assert_unavailable(client.get("/api/v1/report", headers={"Authorization": f"Bearer {token}"}))
    finally:
        state.sessions = alive
        dead_engine.dispose()
    assert client.get("/api/v1/report", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert client.get("/api/v1/report", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "gpufleet"]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    assert "database unavailable" in lines[0][1] and "Connection refused" in lines[0][1]
    assert "database answers again" in lines[1][1]


def test_connection_lost_mid_request(client: TestClient, engine: Engine, sessions: sessionmaker[Session]) -> None:
    """The request's connection is killed while it waits on a lock: 503, and the next request works."""
    token = make_token(sessions, "read")
    headers = {"Authorization": f"Bearer {token}"}
    answers: list[Any] = []
    with engine.connect() as locker:
        locker.execute(text("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE"))
        asker = threading.Thread(target=lambda: answers.append(client.get("/api/v1/report", headers=headers)))
        asker.start()
        try:
            killed = _kill_backend_waiting_on_lock(engine, me=locker)
        finally:
            locker.rollback()
            asker.join(timeout=30)
    assert killed
    assert_unavailable(answers[0])
    assert client.get("/api/v1/report", headers=headers).status_code == 200


def _kill_backend_waiting_on_lock(engine: Engine, *, me: Any) -> bool:
    own = me.execute(text("SELECT pg_backend_pid()")).scalar_one()
    deadline = time.monotonic() + 15
    with engine.connect() as watcher:
        while time.monotonic() < deadline:
            pid = watcher.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    " AND pid <> :own LIMIT 1"
                ),
                {"own": own},
            ).scalar()
            if pid is not None:
                return bool(watcher.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar())
            watcher.rollback()
            time.sleep(0.05)
    return False


def test_no_free_pooled_connection(settings: Settings, sessions: sessionmaker[Session]) -> None:
    token = make_token(sessions, "read")
    headers = {"Authorization": f"Bearer {token}"}
    tight = settings.model_copy(update={"db_pool_size": 1, "db_pool_timeout_s": 0.2})
    with TestClient(create_app(tight)) as c:
        engine: Engine = c.app.state.gpufleet.engine  # type: ignore[attr-defined]
        # The pool holds one connection and one overflow: both taken, as by two slow requests.
        with engine.connect() as one, engine.connect() as two:
            one.execute(text("SELECT 1"))
            two.execute(text("SELECT 1"))
            assert_unavailable(c.get("/api/v1/report", headers=headers))
        assert c.get("/api/v1/report", headers=headers).status_code == 200


# A kept-alive connection after an error answer: a real server, one http.client connection.


@contextmanager
def serving(app: FastAPI) -> Iterator[int]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def _exchange(
    conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, headers={"Accept": "application/json", **(headers or {})})
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def test_connection_stays_usable_after_a_500(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(settings)

    @app.get("/api/v1/broken", include_in_schema=False)
    def broken() -> None:
        raise RuntimeError("a bug in a handler")

    caplog.set_level(logging.ERROR, logger="gpufleet")
    with serving(app) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            status, headers, body = _exchange(conn, "GET", "/api/v1/broken")
            assert status == 500 and headers.get("connection") != "close"
            assert_error_shape(json.loads(body), "internal server error")
            assert b"a bug in a handler" not in body
            # Same connection, next request.
            status, _headers, body = _exchange(conn, "GET", "/healthz")
            assert status == 200 and json.loads(body) == {"status": "ok"}
        finally:
            conn.close()
    logged = [r for r in caplog.records if r.name == "gpufleet" and r.levelno == logging.ERROR]
    assert len(logged) == 1 and "GET /api/v1/broken" in logged[0].getMessage()
    assert logged[0].exc_info is not None and "a bug in a handler" in str(logged[0].exc_info[1])


def test_connection_stays_usable_after_a_503(tmp_path: Path) -> None:
    app = create_app(Settings(database_url=DEAD_URL, data_dir=tmp_path))
    with serving(app) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            status, headers, body = _exchange(conn, "POST", "/api/v1/ingest", {"Authorization": "Bearer gpf_x"})
            assert status == 503 and headers["retry-after"] == str(RETRY_AFTER_S)
            assert_error_shape(json.loads(body), "database unavailable")
            status, _headers, _body = _exchange(conn, "GET", "/api/v1/nothing")
            assert status == 404
            status, _headers, _body = _exchange(conn, "GET", "/healthz")
            assert status == 200
        finally:
            conn.close()
