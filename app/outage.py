"""Whether the database is answering: which errors mean it is not, and one log line per outage.

A request that finds the database down answers 503 with `Retry-After` (app/failsafe.py); the log gets one
warning when the outage is first seen and one info line when a connection is made again, however many
requests fail in between.
"""

from __future__ import annotations

import logging
import time
from threading import Lock

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

log = logging.getLogger("gpufleet")

RETRY_AFTER_S = 10
"""What `Retry-After` tells a caller to wait while the database is down, s."""


def database_unavailable(exc: BaseException) -> bool:
    """True for errors that say the database cannot be reached or used now (refused, lost mid-request, no
    free pooled connection in time), as opposed to a bad query or data, which stay server errors (500)."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    return False


def describe(exc: BaseException) -> str:
    """The first line of the driver's message, without SQLAlchemy's background links."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DatabaseOutage:
    """Tracks one outage at a time; thread-safe (requests fail in worker threads)."""

    def __init__(self) -> None:
        self._down_since: float | None = None
        self._lock = Lock()

    @property
    def is_down(self) -> bool:
        return self._down_since is not None

    def down(self, exc: BaseException) -> None:
        """A request or probe found the database unavailable: log it if this starts an outage."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning("database unavailable, answering 503 until it answers again: %s", describe(exc))

    def answered(self) -> None:
        """A connection to the database worked: log the end of an outage, if there was one."""
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("database answers again, after %.0f s", time.monotonic() - since)

    def watch(self, engine: Engine) -> None:
        """Count every connection handed out by `engine` (after its pre-ping passed) as an answer."""
        event.listen(engine, "checkout", lambda *_args: self.answered())
