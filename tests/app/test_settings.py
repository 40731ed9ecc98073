"""The access-control settings, read from the environment as an operator writes them."""

from __future__ import annotations

from ipaddress import ip_network

import pytest
from pydantic import ValidationError

from app.passwords import hash_password
from app.settings import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.auth == "on" and s.cookie_secure == "auto" and s.session_hours == 12
    assert s.trusted_proxies == [] and s.proxy_user_header == "X-Forwarded-User"
    assert s.admin_password_hash is None


def test_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    stored = hash_password("pw", n=2**10)
    monkeypatch.setenv("GPUFLEET_AUTH", "OFF")
    monkeypatch.setenv("GPUFLEET_TRUSTED_PROXIES", "10.0.0.0/16, 127.0.0.1,::1")
    monkeypatch.setenv("GPUFLEET_PROXY_USER_HEADER", "x-amzn-oidc-identity")
    monkeypatch.setenv("GPUFLEET_ADMIN_PASSWORD_HASH", f" {stored}\n")
    monkeypatch.setenv("GPUFLEET_COOKIE_SECURE", "on")
    s = Settings()
    assert s.auth == "off" and s.cookie_secure == "on"
    assert s.trusted_proxies == [ip_network("10.0.0.0/16"), ip_network("127.0.0.1/32"), ip_network("::1/128")]
    assert s.proxy_user_header == "x-amzn-oidc-identity"
    assert s.admin_password_hash == stored


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("GPUFLEET_AUTH", "maybe", "'on' or 'off'"),
        ("GPUFLEET_TRUSTED_PROXIES", "10.0.0.0/33", "not an IP address or CIDR"),
        ("GPUFLEET_TRUSTED_PROXIES", "proxy.internal", "not an IP address or CIDR"),
        ("GPUFLEET_ADMIN_PASSWORD_HASH", "hunter2", "not a password hash"),
        ("GPUFLEET_PROXY_USER_HEADER", "X User", "letters, digits and dashes"),
        ("GPUFLEET_SESSION_HOURS", "0", "greater than 0"),
    ],
)
def test_bad_values_name_the_problem(monkeypatch: pytest.MonkeyPatch, name: str, value: str, problem: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=problem):
        Settings()
