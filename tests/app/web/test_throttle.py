"""Failed logins per address: a limit per window, then a wait until the oldest failure leaves the window."""

from __future__ import annotations

import pytest

import app.web.throttle as throttle
from app.web.throttle import FailedLogins


def test_past_the_limit_an_address_waits_for_the_window() -> None:
    limiter = FailedLogins(limit=3, window_s=60.0)
    for t in (0.0, 10.0, 20.0):
        assert limiter.wait_s("10.0.0.1", now=t) == 0
        limiter.failed("10.0.0.1", now=t)
    assert limiter.wait_s("10.0.0.1", now=30.0) == 30.0  # until the failure at 0 s is 60 s old
    assert limiter.wait_s("10.0.0.2", now=30.0) == 0  # another address is not held up
    assert limiter.wait_s("10.0.0.1", now=60.0) == 0
    limiter.failed("10.0.0.1", now=61.0)
    assert limiter.wait_s("10.0.0.1", now=62.0) == 8.0  # failures at 10, 20 and 61: wait for 10 to age out


def test_memory_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "_MAX_ADDRESSES", 5)
    limiter = FailedLogins(limit=2, window_s=60.0)
    for i in range(20):
        limiter.failed(f"10.0.0.{i}", now=float(i))
    assert len(limiter._failures) <= 5
    assert limiter.wait_s("10.0.0.19", now=20.0) == 0
