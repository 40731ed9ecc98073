"""Reading a posted form: url-encoded only, size-limited, first value wins."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from app.web.forms import FormError, read_form


@pytest.fixture(scope="module")
def echo() -> TestClient:
    app = FastAPI()

    @app.post("/")
    async def post(request: Request) -> JSONResponse:
        try:
            return JSONResponse(await read_form(request, limit=256))
        except FormError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    return TestClient(app)


def test_fields(echo: TestClient) -> None:
    r = echo.post("/", content="a=1&b=&a=2&c=%C3%A9+x", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.json() == {"a": "1", "b": "", "c": "é x"}


@pytest.mark.parametrize(
    ("body", "content_type", "problem"),
    [
        ('{"a": 1}', "application/json", "x-www-form-urlencoded"),
        ("a=" + "x" * 300, "application/x-www-form-urlencoded", "larger than 256 bytes"),
        ("&".join(f"f{i}=1" for i in range(40)), "application/x-www-form-urlencoded", "more than 32 fields"),
    ],
)
def test_refused(echo: TestClient, body: str, content_type: str, problem: str) -> None:
    r = echo.post("/", content=body, headers={"Content-Type": content_type})
    assert r.status_code == 400 and problem in r.json()["error"]
