"""ASGI middleware: an exception no handler took becomes an answer, and the connection stays usable.

Starlette's outermost error middleware sends a 500 and then raises again, and uvicorn resets the kept-alive
connection after it without a `Connection: close`: a client's next request on it fails. This middleware sits
inside it, answers the request itself and does not raise:

- the database unavailable (refused, lost mid-request, pool exhausted; `app.outage`): 503 with `Retry-After`,
  logged once per outage;
- anything else: 500, logged with its traceback.

Both in the error shape of `app.web.errors`. When the answer had already begun (a streamed body), nothing
more can be said: the request is logged and the response left unfinished, so the server closes the
connection and the client sees a cut body instead of one that looks whole.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .outage import DatabaseOutage, database_unavailable, describe
from .web.errors import internal_error, service_unavailable

log = logging.getLogger("gpufleet")


class ErrorBoundary:
    def __init__(self, app: ASGIApp, outage: DatabaseOutage) -> None:
        self.app = app
        self.outage = outage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            request = Request(scope)
            where = f"{request.method} {request.url.path}"
            if database_unavailable(exc):
                self.outage.down(exc)
                if started:
                    log.warning("%s: the database went away during the answer: %s", where, describe(exc))
                    return
                await service_unavailable(request)(scope, receive, send)
                return
            log.error("%s failed", where, exc_info=exc)
            if not started:
                await internal_error(request)(scope, receive, send)
