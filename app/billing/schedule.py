"""The billing work the server does beside serving: import the Cost and Usage Report export and read EC2 spot
price history, each on its own period (docs/billing.md). A failure is logged when its reason changes and
retried next period; it never reaches ingest or the pages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..db import make_sessionmaker, session_scope
from ..settings import Settings
from .cur import CurError
from .imports import import_source
from .sources import SourceError
from .spot import refresh_spot_prices

log = logging.getLogger("gpufleet.billing")


class Reasons:
    """The last failure of each job, so a lasting one is logged once rather than every period."""

    def __init__(self) -> None:
        self._last: dict[str, str | None] = {}

    def failed(self, job: str, reason: str) -> None:
        if self._last.get(job) != reason:
            log.warning("%s failed, will retry: %s", job, reason)
        self._last[job] = reason

    def worked(self, job: str) -> None:
        if self._last.get(job):
            log.info("%s works again", job)
        self._last[job] = None


def import_bill(engine: Engine, source: str) -> None:
    """One import of `source`, in one transaction; logs what changed."""
    with session_scope(make_sessionmaker(engine)) as session:
        results = import_source(session, source)
    for r in results:
        if r.status != "unchanged":
            log.info(
                "billing import: %s payer %s %s, %.0f instance-hours, $%.2f",
                f"{r.billing_period:%Y-%m}",
                r.payer_account,
                r.status,
                r.instance_hours,
                r.usd,
            )


def read_spot_prices(engine: Engine) -> None:
    result = refresh_spot_prices(engine, now=datetime.now(UTC))
    if result.stored:
        log.info("spot price history: %d prices stored for %d pools", result.stored, result.read)


async def _every(period_s: float, job: str, work: Callable[[], None], reasons: Reasons) -> None:
    while True:
        try:
            await asyncio.to_thread(work)
            reasons.worked(job)
        except (CurError, SourceError) as exc:
            reasons.failed(job, str(exc))
        except SQLAlchemyError as exc:
            reasons.failed(job, f"database: {str(exc).splitlines()[0]}")
        await asyncio.sleep(period_s)


def billing_jobs(engine: Engine, settings: Settings) -> list[asyncio.Task[None]]:
    """Start the billing jobs the settings turn on; the caller cancels them on shutdown."""
    reasons = Reasons()
    jobs: list[tuple[float, str, Callable[[], None]]] = []
    source = settings.billing_source
    if source:
        jobs.append((settings.billing_import_interval_s, "billing import", lambda: import_bill(engine, source)))
    if settings.spot_prices == "on":
        jobs.append((settings.spot_prices_check_s, "spot price history", lambda: read_spot_prices(engine)))
    return [asyncio.create_task(_every(period, job, work, reasons)) for period, job, work in jobs]
