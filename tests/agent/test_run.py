from __future__ import annotations

import gzip
import itertools
import json
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from agent import fake_nvml
from agent.collect import Collector
from agent.config import AgentConfig
from agent.identify import IdentityResolver
from agent.nvml import Nvml
from agent.run import Agent


def test_the_loop_keeps_its_cadence_when_collection_is_slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    interval_s = 0.1
    real_collect = Collector.collect

    def slow_collect(self: Collector) -> object:
        time.sleep(0.04)  # 40 % of the interval spent collecting
        return real_collect(self)

    monkeypatch.setattr(Collector, "collect", slow_collect)
    config = AgentConfig(state_dir=tmp_path, interval_s=interval_s, batch_intervals=1000, imds="off", host_id="h")
    agent = Agent(config, Nvml.open(fake_nvml.load("p5")), IdentityResolver(config))
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,))
    started = time.monotonic()
    worker.start()
    time.sleep(2.05)
    stop.set()
    worker.join(10)
    elapsed = time.monotonic() - started
    # A loop that slept a full interval after each collection would manage about 2.05 / 0.14 = 14.
    assert agent.intervals >= int(elapsed / interval_s) - 3
    assert agent.skipped_ticks == 0
    [sealed] = agent.spool.pending()  # the open batch was sealed on stop
    body = agent.spool.read(sealed)
    assert body is not None
    intervals = json.loads(gzip.decompress(body))["intervals"]
    starts = [datetime.fromisoformat(i["start"]) for i in intervals]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert all(abs(g - d["duration_s"]) < 0.002 for g, d in zip(gaps, intervals, strict=False)), "back to back"
    assert sum(gaps) / len(gaps) == pytest.approx(interval_s, abs=0.01)
