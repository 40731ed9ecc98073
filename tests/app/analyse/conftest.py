"""Constructed fleets for the analysis tests: batches go through the real ingest route, then the analysis
runs with an explicit `now`, so every expected figure can be worked out by hand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import Fleet, load_fleet
from app.analyse.states import Thresholds
from app.analyse.waste import WasteAnalysis, analyse_waste
from app.analyse.window import Filters, Window
from app.pricing.config import PriceConfig
from app.pricing.resolve import Pricer
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, held, idle, unknown

__all__ = ["P4D_PER_GPU_HOUR", "Analyst", "Feeder", "busy", "held", "idle", "unknown"]


@dataclass
class Analyst:
    sessions: sessionmaker[Session]
    thresholds: Thresholds
    prices: PriceConfig

    def fleet(self, session: Session, window: Window, filters: Filters | None = None) -> Fleet:
        return load_fleet(
            session,
            filters=filters or Filters(),
            pricer=Pricer(self.prices),
            thresholds=self.thresholds,
            now=window.now,
            since=window.start,
        )

    def waste(self, start: datetime, end: datetime, *, now: datetime | None = None, **kw: Any) -> WasteAnalysis:
        window = Window(start=start, end=end, now=now or end, label="test")
        with self.sessions() as session:
            fleet = self.fleet(session, window, kw.get("filters"))
            return analyse_waste(
                session,
                fleet,
                window,
                self.thresholds,
                by_holder=kw.get("by_holder", False),
                holder_groups=kw.get("holder_groups"),
            )


@pytest.fixture
def analyst(sessions: sessionmaker[Session]) -> Analyst:
    return Analyst(sessions, Thresholds(), PriceConfig())
