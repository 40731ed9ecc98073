"""The request's database session: custom plans for the dashboard's range queries, set only once it is used."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.deps import SessionDep
from app.main import create_app
from app.settings import Settings


def _app_with_probe(settings: Settings) -> FastAPI:
    app = create_app(settings)

    @app.get("/probe")
    def probe(session: SessionDep) -> dict[str, str]:
        mode = session.execute(text("SHOW plan_cache_mode")).scalar_one()
        return {"plan_cache_mode": str(mode)}

    return app


def test_a_request_session_plans_every_query_afresh(settings: Settings) -> None:
    with TestClient(_app_with_probe(settings)) as client:
        for _ in range(2):
            assert client.get("/probe").json() == {"plan_cache_mode": "force_custom_plan"}


def test_the_setting_stays_with_the_request(settings: Settings) -> None:
    with TestClient(_app_with_probe(settings)) as client:
        client.get("/probe")
        state = client.app.state.gpufleet  # type: ignore[attr-defined]
        with state.sessions() as s:
            # SET LOCAL ends with the request's transaction: other users of the pool plan as PostgreSQL decides.
            assert s.execute(text("SHOW plan_cache_mode")).scalar_one() == "auto"
