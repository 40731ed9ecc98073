"""`/api/v1/alerts`: alert rules over HTTP, for a token of scope admin or an admin login (docs/alerts.md, "The API").

Thin handlers: the body is checked by its pydantic model (app/alerts/schemas.py), a bad one answers 400 naming
every field at fault, and the work is done by app/alerts/rules.py on the request's session.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ..auth import Reader, require_admin, requires
from ..deps import SessionDep, SettingsDep
from ..errors import ApiError, FieldProblem
from ..ingest.schemas import ErrorOut
from ..web.csrf import CSRF_HEADER, csrf_ok
from . import rules
from .outputs import RuleOut, RulesOut, rule_out
from .schemas import BAD_RULE, EnabledIn, RuleIn, field_problems, to_rule

PREFIX = "/api/v1/alerts"


class _BadRuleIs400(APIRoute):
    """A body that its model refuses answers 400 naming each field, as every other bad rule does (the app's default
    for what FastAPI checks is 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise ApiError(400, BAD_RULE, field_problems(exc.errors(), skip=1)) from None

        return checked


router = APIRouter(prefix=PREFIX, tags=["alerts"], route_class=_BadRuleIs400)


def _error(description: str, error: str, field: str | None = None, message: str = "") -> dict[str, Any]:
    detail = [{"field": field, "message": message}] if field else []
    return {
        "model": ErrorOut,
        "description": description,
        "content": {"application/json": {"example": {"error": error, "detail": detail}}},
    }


RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("A rule that cannot be used; `detail` names each field at fault.", BAD_RULE, "for", "required"),
    401: _error("No credentials, an unknown or revoked token, or a login that ended.", "unknown token"),
    403: _error(
        "A token or login that may not manage alert rules, or a change by a login without its CSRF token.",
        "token scope 'read' does not allow 'admin'",
    ),
    404: _error("No rule of that name.", "no such rule", "name", "no rule named 'idle'"),
    409: _error(
        "The name is taken, or the rule comes from the rule file (GPUFLEET_ALERTS_FILE) and is changed there.",
        "a rule of that name exists",
        "name",
        "'idle' is taken: choose another",
    ),
}


def _admin(request: Request, session: SessionDep, settings: SettingsDep) -> Reader:
    reading = request.method in ("GET", "HEAD")
    reader = require_admin(session, request, settings, now=datetime.now(UTC), reading=reading)
    # A login is sent by the browser on its own: a change must also show the session's CSRF token.
    if not reading and reader.session is not None and not csrf_ok(reader.session.csrf_secret, {}, request.headers):
        raise ApiError(403, f"a change by a dashboard login needs its CSRF token in the {CSRF_HEADER} header")
    return reader


Admin = Annotated[Reader, Depends(_admin)]
SECURITY = requires("admin")


def changed_by(reader: Reader) -> str:
    """Who made a change, as `alert_rules.updated_by` keeps it."""
    return f"token {reader.name}" if reader.via == "token" else f"login {reader.name}"


@router.get(
    "",
    summary="Alert rules",
    response_model=RulesOut,
    response_model_exclude_none=True,
    responses=RESPONSES,
    openapi_extra=SECURITY,
)
def list_alert_rules(session: SessionDep, _admin: Admin) -> RulesOut:
    """Every rule, by name. Webhook secrets are never shown: `secret_set` says whether one is stored."""
    return RulesOut(rules=[rule_out(r) for r in rules.list_rules(session)])


@router.post(
    "",
    summary="Add an alert rule",
    status_code=201,
    response_model=RuleOut,
    response_model_exclude_none=True,
    responses=RESPONSES,
    openapi_extra=SECURITY,
)
def create_alert_rule(body: RuleIn, session: SessionDep, admin: Admin, response: Response) -> RuleOut:
    """A new rule; its name must be free."""
    rule = rules.create_rule(session, to_rule(body, source="api"), by=changed_by(admin), now=datetime.now(UTC))
    response.headers["Location"] = f"{PREFIX}/{quote(rule.name)}"
    return rule_out(rule)


def _found(session: SessionDep, name: str) -> rules.Rule:
    rule = rules.get_rule(session, name)
    if rule is None:
        raise ApiError(404, "no such rule", [FieldProblem("name", f"no rule named {name!r}")])
    return rule


@router.get(
    "/{name}",
    summary="One alert rule",
    response_model=RuleOut,
    response_model_exclude_none=True,
    responses=RESPONSES,
    openapi_extra=SECURITY,
)
def read_alert_rule(name: str, session: SessionDep, _admin: Admin) -> RuleOut:
    """The rule of that name (or id)."""
    return rule_out(_found(session, name))


@router.put(
    "/{name}",
    summary="Replace an alert rule",
    response_model=RuleOut,
    response_model_exclude_none=True,
    responses=RESPONSES,
    openapi_extra=SECURITY,
)
def replace_alert_rule(name: str, body: RuleIn, session: SessionDep, admin: Admin) -> RuleOut:
    """The whole rule, anew; `name` may change. A webhook `secret` left out for the same webhook URL keeps the
    stored one. A rule from the rule file answers 409."""
    old = _found(session, name)
    new = to_rule(body, source=old.source, keep=old)
    return rule_out(rules.replace_rule(session, old.name, new, by=changed_by(admin), now=datetime.now(UTC)))


@router.delete("/{name}", summary="Delete an alert rule", status_code=204, responses=RESPONSES, openapi_extra=SECURITY)
def delete_alert_rule(name: str, session: SessionDep, _admin: Admin) -> Response:
    """The rule and its incidents go; its recorded actions stay. A rule from the rule file answers 409."""
    rules.delete_rule(session, _found(session, name).name)
    return Response(status_code=204)


@router.post(
    "/{name}/enabled",
    summary="Turn an alert rule on or off",
    response_model=RuleOut,
    response_model_exclude_none=True,
    responses=RESPONSES,
    openapi_extra=SECURITY,
)
def enable_alert_rule(name: str, body: EnabledIn, session: SessionDep, admin: Admin) -> RuleOut:
    """`{"enabled": false}` stops the rule from opening incidents until `{"enabled": true}`."""
    rule = _found(session, name)
    changed = rules.set_enabled(session, rule.name, body.enabled, by=changed_by(admin), now=datetime.now(UTC))
    return rule_out(changed)
