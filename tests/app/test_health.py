"""Liveness and readiness."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.main import create_app
from app.settings import Settings


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_when_ready(client: TestClient) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


def test_readyz_when_schema_is_behind(client: TestClient, engine: Engine) -> None:
    with engine.begin() as conn:
        current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    try:
        r = client.get("/readyz")
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": current})
    assert r.status_code == 503
    assert "gpufleet migrate" in r.json()["reason"]


def test_readyz_when_database_is_unreachable(tmp_path: Path) -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", data_dir=tmp_path)
    with TestClient(create_app(settings)) as c:
        assert c.get("/healthz").status_code == 200
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["reason"].startswith("database unreachable")
