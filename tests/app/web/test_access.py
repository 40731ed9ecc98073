"""Where a browser goes after logging in, and the login page's address."""

from __future__ import annotations

import pytest

from app.web.access import login_url, safe_next


@pytest.mark.parametrize(
    "value",
    ["/", "/waste?group_by=tag:team&window=24h", "/instances/i-0abc", "/mig?x=https://elsewhere", "/%2F%2Fhost"],
)
def test_local_paths_are_kept(value: str) -> None:
    assert safe_next(value) == value


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "https://evil.example/",
        "//evil.example",
        "///evil.example",
        "/\\evil.example",
        "\\/evil.example",
        "javascript:alert(1)",
        "evil.example/path",
        "/\r\nSet-Cookie: x=1",
        "/\t/evil.example",
        "/login",
        "/login?next=/",
        "/logout",
        "/" + "a" * 3000,
    ],
)
def test_anything_else_becomes_the_overview(value: str | None) -> None:
    assert safe_next(value) == "/"


def test_login_url() -> None:
    assert login_url() == "/login"
    assert login_url("/mig?window=6h") == "/login?next=%2Fmig%3Fwindow%3D6h"
    assert login_url("/", expired=True) == "/login?expired=1"
    assert login_url("/waste", expired=False, ended=True) == "/login?next=%2Fwaste&ended=1"
