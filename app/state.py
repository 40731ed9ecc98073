"""What the running server holds: settings, engine, session factory, known partitions, metrics, outage."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request

from .analyse.fleet import DeviceRowsCache
from .ingest.admission import Admission
from .metrics.server import ServerMetrics
from .outage import DatabaseOutage
from .pricing.resolve import Pricer
from .settings import Settings
from .store.inventory import InventoryCache
from .store.partitions import PartitionCache
from .web.throttle import FailedLogins


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    partitions: PartitionCache = field(default_factory=PartitionCache)
    inventory: InventoryCache = field(default_factory=InventoryCache)
    pricer: Pricer = field(default_factory=Pricer)
    fleet_rows: DeviceRowsCache = field(default_factory=DeviceRowsCache)
    failed_logins: FailedLogins = field(default_factory=FailedLogins)
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    outage: DatabaseOutage = field(default_factory=DatabaseOutage)
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.settings)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpufleet
    return state
