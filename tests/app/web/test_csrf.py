"""The CSRF token: one hidden field for every form that changes state, checked in constant time."""

from __future__ import annotations

import pytest
from bs4 import BeautifulSoup
from starlette.requests import Request

from app.web.csrf import CSRF_FIELD, csrf_field, csrf_ok, new_token, use_token, well_formed
from app.web.templating import environment


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})


def test_the_field_carries_the_request_token() -> None:
    request = _request()
    token = new_token()
    use_token(request, token)
    html = environment.from_string('<form method="post">{{ csrf_field(request) }}</form>').render(request=request)
    field = BeautifulSoup(html, "html.parser").select_one(f"input[type=hidden][name={CSRF_FIELD}]")
    assert field is not None and field["value"] == token


def test_a_form_without_a_session_token_is_a_programming_error() -> None:
    with pytest.raises(RuntimeError, match="logged-in session"):
        csrf_field(_request())


def test_check() -> None:
    token = new_token()
    assert well_formed(token) and not well_formed("short") and not well_formed(None)
    assert csrf_ok(token, {CSRF_FIELD: token}, {})
    assert csrf_ok(token, {}, {"X-CSRF-Token": token})
    assert not csrf_ok(token, {CSRF_FIELD: token[:-1]}, {})
    assert not csrf_ok(token, {}, {})
    assert not csrf_ok(None, {CSRF_FIELD: ""}, {})
    assert not csrf_ok("", {CSRF_FIELD: ""}, {})
