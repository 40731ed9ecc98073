"""Every error answer of the server, made here: JSON `{"error": ..., "detail": [{"field", "message"}]}` for the
API, a short HTML page for the dashboard.

API paths (`/api/...`, `/metrics`, the probes and `/openapi.json`) always get JSON. Other paths get the HTML
page, unless the request's `Accept` asks for JSON and not HTML. `ApiError` is always JSON: it is raised for
scripts (a bad bearer token, a bad report parameter).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..errors import ApiError, FieldProblem
from ..outage import RETRY_AFTER_S
from .templating import render

log = logging.getLogger("gpufleet")

API_PREFIXES = ("/api/",)
API_PATHS = frozenset({"/api", "/metrics", "/healthz", "/readyz", "/openapi.json"})

_FALLBACK_PAGE = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{code} {title} · gpufleet</title></head>'
    "<body><h1>{title}</h1><p>{message}</p></body></html>"
)


def is_api_path(path: str) -> bool:
    return path in API_PATHS or path.startswith(API_PREFIXES)


def wants_json(request: Request) -> bool:
    """JSON for API paths; elsewhere only when `Accept` names JSON and not HTML."""
    if is_api_path(request.url.path):
        return True
    accept = request.headers.get("accept", "").lower()
    return "json" in accept and "text/html" not in accept


def error_response(
    request: Request,
    status_code: int,
    error: str,
    detail: Sequence[FieldProblem] = (),
    *,
    headers: Mapping[str, str] | None = None,
    json: bool | None = None,
) -> Response:
    """The answer to a request that failed: JSON or HTML as above (`json` forces one); every 503 says when
    to try again (`Retry-After`). Error answers are never cached."""
    all_headers = {"Cache-Control": "no-store", **(headers or {})}
    if status_code == 503:
        all_headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    body = ApiError(status_code, error, list(detail))
    if json if json is not None else wants_json(request):
        return JSONResponse(body.body(), status_code=status_code, headers=all_headers)
    return _page(request, body, all_headers)


def _page(request: Request, problem: ApiError, headers: dict[str, str]) -> Response:
    title = _phrase(problem.status_code)
    try:
        response: Response = render(
            request,
            "http_error.html",
            {"title": title, "problem": problem, "status_code": problem.status_code},
            status_code=problem.status_code,
            headers=headers,
        )
    except Exception:
        # A failing template must not hide the error it was to report.
        log.exception("rendering the error page failed")
        message = problem.error.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        html = _FALLBACK_PAGE.format(code=problem.status_code, title=title, message=message)
        response = HTMLResponse(html, status_code=problem.status_code, headers=headers)
    return response


def _phrase(status_code: int) -> str:
    try:
        return HTTPStatus(status_code).phrase
    except ValueError:
        return "Error"


def service_unavailable(request: Request) -> Response:
    """503 while the database is down."""
    return error_response(
        request,
        503,
        "database unavailable",
        [FieldProblem("database", f"the database is not answering; try again in {RETRY_AFTER_S} s")],
    )


def internal_error(request: Request) -> Response:
    """500 for a failure on the server's side; the log has the traceback, the answer does not."""
    return error_response(request, 500, "internal server error", [])


async def on_http_exception(request: Request, exc: Exception) -> Response:
    """404, 405 and any other HTTPException the framework raises."""
    assert isinstance(exc, HTTPException)
    code = exc.status_code
    detail: list[FieldProblem] = []
    if code == 404:
        error = "not found"
        detail = [FieldProblem("path", f"nothing is served at {request.url.path}")]
    elif code == 405:
        error = "method not allowed"
        allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
        message = f"{request.method} is not allowed here" + (f"; allowed: {allowed}" if allowed else "")
        detail = [FieldProblem("method", message)]
    else:
        error = exc.detail if isinstance(exc.detail, str) and exc.detail else _phrase(code).lower()
    return error_response(request, code, error, detail, headers=exc.headers)


def _field(loc: Sequence[object]) -> str:
    # The location's first part says where (query, path, body...); the rest names the parameter.
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("query", "path", "body", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "request"


async def on_validation_error(request: Request, exc: Exception) -> Response:
    """422 for parameters FastAPI itself checks, in the same shape as every other error."""
    assert isinstance(exc, RequestValidationError)
    detail = [FieldProblem(_field(e.get("loc", ())), str(e.get("msg", "invalid"))) for e in exc.errors()]
    return error_response(request, 422, "invalid request", detail)


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(request, exc.status_code, exc.error, exc.detail, headers=exc.headers, json=True)


def install(app: FastAPI) -> None:
    """Register the handlers of the errors the framework and the routes raise on purpose. Anything else is
    answered by `app.failsafe.ErrorBoundary`."""
    app.add_exception_handler(HTTPException, on_http_exception)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ApiError, on_api_error)
