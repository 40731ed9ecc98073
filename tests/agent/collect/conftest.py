from __future__ import annotations

from collections.abc import Callable

import pytest

from agent import fake_nvml
from agent.collect import Collector, Interval
from agent.collect.holders import HolderReader
from agent.config import AgentConfig
from agent.nvml import Nvml
from agent.run import holder_reader


class FakeClock:
    def __init__(self, t: float = 5000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Host:
    """A fake GPU host on a fake clock, with the real collector reading it. Holders are read by `holders`, or
    with `simulated_holders` from the /proc tree the fake writes (as the agent does on a simulated host).
    `start` is the clock's first reading: UTC epoch seconds for scenarios with office hours."""

    def __init__(
        self,
        scenario: str,
        *,
        driver: str | None = None,
        privilege: str | None = None,
        holders: HolderReader | None = None,
        simulated_holders: bool = False,
        start: float = 5000.0,
    ) -> None:
        self.clock = FakeClock(start)
        self.lib = fake_nvml.load(scenario, clock=self.clock, driver=driver, privilege=privilege)
        self.nvml = Nvml.open(self.lib)
        if simulated_holders:
            holders = holder_reader(AgentConfig(), self.lib)
        self.collector = Collector(self.nvml, clock=self.clock, holders=holders)
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
