"""Links in messages: the base URL (GPUFLEET_PUBLIC_URL, else the address `serve` binds), dashboard pages, and the
signed snooze link, which expires 7 days after its message and is refused when changed in any way."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.alerts import links, snooze
from app.settings import Settings

KEY = b"k" * 32
NOW = datetime(2026, 11, 25, 9, 30, 15, tzinfo=UTC)


def settings(**values: object) -> Settings:
    return Settings.model_validate(
        {"database_url": "postgresql://unused@localhost/unused", "data_dir": Path("/nonexistent"), **values}
    )


def token_of(url: str) -> str:
    assert "/alerts/snooze/" in url
    return url.rsplit("/", 1)[1]


# Where links point -----------------------------------------------------------------------------------------------


def test_the_public_url_wins_and_loses_its_trailing_slash() -> None:
    s = settings(public_url="https://gpufleet.example.com/fleet/", host="0.0.0.0", port=9000)
    assert links.base_url(s) == "https://gpufleet.example.com/fleet"
    assert links.page_url(s, "/instances/i-0abc") == "https://gpufleet.example.com/fleet/instances/i-0abc"
    assert links.snooze_url(s, KEY, 7, now=NOW).startswith("https://gpufleet.example.com/fleet/alerts/snooze/7.")


def test_without_it_the_address_serve_binds() -> None:
    assert links.base_url(settings()) == "http://127.0.0.1:8000"
    assert links.base_url(settings(host="10.1.2.3", port=8443)) == "http://10.1.2.3:8443"
    assert links.base_url(settings(host="::1")) == "http://[::1]:8000"
    assert links.base_url(settings(host="gpufleet.internal")) == "http://gpufleet.internal:8000"
    # A wildcard is no address to send a browser to: the machine's name stands in.
    for wildcard in ("0.0.0.0", "::"):
        assert links.base_url(settings(host=wildcard)) == f"http://{socket.getfqdn()}:8000"


def test_page_url_takes_paths_of_this_dashboard_only() -> None:
    s = settings(public_url="https://gpufleet.example.com")
    assert links.page_url(s, "/waste?group_by=tag:team") == "https://gpufleet.example.com/waste?group_by=tag:team"
    for bad in ("https://elsewhere.example.com/", "//elsewhere.example.com/x", "waste"):
        with pytest.raises(ValueError, match="not a path on the dashboard"):
            links.page_url(s, bad)


@pytest.mark.parametrize(
    "value", ["gpufleet.example.com", "ftp://gpufleet.example.com", "https://", "https://x.example.com/?a=1"]
)
def test_a_public_url_that_is_no_dashboard_address_is_refused_at_start(value: str) -> None:
    with pytest.raises(ValidationError, match="public_url"):
        settings(public_url=value)


def test_a_short_signing_key_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="32 characters or more"):
        settings(alerts_signing_key="too-short-to-be-safe")
    assert settings(alerts_signing_key="  ").alerts_signing_key is None
    assert settings(alerts_signing_key="x" * 32).alerts_signing_key == "x" * 32


def test_the_signing_key_comes_from_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_ALERTS_SIGNING_KEY", " " + "e" * 40 + " ")
    assert settings().alerts_signing_key == "e" * 40


# Tokens ---------------------------------------------------------------------------------------------------------


def test_a_link_names_its_incident_and_expires_seven_days_after_its_message() -> None:
    url = links.snooze_url(settings(), KEY, 42, now=NOW)
    token = token_of(url)
    assert token.startswith(f"42.{int((NOW + timedelta(days=7)).timestamp())}.")
    link = snooze.verify(KEY, token, now=NOW + timedelta(days=6, hours=23))
    assert link == snooze.LinkToken(42, (NOW + timedelta(days=7)).replace(microsecond=0))
    # The same incident and time give the same link: a message sent again carries the one it had.
    assert links.snooze_url(settings(), KEY, 42, now=NOW) == url


def test_an_expired_link_is_refused_saying_when_it_expired() -> None:
    token = snooze.sign(KEY, 42, now=NOW)
    expiry = NOW + snooze.LINK_TTL
    for late in (expiry, expiry + timedelta(seconds=1), expiry + timedelta(days=30)):
        with pytest.raises(snooze.ExpiredLink, match="expired at 2026-12-02 09:30 UTC") as caught:
            snooze.verify(KEY, token, now=late)
        assert caught.value.token.incident_id == 42


def _flip(text: str, at: int) -> str:
    return text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1 :]


def test_a_changed_token_is_refused() -> None:
    token = snooze.sign(KEY, 42, now=NOW)
    _incident, expires, signature = token.split(".")
    later = str(int(expires) + 86400 * 30)
    forged = [
        f"43.{expires}.{signature}",  # another incident
        f"42.{later}.{signature}",  # a longer life
        f"42.{expires}.{_flip(signature, 0)}",
        f"42.{expires}.{_flip(signature, 42)}",
        f"042.{expires}.{signature}",  # the same numbers spelt otherwise
        token + "A",
        token[:-1],
        token.upper(),
    ]
    for bad in forged:
        with pytest.raises(snooze.BadLink):
            snooze.verify(KEY, bad, now=NOW)
    # Signed with another key (a changed GPUFLEET_ALERTS_SIGNING_KEY, a deleted key row).
    with pytest.raises(snooze.BadLink, match="signature"):
        snooze.verify(b"o" * 32, token, now=NOW)
    # A forged token is refused as forged, not as expired: its expiry says nothing.
    with pytest.raises(snooze.BadLink):
        snooze.verify(KEY, f"42.{expires}.{_flip(signature, 3)}", now=NOW + timedelta(days=365))


@pytest.mark.parametrize(
    "junk",
    ["", "x", "42", "42.1", "42.1.", "..", "-1.1." + "A" * 43, "1.1." + "A" * 42, "1.1." + "=" * 43, "1" * 500],
)
def test_junk_is_not_a_link(junk: str) -> None:
    with pytest.raises(snooze.BadLink, match="not a snooze link"):
        snooze.verify(KEY, junk, now=NOW)


def test_an_expiry_past_what_a_date_can_hold_is_refused_not_crashed() -> None:
    expires = 999_999_999_999
    signature = snooze._signature(KEY, 1, expires)
    with pytest.raises(snooze.BadLink):
        snooze.verify(KEY, f"1.{expires}.{signature}", now=NOW)
