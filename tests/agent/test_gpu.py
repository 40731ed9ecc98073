"""On a real NVIDIA GPU: the collector against the real driver. Skipped where NVML does not initialise.

Set GPUFLEET_GPU_REPORT to a path to keep the host's capability report (what `gpufleet-agent doctor --json`
writes: driver, every call's answer per GPU and slice, the sample buffer, GPM, the process-record layout),
plus the layout and readings the agent made. The report replays as a fake NVML scenario (`report:PATH`);
docs/agent.md records the findings.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from agent import capabilities, fake_nvml
from agent.collect import Collector
from agent.nvml import Nvml, load_library

pytestmark = pytest.mark.gpu


def test_the_collector_reads_every_gpu_of_this_host() -> None:
    nvml = Nvml.open(load_library())
    try:
        collector = Collector(nvml)
        collector.start()
        intervals = []
        for _ in range(3):
            time.sleep(2.0)
            intervals.append(collector.collect())
        collector.close()
        last = intervals[-1]
        report: dict[str, Any] = capabilities.report(nvml, last.gpus)
        report["agent_saw"] = {
            "gpus": [g.to_wire() for g in last.gpus],
            "readings": [r.to_wire() for r in last.readings],
            "errors": nvml.take_errors(),
        }
        if os.environ.get("GPUFLEET_GPU_REPORT"):
            with open(os.environ["GPUFLEET_GPU_REPORT"], "w") as f:
                json.dump(report, f, indent=2, default=str)
        assert last.gpus, "NVML initialised but the collector saw no GPU"
        by_uuid = {r.uuid: r for r in last.readings}
        for gpu in last.gpus:
            reading = by_uuid[gpu.uuid]
            assert reading.mem_used_mib is not None and reading.temp_c is not None
            assert reading.power_w is not None and reading.power_w > 0
            if not gpu.mig_mode:
                assert reading.util is not None and reading.util_source in ("nvml.samples", "nvml.rate")
            for s in gpu.slices:
                slice_reading = by_uuid[s.uuid]
                assert (slice_reading.util is None) == (s.util_unavailable_reason is not None)
    finally:
        nvml.close()


def test_this_host_s_capability_report_replays(tmp_path: Any) -> None:
    """The fake, replaying this host's report, answers every call as the driver did."""
    nvml = Nvml.open(load_library())
    try:
        collector = Collector(nvml)
        layout = collector.sample(1.0).gpus
        report = capabilities.report(nvml, layout)
    finally:
        nvml.close()
    path = tmp_path / "host.json"
    path.write_text(json.dumps(report))
    replayed = Nvml.open(fake_nvml.load(f"report:{path}"))
    try:
        again = capabilities.report(replayed, Collector(replayed).sample(1.0).gpus)
    finally:
        replayed.close()
    for real, fake in zip(report["gpus"], again["gpus"], strict=True):
        assert (fake["name"], fake["mig_mode"]) == (real["name"], real["mig_mode"])
        different = {k: (v, fake["calls"].get(k)) for k, v in real["calls"].items() if fake["calls"].get(k) != v}
        # A buffer that held samples on the host may run dry on the replayed (idle-or-steady) GPU, and back.
        different.pop("nvmlDeviceGetSamples", None)
        assert not different, different
