"""The FastAPI application: routes, error handling, and the jobs that run beside them: partition upkeep, billing,
and alerts (evaluation, delivery, stop actions, daily digests)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from . import __version__
from .alerts.api import router as alerts_router
from .alerts.digest import digest_job
from .alerts.evaluate import evaluation_job, server_finder
from .alerts.outbox import sender_job
from .alerts.stop import action_job
from .auth import SECURITY_SCHEMES
from .billing.schedule import billing_jobs
from .db import make_engine, make_sessionmaker
from .failsafe import ErrorBoundary
from .headers import SecurityHeaders
from .health import router as health_router
from .ingest.routes import router as ingest_router
from .ingest.schemas import ErrorOut, IngestBatchIn
from .metrics.routes import router as metrics_router
from .metrics.server import CountDatabaseErrors, ServerMetrics, multiprocess_dir
from .outage import DatabaseOutage, database_unavailable
from .pricing.config import load_price_config
from .pricing.resolve import Pricer
from .report.routes import router as report_router
from .settings import Settings, get_settings
from .state import AppState
from .store.partitions import upkeep
from .web import errors
from .web.access import ToLogin, to_login
from .web.alerts import router as alerts_page_router
from .web.api_docs import OPENAPI_PATH
from .web.api_docs import router as api_docs_router
from .web.login import router as login_router
from .web.pages import router as pages_router
from .web.snooze import router as snooze_router
from .web.templating import STATIC_DIR, AssetFiles

log = logging.getLogger("gpufleet")


def run_upkeep(engine: Engine, settings: Settings) -> None:
    with engine.begin() as conn:
        result = upkeep(
            conn,
            now=datetime.now(UTC),
            raw_retention_days=settings.raw_retention_days,
            rollup_retention_days=settings.rollup_retention_days,
            ahead_days=settings.partitions_ahead_days,
        )
    if result.created_days or result.dropped:
        log.info("partitions: created %d day(s), dropped %s", len(result.created_days), result.dropped or "none")


async def _upkeep_loop(engine: Engine, settings: Settings, metrics: ServerMetrics, outage: DatabaseOutage) -> None:
    while True:
        try:
            await asyncio.to_thread(run_upkeep, engine, settings)
        except SQLAlchemyError as exc:
            metrics.database_error("upkeep")
            if database_unavailable(exc):
                outage.down(exc)  # logged once per outage, with the requests that fail for the same reason
            else:
                log.warning("partition upkeep failed, will retry: %s", exc)
        await asyncio.sleep(settings.maintenance_interval_s)


GC_GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Fewer, later garbage collections. A dashboard request builds tens of thousands of short-lived objects
    (a fleet's devices and their figures); with the default threshold of 700 allocations the collector runs
    dozens of times per request and its full passes added 70 ms to one request in three (measured with
    bench/pages.py). Objects alive at startup are frozen out of every later pass."""
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if not settings.database_url:
        raise RuntimeError("create_app needs settings.database_url; `gpufleet serve` starts a database if unset")

    # Read now, so a bad price file stops the server before it serves (PriceConfigError names the problem).
    pricer = Pricer(load_price_config(settings.prices_file))
    metrics = ServerMetrics(multiprocess_dir())
    outage = DatabaseOutage()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tune_gc()
        engine = make_engine(
            settings.database_url or "", pool_size=settings.db_pool_size, pool_timeout_s=settings.db_pool_timeout_s
        )
        outage.watch(engine)
        app.state.gpufleet = AppState(
            settings=settings,
            engine=engine,
            sessions=make_sessionmaker(engine),
            pricer=pricer,
            metrics=metrics,
            outage=outage,
        )
        tasks = [
            asyncio.create_task(_upkeep_loop(engine, settings, metrics, outage)),
            *billing_jobs(engine, settings),
        ]
        if settings.alerts == "on":
            tasks += [
                evaluation_job(engine, settings, finder=server_finder(pricer, app.state.gpufleet.fleet_rows)),
                sender_job(engine, settings),
                action_job(engine, settings),
                digest_job(engine, settings),
            ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with suppress(asyncio.CancelledError):
                    await task
            engine.dispose()

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        summary="Where the money of a GPU fleet goes.",
        lifespan=lifespan,
        # /docs is served from the package's own assets (app/web/api_docs.py); /redoc would need a CDN.
        docs_url=None,
        redoc_url=None,
        openapi_url=OPENAPI_PATH,
    )
    app.include_router(health_router)
    app.include_router(ingest_router)
    app.include_router(report_router)
    app.include_router(metrics_router)
    app.include_router(alerts_router)
    app.mount("/static", AssetFiles(directory=STATIC_DIR), name="static")
    app.include_router(api_docs_router)
    app.include_router(login_router)
    app.include_router(pages_router)
    app.include_router(snooze_router)
    app.include_router(alerts_page_router)
    app.add_exception_handler(ToLogin, to_login)
    errors.install(app)
    # The last added runs first: the headers go on every answer, the error boundary's included.
    app.add_middleware(CountDatabaseErrors, metrics=metrics)
    app.add_middleware(ErrorBoundary, outage=outage)
    app.add_middleware(SecurityHeaders)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            # The ingest body is parsed by hand (gzip, size limit), so its models are added here.
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            components = schema["components"].setdefault("schemas", {})
            for model in (IngestBatchIn, ErrorOut):
                defs = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(defs.pop("$defs", {}))
                components[model.__name__] = defs
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
