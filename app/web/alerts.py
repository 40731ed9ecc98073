"""The /alerts page (admins only): the rules, a form to add or edit one, buttons to turn one on or off or delete it,
and the recent incidents and actions. docs/alerts.md, "The /alerts page".

The forms post as any form of the dashboard does (app/web/forms.py), with the session's CSRF token; a change
answers 303 back to the page, a rule that cannot be used answers the page again with each problem next to its
field (400, or 409 for a name that is taken).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from ..alerts import rules
from ..alerts.api import changed_by
from ..alerts.schemas import NAME_PATTERN, RuleIn, field_problems, to_rule
from ..alerts.tables import CONDITIONS
from ..auth import Reader, requires
from ..deps import SessionDep
from ..errors import ApiError, FieldProblem
from ..state import app_state
from .access import admin_page_reader
from .csrf import csrf_ok
from .errors import error_response, wants_json
from .forms import FormError, read_form
from .respond import error_answer, view_json
from .rule_form import DEFAULTS, ROUTE_KINDS, errors_by_field, rule_data, rule_values, secrets_set
from .templating import is_htmx, render
from .views.alerts import CONDITION_TEXT, AlertsView, RuleForm, build_alerts

PATH = "/alerts"
router = APIRouter(tags=["dashboard"], dependencies=[Depends(admin_page_reader)])
AdminDep = Annotated[Reader, Depends(admin_page_reader)]
NOTICES = {
    "saved": "Rule {} saved.",
    "deleted": "Rule {} deleted.",
    "on": "Rule {} turned on.",
    "off": "Rule {} turned off.",
}
_HTML = {"schema": {"type": "string"}}


def _notices(request: Request) -> list[str]:
    shown = []
    for key, text in NOTICES.items():
        name = request.query_params.get(key)
        if name and re.fullmatch(NAME_PATTERN, name):
            shown.append(text.format(repr(name)))
    return shown


def _page(request: Request, session: Session, form: RuleForm, *, status: int = 200) -> Response:
    state = app_state(request)
    settings = state.settings
    view = build_alerts(session, rule_file=str(settings.alerts_file) if settings.alerts_file else None)
    if wants_json(request):
        response = Response(view_json(view), status_code=status, media_type="application/json")
    else:
        reader: Reader = request.state.reader
        context: dict[str, Any] = {
            "page": "alerts",
            "view": view,
            "form": form,
            "can_edit": reader.session is not None,
            "auth_off": reader.via == "open",
            "notices": _notices(request),
            "conditions": [(c, CONDITION_TEXT[c]) for c in CONDITIONS],
            "route_kinds": ROUTE_KINDS,
            "now": datetime.now(UTC),
            "refresh_s": settings.refresh_s,
        }
        block = "live" if is_htmx(request) else None
        response = render(request, "alerts.html", context, block=block, status_code=status)
    response.headers["Vary"] = "Accept, HX-Request"
    return response


@router.get(
    PATH,
    summary="Alert rules, incidents and actions",
    response_model=None,
    responses={
        200: {
            "model": AlertsView,
            "description": "The page's rules, incidents, actions and delivery as JSON (`Accept: application/json`), "
            "else the HTML page; with `HX-Request: true`, only its live part. Webhook secrets are never shown.",
            "content": {"text/html": _HTML},
        },
        303: {"description": "No dashboard login: to the login page (HTML requests)."},
        401: error_answer("No credentials (JSON requests), an unknown or revoked token, or a login that ended."),
        403: error_answer("A token or login that may only read."),
        404: error_answer("`edit` names no rule."),
    },
    openapi_extra={
        **requires("admin"),
        "parameters": [
            {
                "name": "edit",
                "in": "query",
                "required": False,
                "description": "The name of a rule to fill the form with, to edit it.",
                "schema": {"type": "string"},
            }
        ],
    },
)
def alerts_page(request: Request, session: SessionDep) -> Response:
    """The rules, the form to add or edit one, and the most recent incidents and actions."""
    form = RuleForm(values=dict(DEFAULTS))
    editing = request.query_params.get("edit")
    if editing is not None:
        rule = rules.get_rule(session, editing)
        if rule is None:
            return error_response(request, 404, "no such rule", [FieldProblem("edit", f"no rule named {editing!r}")])
        if rule.source != rules.FILE:
            form = RuleForm(values=rule_values(rule), editing=rule.name, secret_set=secrets_set(rule))
    return _page(request, session, form)


async def _posted(request: Request, reader: Reader) -> dict[str, str] | Response:
    """The posted form, or the answer to a form that cannot be read or lacks the session's CSRF token."""
    try:
        values = await read_form(request)
    except FormError as exc:
        return error_response(request, 400, "bad form", [FieldProblem("form", str(exc))])
    if reader.session is not None and not csrf_ok(reader.session.csrf_secret, values, request.headers):
        message = "The form had expired or came from another site. Reload the page and try again."
        return error_response(request, 403, "forbidden", [FieldProblem("csrf_token", message)])
    return values


def _check(values: dict[str, str], keep: rules.Rule | None) -> tuple[rules.Rule | None, list[FieldProblem]]:
    data, problems = rule_data(values)
    flagged = {p.field for p in problems}
    try:
        rule = to_rule(RuleIn.model_validate(data), source=keep.source if keep else "page", keep=keep)
    except ValidationError as exc:
        return None, problems + [p for p in field_problems(exc.errors()) if p.field not in flagged]
    except ApiError as exc:
        return None, problems + exc.detail
    return (None, problems) if problems else (rule, [])


def _save(request: Request, session: Session, reader: Reader, values: dict[str, str], name: str | None) -> Response:
    keep = rules.get_rule(session, name) if name is not None else None
    if name is not None and keep is None:
        return error_response(request, 404, "no such rule", [FieldProblem("name", f"no rule named {name!r}")])
    rule, problems = _check(values, keep)
    form = RuleForm(values=values, editing=name, secret_set=secrets_set(keep) if keep else {})
    if rule is None:
        form.errors = errors_by_field(problems)
        return _page(request, session, form, status=400)
    by, now = changed_by(reader), datetime.now(UTC)
    try:
        if name is None:
            saved = rules.create_rule(session, rule, by=by, now=now)
        else:
            saved = rules.replace_rule(session, name, rule, by=by, now=now)
    except ApiError as exc:
        if exc.status_code != 409:
            raise
        form.errors = errors_by_field(exc.detail)
        form.errors.setdefault("form", []).append(exc.error[:1].upper() + exc.error[1:] + ".")
        return _page(request, session, form, status=409)
    return RedirectResponse(f"{PATH}?saved={quote(saved.name)}", status_code=303)


@router.post(PATH, include_in_schema=False, openapi_extra=requires("admin"))
async def add_rule(request: Request, session: SessionDep, reader: AdminDep) -> Response:
    values = await _posted(request, reader)
    if isinstance(values, Response):
        return values
    return await run_in_threadpool(_save, request, session, reader, values, None)


@router.post(PATH + "/{name}", include_in_schema=False, openapi_extra=requires("admin"))
async def edit_rule(name: str, request: Request, session: SessionDep, reader: AdminDep) -> Response:
    values = await _posted(request, reader)
    if isinstance(values, Response):
        return values
    return await run_in_threadpool(_save, request, session, reader, values, name)


def _change(request: Request, session: Session, reader: Reader, name: str, enabled: bool | None) -> Response:
    try:
        if enabled is None:
            rules.delete_rule(session, name)
            done = "deleted"
        else:
            rules.set_enabled(session, name, enabled, by=changed_by(reader), now=datetime.now(UTC))
            done = "on" if enabled else "off"
    except ApiError as exc:
        return error_response(request, exc.status_code, exc.error, exc.detail)
    return RedirectResponse(f"{PATH}?{done}={quote(name)}", status_code=303)


@router.post(PATH + "/{name}/delete", include_in_schema=False, openapi_extra=requires("admin"))
async def delete_rule(name: str, request: Request, session: SessionDep, reader: AdminDep) -> Response:
    values = await _posted(request, reader)
    if isinstance(values, Response):
        return values
    return await run_in_threadpool(_change, request, session, reader, name, None)


@router.post(PATH + "/{name}/enabled", include_in_schema=False, openapi_extra=requires("admin"))
async def enable_rule(name: str, request: Request, session: SessionDep, reader: AdminDep) -> Response:
    values = await _posted(request, reader)
    if isinstance(values, Response):
        return values
    if values.get("enabled") not in ("true", "false"):
        return error_response(request, 400, "bad form", [FieldProblem("enabled", "true or false")])
    return await run_in_threadpool(_change, request, session, reader, name, values["enabled"] == "true")
