"""Request dependencies shared by the pages, the report and authentication: one database session per request.

The session is opened before the handler and committed once after it (rolled back if it raised), before the
answer is sent; every dependency of the same request gets the same session (FastAPI caches it per request).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session
from starlette.requests import Request

from .db import session_scope
from .settings import Settings
from .state import app_state


def db_session(request: Request) -> Iterator[Session]:
    with session_scope(app_state(request).sessions) as session:
        yield session


def settings(request: Request) -> Settings:
    return app_state(request).settings


SessionDep = Annotated[Session, Depends(db_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(settings)]
