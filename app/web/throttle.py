"""Failed logins per client address: past a limit in a window, the address waits. Kept in each server process."""

from __future__ import annotations

from collections import deque

FAILED_LOGIN_LIMIT = 10
FAILED_LOGIN_WINDOW_S = 900.0
_MAX_ADDRESSES = 10_000


class FailedLogins:
    """At most `limit` failed logins per address in any `window_s` seconds. Used from the event loop only."""

    def __init__(self, limit: int = FAILED_LOGIN_LIMIT, window_s: float = FAILED_LOGIN_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.get(address) or deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def wait_s(self, address: str, *, now: float) -> float:
        """Seconds before `address` may try again; 0 when it may now."""
        times = self._recent(address, now)
        if len(times) < self.limit:
            return 0.0
        return times[-self.limit] + self.window_s - now

    def failed(self, address: str, *, now: float) -> None:
        if address not in self._failures and len(self._failures) >= _MAX_ADDRESSES:
            # Many addresses at once: forget those whose failures are all old, else the one tried longest ago.
            stale = [a for a, t in self._failures.items() if not t or t[-1] <= now - self.window_s]
            for a in stale or [min(self._failures, key=lambda a: self._failures[a][-1])]:
                del self._failures[a]
        times = self._recent(address, now)
        times.append(now)
        self._failures[address] = times

    def clear(self) -> None:
        self._failures.clear()
