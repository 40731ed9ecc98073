"""Whole-GPU utilization averaged over the interval, from NVML's sample buffer.

The driver records "how much of the last sample period a kernel ran" several times a second into a ring
buffer of about 100 entries (about 16 s at 6 samples a second), and records nothing while the GPU is idle.
So the buffer is read often enough never to lose a sample (`poll`, every few seconds, and at the interval's
end), and each sample counts for the time it covers: one sample period, never the gap before it. Time in the
interval that no sample covers is time the driver saw the GPU idle, and counts as 0 %. Where samples were lost
(the buffer wrapped while the agent was stalled) that time is left out of the mean and counted as an error.

When the interval has no sample at all, the instantaneous rate stands in, labelled `nvml.rate`. Under MIG
neither exists: see the GPM source.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

from ..nvml import Absent, Nvml
from .model import Reading
from .source import ask
from .topology import GpuDevice

MIG_PARENT_REASON = "MIG mode: NVML has no whole-GPU utilization; see the slices"
SAMPLES = "nvml.samples"
RATE = "nvml.rate"
MAX_PERIOD_US = 1_000_000  # NVML: a sample period is between 1/6 s and 1 s, by product
BUFFER_ENTRIES = 100  # about what the buffer holds (mindprince/gonvml bindings.go); a bigger one is learnt
POLL_S = 5.0
"""Longest time between two reads of the buffer: a third of what it holds at 6 samples a second."""


@dataclass(slots=True)
class _Tally:
    """Samples of the current interval: percent x µs they cover, µs they cover, µs lost to a wrapped buffer."""

    busy: float = 0.0
    covered: float = 0.0
    lost: float = 0.0


class UtilizationSource:
    name = "utilization"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self._kind = nvml.lib.NVML_GPU_UTILIZATION_SAMPLES

    def prime(self, gpu: GpuDevice) -> None:
        gpu.memo["util_tally"] = _Tally()
        if gpu.lost or gpu.mig_mode:
            return
        # Start the interval at the newest sample already in the buffer, so the first average is this interval's.
        got = self.nvml.quiet(self.nvml.lib.nvmlDeviceGetSamples, gpu.handle, self._kind, 0)
        if isinstance(got, Absent) and got.reason == "not_found":
            gpu.memo["util_last_ts"] = 0  # an empty buffer: every sample from now on is this interval's
        elif not isinstance(got, Absent) and got[1]:
            stamps = [int(s.timeStamp) for s in got[1]]
            gpu.memo["util_last_ts"] = max(stamps)
            gpu.memo["util_capacity"] = max(BUFFER_ENTRIES, len(stamps))
            _learn_period(gpu, stamps)

    def close(self) -> None:
        pass

    def poll(self, gpu: GpuDevice) -> None:
        """Take the samples that arrived since the last read into the interval's tally."""
        if gpu.lost or gpu.mig_mode or "samples" in gpu.unsupported:
            return
        self._drain(gpu)

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        tally: _Tally = gpu.memo.get("util_tally") or _Tally()
        gpu.memo["util_tally"] = _Tally()
        if gpu.lost:
            gpu.util_reason = gpu.lost
            return
        if gpu.mig_mode:
            gpu.util_reason = MIG_PARENT_REASON
            gpu.memo.pop("util_last_ts", None)
            return
        reading = readings[gpu.uuid]
        if "samples" not in gpu.unsupported:
            tally = self._drain(gpu, tally)
        mean = _mean(tally, elapsed_s * 1e6)
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

    def _drain(self, gpu: GpuDevice, tally: _Tally | None = None) -> _Tally:
        if tally is None:
            tally = gpu.memo.setdefault("util_tally", _Tally())
        nvml = self.nvml
        known = "util_last_ts" in gpu.memo
        last = int(gpu.memo.get("util_last_ts", 0))
        got = nvml.quiet(nvml.lib.nvmlDeviceGetSamples, gpu.handle, self._kind, last)
        if isinstance(got, Absent):
            # "No new samples" is the buffer's normal answer for an idle GPU, not a failure.
            if got.reason != "not_found":
                nvml.errors[f"nvmlDeviceGetSamples:{got.reason}"] += 1
                if got.reason in ("not_supported", "function_not_found"):
                    gpu.unsupported.add("samples")
                elif got.reason == "gpu_lost":
                    gpu.lost = got.reason
            return tally
        fresh = sorted((int(s.timeStamp), int(s.sampleValue.uiVal)) for s in got[1] if int(s.timeStamp) > last)
        if not fresh:
            return tally
        if not known:
            # No baseline yet (the buffer was dry at the start, or MIG mode just ended): what the buffer holds
            # may be older than the interval, so it only marks where the interval's samples begin.
            gpu.memo["util_last_ts"] = fresh[-1][0]
            _learn_period(gpu, [ts for ts, _ in fresh])
            return tally
        if max(v for _, v in fresh) > 100:
            # The documented unit is %; anything else would be a unit this agent does not know.
            nvml.errors["nvmlDeviceGetSamples:out_of_range"] += 1
            gpu.memo["util_last_ts"] = fresh[-1][0]
            tally.lost += fresh[-1][0] - (last or fresh[0][0])
            return tally
        _learn_period(gpu, [ts for ts, _ in fresh])
        capacity = max(int(gpu.memo.get("util_capacity", BUFFER_ENTRIES)), len(fresh))
        gpu.memo["util_capacity"] = capacity
        period: int | None = gpu.memo.get("util_period_us")
        cap = period or MAX_PERIOD_US
        previous = last or None
        if previous is not None and len(fresh) >= 0.95 * capacity and fresh[0][0] - previous > 2 * cap:
            # A full buffer that starts well after the last sample read: it wrapped, samples were lost.
            nvml.errors["nvmlDeviceGetSamples:overrun"] += 1
            tally.lost += fresh[0][0] - previous - cap
            previous = None
        for ts, value in fresh:
            # A sample stands for one period; a longer gap before it is time the driver recorded nothing.
            span = cap if previous is None else min(ts - previous, cap)
            tally.busy += value * span
            tally.covered += span
            previous = ts
        gpu.memo["util_last_ts"] = fresh[-1][0]
        return tally


def _learn_period(gpu: GpuDevice, stamps: list[int]) -> None:
    """The buffer's sample period (µs): the median spacing of back-to-back samples, the smallest seen so far."""
    gaps = [b - a for a, b in itertools.pairwise(stamps) if 0 < b - a <= MAX_PERIOD_US]
    if len(gaps) < 2:
        return
    found = int(statistics.median(gaps))
    known: int | None = gpu.memo.get("util_period_us")
    gpu.memo["util_period_us"] = found if known is None else min(known, found)


def _mean(tally: _Tally, interval_us: float) -> float | None:
    """Percent over the interval's known time: covered time at the samples' values, the rest idle."""
    if tally.covered <= 0:
        return None
    known = max(interval_us - tally.lost, tally.covered)
    return min(100.0, tally.busy / known)
