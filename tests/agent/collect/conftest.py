from __future__ import annotations

from collections.abc import Callable

import pytest

from agent import fake_nvml
from agent.collect import Collector, Interval
from agent.nvml import Nvml


class FakeClock:
    def __init__(self, t: float = 5000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Host:
    """A fake GPU host on a fake clock, with the real collector reading it."""

    def __init__(self, scenario: str, *, driver: str | None = None, privilege: str | None = None) -> None:
        self.clock = FakeClock()
        self.lib = fake_nvml.load(scenario, clock=self.clock, driver=driver, privilege=privilege)
        self.nvml = Nvml.open(self.lib)
        self.collector = Collector(self.nvml, clock=self.clock)
        self.started = False

    def interval(self, seconds: float = 10.0, *, poll_s: float = 5.0) -> Interval:
        """One interval of `seconds`, polled every `poll_s` as the service loop does."""
        if not self.started:
            self.collector.start()
            self.started = True
        left = seconds
        while left > poll_s:
            self.clock.advance(poll_s)
            self.collector.poll()
            left -= poll_s
        self.clock.advance(left)
        return self.collector.collect()

    def reading(self, interval: Interval, uuid: str) -> dict[str, object]:
        [r] = [r for r in interval.readings if r.uuid == uuid]
        return r.to_wire()


@pytest.fixture
def host() -> Callable[[str], Host]:
    return Host
