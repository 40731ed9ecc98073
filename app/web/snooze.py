"""The snooze page, `/alerts/snooze/<token>`: the link in every alert message (docs/alerts.md, "Snooze").

No login: the signed token is the credential, for its one incident and until it expires, with authentication on
or off. GET shows what the incident is about and a form (1 day or 1 week, a reason, optionally a name); POST
records the snooze. The form carries a CSRF token as the login form does, a double submit: a random value in an
HttpOnly, SameSite=Strict cookie that the form repeats. A link that is not valid answers 400, an expired one 410,
one whose incident is gone 404, each with a page saying so (JSON for `Accept: application/json`); a closed
incident is shown as closed and a snooze of it answers 409 and records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from ..alerts import snooze
from ..auth import requires
from ..deps import SessionDep
from ..errors import FieldProblem
from ..state import app_state
from .access import cookie_secure
from .csrf import csrf_ok, new_token, use_token, well_formed
from .errors import error_response, wants_json
from .forms import FormError, read_form
from .respond import view_json
from .templating import render
from .views.snooze import SnoozeView, build_snooze

PREFIX = "/alerts/snooze"
PATH = PREFIX + "/{token}"
CSRF_COOKIE = "gpufleet_snooze_csrf"
MAX_NAME = 100
CHOICES = (("1d", "1 day"), ("1w", "1 week"))

router = APIRouter(include_in_schema=False)

_BAD_LINK = (
    "the link may have been cut short or changed when it was copied, or the server's signing key has changed since "
    "it was sent; the incident's next message carries a new link"
)


@dataclass
class SnoozeForm:
    values: dict[str, str] = field(default_factory=lambda: {"for": "1d"})
    errors: dict[str, list[str]] = field(default_factory=dict)

    def value(self, name: str) -> str:
        return self.values.get(name, "")


def _link(request: Request, session: Session, token: str, now: datetime) -> snooze.LinkToken | Response:
    """The token's incident and expiry, or the error page of a token that is not valid or has expired."""
    try:
        return snooze.verify(snooze.signing_key(session, app_state(request).settings), token, now=now)
    except snooze.BadLink:
        return error_response(request, 400, "not a valid snooze link", [FieldProblem("token", _BAD_LINK)])
    except snooze.ExpiredLink as exc:
        days = snooze.LINK_TTL.days
        message = (
            f"it worked until {exc.token.expires_at:%Y-%m-%d %H:%M} UTC (snooze links last {days} days from their "
            "message); the incident's next reminder carries a new one"
        )
        return error_response(request, 410, "snooze link expired", [FieldProblem("token", message)])


def _gone(request: Request, incident_id: int) -> Response:
    message = f"incident {incident_id} no longer exists: its rule may have been deleted"
    return error_response(request, 404, "no such incident", [FieldProblem("token", message)])


def _page(
    request: Request,
    view: SnoozeView,
    form: SnoozeForm,
    *,
    status: int = 200,
    notice: str | None = None,
    problem: str | None = None,
) -> Response:
    if wants_json(request):
        response = Response(view_json(view), status_code=status, media_type="application/json")
    else:
        csrf = request.cookies.get(CSRF_COOKIE)
        if not well_formed(csrf):
            csrf = new_token()
        assert csrf is not None
        use_token(request, csrf)
        context: dict[str, Any] = {
            "page": "snooze",
            "view": view,
            "form": form,
            "choices": CHOICES,
            "notice": notice,
            "problem": problem,
            "ttl_days": snooze.LINK_TTL.days,
        }
        response = render(request, "snooze.html", context, status_code=status)
        response.set_cookie(
            CSRF_COOKIE, csrf, path=PREFIX, secure=cookie_secure(request), httponly=True, samesite="strict"
        )
    response.headers["Cache-Control"] = "no-store"
    response.headers.add_vary_header("Accept")
    return response


def _show(request: Request, session: Session, token: str) -> Response:
    now = datetime.now(UTC)
    link = _link(request, session, token, now)
    if isinstance(link, Response):
        return link
    view = build_snooze(session, link.incident_id, link_expires_at=link.expires_at, now=now)
    if view is None:
        return _gone(request, link.incident_id)
    notice = None
    if request.query_params.get("snoozed") == "1" and view.snoozed and view.snoozed_until is not None:
        notice = f"Snoozed until {view.snoozed_until.astimezone(UTC):%Y-%m-%d %H:%M} UTC."
    return _page(request, view, SnoozeForm(), notice=notice)


@router.get(PATH, openapi_extra=requires(None))
def snooze_page(token: str, request: Request, session: SessionDep) -> Response:
    """What the incident is about, and the form that snoozes it."""
    return _show(request, session, token)


def _checked(values: dict[str, str]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if values.get("for") not in snooze.CHOICES:
        errors["for"] = ["Choose 1 day or 1 week."]
    reason = values.get("reason", "").strip()
    if not reason:
        errors["reason"] = ["Say why, for whoever looks at the alerts next."]
    elif len(reason) > snooze.MAX_REASON:
        errors["reason"] = [f"At most {snooze.MAX_REASON} characters."]
    if len(values.get("name", "").strip()) > MAX_NAME:
        errors["name"] = [f"At most {MAX_NAME} characters."]
    return errors


def _record(request: Request, session: Session, token: str, values: dict[str, str], csrf_good: bool) -> Response:
    now = datetime.now(UTC)
    link = _link(request, session, token, now)
    if isinstance(link, Response):
        return link
    view = build_snooze(session, link.incident_id, link_expires_at=link.expires_at, now=now)
    if view is None:
        return _gone(request, link.incident_id)
    form = SnoozeForm(values={k: values.get(k, "") for k in ("for", "reason", "name")})
    if not csrf_good:
        return _page(request, view, form, status=400, problem="The form had expired. Try again.")
    form.errors = _checked(values)
    if form.errors:
        return _page(request, view, form, status=400)
    name = values.get("name", "").strip()
    by = f"{name} (snooze link)" if name else "snooze link"
    try:
        snooze.snooze_incident(
            session,
            link.incident_id,
            until=now + snooze.CHOICES[values["for"]],
            reason=values["reason"],
            by=by,
            now=now,
        )
    except snooze.UnknownIncident:
        return _gone(request, link.incident_id)
    except snooze.IncidentClosed as exc:
        closed = build_snooze(session, link.incident_id, link_expires_at=link.expires_at, now=now) or view
        return _page(request, closed, SnoozeForm(), status=409, problem=str(exc)[:1].upper() + str(exc)[1:] + ".")
    if wants_json(request):
        done = build_snooze(session, link.incident_id, link_expires_at=link.expires_at, now=now)
        assert done is not None
        return _page(request, done, form)
    return RedirectResponse(f"{PREFIX}/{token}?snoozed=1", status_code=303)


@router.post(PATH, openapi_extra=requires(None))
async def snooze_post(token: str, request: Request, session: SessionDep) -> Response:
    """Records a snooze of the link's incident; the link is checked before anything else, then the form's CSRF
    token."""
    values: dict[str, str] = {}
    problem: str | None = None
    try:
        values = await read_form(request)
    except FormError as exc:
        problem = str(exc)
    csrf_good = problem is None and csrf_ok(request.cookies.get(CSRF_COOKIE), values, {})
    if problem is not None:
        # The link first: a bad link is reported as such, whatever the body.
        checked = await run_in_threadpool(_link, request, session, token, datetime.now(UTC))
        if isinstance(checked, Response):
            return checked
        return error_response(request, 400, "bad form", [FieldProblem("form", problem)])
    return await run_in_threadpool(_record, request, session, token, values, csrf_good)
