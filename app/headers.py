"""ASGI middleware: the browser-hardening headers on every answer, error answers included.

docs/security.md, "Browser hardening", explains each. The policy allows scripts, styles, fonts and requests
from the server's own origin only, and no inline script or style: the templates carry no `<script>` body,
`<style>` element, `style=` attribute or `on...=` handler, and htmx is told not to add its indicator style
(`htmx-config` in base.html). Images may also be `data:` URLs (the empty favicon, Swagger UI's icons).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

NO_STORE = "no-store"
STATIC_PREFIX = "/static/"
"""Assets are the same for every user and keep their own caching (`AssetFiles`)."""


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith(STATIC_PREFIX)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                # Anything not static may hold what only a logged-in reader should see: no copies anywhere.
                if not static and "cache-control" not in headers:
                    headers["Cache-Control"] = NO_STORE
            await send(message)

        await self.app(scope, receive, send_with_headers)
