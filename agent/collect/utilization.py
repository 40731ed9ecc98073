"""Whole-GPU utilization averaged over the interval, from NVML's sample buffer.

The driver samples "a kernel was running" several times a second into a ring buffer. Reading the buffer
from the last timestamp seen gives every sample of the interval, so a 10 s interval is a true 10 s average,
not one instantaneous value. When the buffer has nothing new (the driver stops sampling an idle GPU) the
instantaneous rate stands in, labelled `nvml.rate`. Under MIG neither exists: see the GPM source.
"""

from __future__ import annotations

from ..nvml import Absent, Nvml
from .model import Reading
from .source import ask
from .topology import GpuDevice

MIG_PARENT_REASON = "MIG mode: NVML has no whole-GPU utilization; see the slices"
SAMPLES = "nvml.samples"
RATE = "nvml.rate"


class UtilizationSource:
    name = "utilization"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self._kind = nvml.lib.NVML_GPU_UTILIZATION_SAMPLES

    def prime(self, gpu: GpuDevice) -> None:
        if gpu.lost or gpu.mig_mode:
            return
        # Start the interval at the newest sample already in the buffer, so the first average is this interval's.
        got = self.nvml.quiet(self.nvml.lib.nvmlDeviceGetSamples, gpu.handle, self._kind, 0)
        if not isinstance(got, Absent) and got[1]:
            gpu.memo["util_last_ts"] = max(int(s.timeStamp) for s in got[1])

    def close(self) -> None:
        pass

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        if gpu.lost:
            gpu.util_reason = gpu.lost
            return
        if gpu.mig_mode:
            gpu.util_reason = MIG_PARENT_REASON
            gpu.memo.pop("util_last_ts", None)
            return
        reading = readings[gpu.uuid]
        mean = self._buffer_mean(gpu)
        if mean is not None:
            reading.util, reading.util_source = mean, SAMPLES
            gpu.util_reason = None
            return
        rate = ask(self.nvml, gpu.unsupported, self.nvml.lib.nvmlDeviceGetUtilizationRates, gpu.handle)
        if isinstance(rate, Absent):
            if rate.reason == "gpu_lost":
                gpu.lost = rate.reason
            gpu.util_reason = f"utilization: {rate.reason}"
            return
        reading.util, reading.util_source = float(min(100, max(0, int(rate.gpu)))), RATE
        gpu.util_reason = None

    def _buffer_mean(self, gpu: GpuDevice) -> float | None:
        nvml = self.nvml
        last = int(gpu.memo.get("util_last_ts", 0))
        if "samples" in gpu.unsupported:
            return None
        got = nvml.quiet(nvml.lib.nvmlDeviceGetSamples, gpu.handle, self._kind, last)
        if isinstance(got, Absent):
            # "No new samples" is the buffer's normal answer for an idle GPU, not a failure.
            if got.reason != "not_found":
                nvml.errors[f"nvmlDeviceGetSamples:{got.reason}"] += 1
                if got.reason in ("not_supported", "function_not_found"):
                    gpu.unsupported.add("samples")
                elif got.reason == "gpu_lost":
                    gpu.lost = got.reason
            return None
        fresh = [s for s in got[1] if int(s.timeStamp) > last]
        if not fresh:
            return None
        gpu.memo["util_last_ts"] = max(int(s.timeStamp) for s in fresh)
        values = [int(s.sampleValue.uiVal) for s in fresh]
        if max(values) > 100:
            # The documented unit is %; anything else would be a unit this agent does not know.
            nvml.errors["nvmlDeviceGetSamples:out_of_range"] += 1
            return None
        return sum(values) / len(values)
