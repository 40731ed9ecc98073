from __future__ import annotations


class Clock:
    """A clock the test sets: seconds, as `time.monotonic` gives them."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
