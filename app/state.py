"""What the running server holds: settings, engine, session factory, known partitions."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request

from .pricing.resolve import Pricer
from .settings import Settings
from .store.inventory import InventoryCache
from .store.partitions import PartitionCache


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    partitions: PartitionCache = field(default_factory=PartitionCache)
    inventory: InventoryCache = field(default_factory=InventoryCache)
    pricer: Pricer = field(default_factory=Pricer)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gpufleet
    return state
