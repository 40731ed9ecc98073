"""GET /docs: the interactive API description (Swagger UI), served from this package's own assets.

FastAPI's built-in page loads Swagger UI from a public CDN and starts it with an inline script, which the
Content-Security-Policy (app/headers.py) forbids; this page loads the vendored copy in static/vendor/ and
starts it from static/api-docs.js.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ..auth import requires
from .templating import render

DOCS_PATH = "/docs"
OPENAPI_PATH = "/openapi.json"

router = APIRouter(include_in_schema=False)


@router.get(DOCS_PATH, response_class=HTMLResponse, openapi_extra=requires(None))
def api_docs(request: Request) -> HTMLResponse:
    return render(request, "api_docs.html", {"openapi_url": OPENAPI_PATH})
