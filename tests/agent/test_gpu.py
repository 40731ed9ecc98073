"""On a real NVIDIA GPU: the collector against the real driver. Skipped where NVML does not initialise.

Set GPUFLEET_GPU_REPORT to a path to keep what was seen (names, which calls worked, GPM values, the raw
sample-buffer values) as JSON; docs/agent.md records the findings.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from agent.collect import Collector
from agent.nvml import Absent, Nvml, load_library

pytestmark = pytest.mark.gpu


def _raw_probe(nvml: Nvml) -> list[dict[str, Any]]:
    lib = nvml.lib
    seen = []
    for index in range(lib.nvmlDeviceGetCount()):
        h = lib.nvmlDeviceGetHandleByIndex(index)
        probe: dict[str, Any] = {"index": index, "name": str(lib.nvmlDeviceGetName(h))}
        samples = nvml.quiet(lib.nvmlDeviceGetSamples, h, lib.NVML_GPU_UTILIZATION_SAMPLES, 0)
        if isinstance(samples, Absent):
            probe["samples"] = samples.reason
        else:
            values = [int(s.sampleValue.uiVal) for s in samples[1]]
            stamps = [int(s.timeStamp) for s in samples[1]]
            probe["samples"] = {
                "count": len(values),
                "min": min(values, default=None),
                "max": max(values, default=None),
                "span_us": (max(stamps) - min(stamps)) if stamps else None,
                "newest_minus_epoch_us": (max(stamps) - int(time.time() * 1e6)) if stamps else None,
            }
        for call, args in {
            "rates": (lib.nvmlDeviceGetUtilizationRates, (h,)),
            "energy_mJ": (lib.nvmlDeviceGetTotalEnergyConsumption, (h,)),
            "power_mW": (lib.nvmlDeviceGetPowerUsage, (h,)),
            "mig_mode": (lib.nvmlDeviceGetMigMode, (h,)),
            "gpm_support": (lib.nvmlGpmQueryDeviceSupport, (h,)),
            "memory_v2": (lib.nvmlDeviceGetMemoryInfo, (h,)),
        }.items():
            fn, fn_args = args
            value = nvml.quiet(fn, *fn_args)
            probe[call] = value.reason if isinstance(value, Absent) else "ok"
        seen.append(probe)
    return seen


def test_the_collector_reads_every_gpu_of_this_host() -> None:
    nvml = Nvml.open(load_library())
    try:
        report: dict[str, Any] = {"driver": nvml.driver_version(), "cuda": nvml.cuda_version()}
        report["probe"] = _raw_probe(nvml)
        collector = Collector(nvml)
        collector.start()
        intervals = []
        for _ in range(3):
            time.sleep(2.0)
            intervals.append(collector.collect())
        collector.close()
        last = intervals[-1]
        report["gpus"] = [g.to_wire() for g in last.gpus]
        report["readings"] = [r.to_wire() for r in last.readings]
        report["errors"] = nvml.take_errors()
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
