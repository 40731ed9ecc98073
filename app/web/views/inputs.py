"""What a page's view model is built from: the request's database session, its query, and the server's settings
and caches, as values (no app state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from ...analyse.fleet import DeviceRowsCache, Fleet, load_fleet
from ...analyse.states import Thresholds
from ...analyse.window import Filters
from ...params import PageQuery
from ...pricing.resolve import Pricer


@dataclass
class PageInputs:
    session: Session
    query: PageQuery
    now: datetime
    thresholds: Thresholds
    pricer: Pricer
    rows_cache: DeviceRowsCache | None = None
    loaded: Fleet | None = field(default=None, init=False)
    """The fleet the page read, for the filter form's choices."""

    def fleet(self, filters: Filters | None = None) -> Fleet:
        """The instances, GPUs and slices the page covers (the query's filters unless others are given)."""
        self.loaded = load_fleet(
            self.session,
            filters=self.query.filters if filters is None else filters,
            pricer=self.pricer,
            thresholds=self.thresholds,
            now=self.now,
            since=self.query.window.start,
            cache=self.rows_cache,
        )
        return self.loaded
