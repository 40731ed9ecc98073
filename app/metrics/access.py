"""Who may scrape /metrics: whoever may read (`app.auth.require_read`): a token with the `read` or `admin`
scope, as Prometheus sends it, or anyone on this host under GPUFLEET_AUTH=off.

The tokens live in the database, and a scrape should still say `gpufleet_database_up 0` while the database is
down. So a token that passed the check lately is let through while the check itself cannot run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from threading import Lock

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.requests import Request

from ..auth import hash_secret, require_read
from ..errors import ApiError
from ..settings import Settings

REMEMBER_S = 900.0
"""How long a token that passed the check is let through while the database cannot be asked, s."""
_MAX_REMEMBERED = 64


class RecentReaders:
    """Authorization headers (hashed) that passed the read check lately."""

    def __init__(self, remember_s: float = REMEMBER_S) -> None:
        self.remember_s = remember_s
        self._until: dict[str, float] = {}
        self._lock = Lock()

    def remember(self, authorization: str | None) -> None:
        if not authorization:
            return
        with self._lock:
            if len(self._until) >= _MAX_REMEMBERED:
                now = time.monotonic()
                self._until = {k: t for k, t in self._until.items() if t > now}
            if len(self._until) < _MAX_REMEMBERED:
                self._until[hash_secret(authorization)] = time.monotonic() + self.remember_s

    def forget(self, authorization: str | None) -> None:
        if authorization:
            with self._lock:
                self._until.pop(hash_secret(authorization), None)

    def knows(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        with self._lock:
            return self._until.get(hash_secret(authorization), 0.0) > time.monotonic()


def check_reader(
    session: Session,
    settings: Settings,
    readers: RecentReaders,
    request: Request,
    *,
    on_database_error: Callable[[], None],
) -> None:
    """Return if the caller may read the metrics; raise ApiError (401, 403, or 503 without a database). A database
    failure leaves `session` rolled back, ready for the next try."""
    authorization = request.headers.get("authorization")
    try:
        reader = require_read(session, request, settings, now=datetime.now(UTC))
        session.flush()
    except ApiError:
        readers.forget(authorization)
        raise
    except SQLAlchemyError:
        session.rollback()
        on_database_error()
        if readers.knows(authorization):
            return
        raise ApiError(503, "database unavailable: the token cannot be checked") from None
    if reader.via == "token":
        readers.remember(authorization)
