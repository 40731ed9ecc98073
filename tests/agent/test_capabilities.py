"""The capability report (`gpufleet-agent doctor --json`) against the fake NVML."""

from __future__ import annotations

from agent import capabilities, fake_nvml
from agent.collect import Collector
from agent.nvml import Nvml


def test_an_idle_gpu_s_empty_sample_buffer_is_an_answer_not_a_refusal() -> None:
    """An idle GPU records no sample, so NVML answers NOT_FOUND for its buffer: the call worked."""
    clock = [1000.0]
    # g5-forgotten: the job ended 102 h before the epoch, so the buffer has been empty ever since.
    nvml = Nvml.open(fake_nvml.load("g5-forgotten", clock=lambda: clock[0]))
    try:
        report = capabilities.report(nvml, Collector(nvml).sample(1.0).gpus)
    finally:
        nvml.close()
    gpu = report["gpus"][0]
    assert gpu["calls"]["nvmlDeviceGetSamples"] == "ok"
    assert gpu["samples"]["count"] == 0 and gpu["samples"]["mean"] is None
    # An A10G has neither MIG nor GPM; nothing else is refused.
    assert {k for k, v in gpu["calls"].items() if v != "ok"} == {"nvmlDeviceGetMigMode", "nvmlGpmQueryDeviceSupport"}
