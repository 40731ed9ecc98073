"""The request's database session: custom plans for the dashboard's range queries and room to group a month of
rollups in memory, set only once it is used."""

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
        memory = session.execute(text("SHOW work_mem")).scalar_one()
        return {"plan_cache_mode": str(mode), "work_mem": str(memory)}

    return app


def test_a_request_session_plans_every_query_afresh(settings: Settings) -> None:
    with TestClient(_app_with_probe(settings)) as client:
        for _ in range(2):
            assert client.get("/probe").json() == {"plan_cache_mode": "force_custom_plan", "work_mem": "64MB"}


def test_the_setting_stays_with_the_request(settings: Settings) -> None:
    with TestClient(_app_with_probe(settings)) as client:
        client.get("/probe")
        state = client.app.state.gpufleet  # type: ignore[attr-defined]
        with state.sessions() as s:
            # SET LOCAL ends with the request's transaction: other users of the pool plan as PostgreSQL decides.
            assert s.execute(text("SHOW plan_cache_mode")).scalar_one() == "auto"
            assert s.execute(text("SHOW work_mem")).scalar_one() != "64MB"
