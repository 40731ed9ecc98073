"""One page, three answers: the HTML page, its htmx fragment (the template's `live` block) and its JSON, all made
from the same view model. JSON is chosen the way every error answer chooses it (app/web/errors.py,
`wants_json`): when `Accept` names JSON and not HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response

from ..analyse.fleet import FilterOptions
from ..analyse.states import Thresholds
from ..analyse.window import PRESETS
from ..errors import ApiError, FieldProblem
from ..ingest.schemas import ErrorOut
from ..openapi_params import FILTER_PARAMS, TABLE_PARAMS, window_params
from ..params import BadParameter, PageQuery
from .errors import wants_json
from .templating import is_htmx, render

LIVE_BLOCK = "live"


@dataclass(frozen=True)
class Chrome:
    """What the page around the figures needs and the JSON does not: the nav entry, the query as asked, the
    filter form's choices."""

    page: str
    """The nav entry marked current."""
    query: PageQuery
    now: datetime
    refresh_s: int
    thresholds: Thresholds
    options: FilterOptions | None = None


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def view_json(view: object) -> bytes:
    """The view as JSON, by its dataclass's pydantic schema (the one OpenAPI publishes)."""
    kind = type(view)
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter.dump_json(view)


def _context(view: object, chrome: Chrome) -> dict[str, Any]:
    q = chrome.query
    options = chrome.options
    return {
        "view": view,
        "page": chrome.page,
        "now": chrome.now,
        "window": q.window,
        "filters": q.filters,
        "presets": list(PRESETS),
        "refresh_s": chrome.refresh_s,
        "thresholds": chrome.thresholds,
        "filter_options": {"region": options.regions, "instance_type": options.instance_types} if options else {},
        "filter_current": {
            "window": q.window.label if q.window.label in PRESETS else None,
            "region": list(q.filters.regions),
            "instance_type": list(q.filters.instance_types),
            "lifecycle": list(q.filters.lifecycles),
            "tag": [f"{k}:{v}" for k, v in q.filters.tags],
        },
    }


def respond(request: Request, template: str, view: object, chrome: Chrome, *, status_code: int = 200) -> Response:
    """The view as JSON, as the page's `live` block for htmx, or as the whole page."""
    if wants_json(request):
        response = Response(view_json(view), status_code=status_code, media_type="application/json")
    else:
        block = LIVE_BLOCK if is_htmx(request) else None
        response = render(request, template, _context(view, chrome), block=block, status_code=status_code)
    # The same URL answers a page, a fragment or JSON: caches must keep them apart.
    response.headers["Vary"] = "Accept, HX-Request"
    return response


def bad_parameter(request: Request, page: str, err: BadParameter) -> Response:
    """400 for a query parameter a page cannot use: the JSON error shape, or an error page naming it."""
    if wants_json(request):
        raise ApiError(400, "bad page parameter", [FieldProblem(err.param, err.message)])
    context = {"page": page, "title": "Bad request", "message": str(err), "param": err.param}
    return render(request, "error.html", context, status_code=400)


_HTML = {"schema": {"type": "string"}}


def error_answer(description: str) -> dict[str, Any]:
    """An error answer: the JSON error shape, or a short HTML page for a browser."""
    return {"model": ErrorOut, "description": description, "content": {"text/html": _HTML}}


def page_openapi(
    view: type,
    *,
    summary: str,
    extra_params: list[dict[str, Any]] | None = None,
    filters: bool = True,
    table: bool = True,
    default_window: str = "24 hours",
) -> dict[str, Any]:
    """A page route's OpenAPI description: its JSON schema (the view model), its HTML, who may read it, and the
    query parameters it reads: the window always, the filters and a table's order and page where it has them."""
    from ..auth import requires

    return {
        "summary": summary,
        "response_model": None,
        "responses": {
            200: {
                "model": view,
                "description": "The page's figures as JSON (`Accept: application/json`), else the HTML page; "
                "with `HX-Request: true`, only its live part.",
                "content": {"text/html": _HTML},
            },
            303: {"description": "No dashboard login: to the login page (HTML requests)."},
            400: error_answer("A query parameter that cannot be used; `detail` names it."),
            401: error_answer("No credentials (JSON requests), an unknown or revoked token, or a login that ended."),
            403: error_answer("A token whose scope does not allow reading."),
            404: error_answer("No such instance (the instance page)."),
        },
        "openapi_extra": {
            **requires("read"),
            "parameters": [
                *window_params(default_window),
                *(FILTER_PARAMS if filters else []),
                *(TABLE_PARAMS if table else []),
                *(extra_params or []),
            ],
        },
    }
