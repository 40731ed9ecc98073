"""Where a utilization figure came from. Stored as a small code per sample; the wire format uses the names."""

from __future__ import annotations

UTIL_SOURCES: dict[str, int] = {
    "none": 0,  # the hardware gave no figure; util is NULL and the device keeps the reason
    "nvml.samples": 1,  # mean of NVML's sample buffer over the interval
    "nvml.rate": 2,  # NVML's instantaneous rate, used when the buffer was empty
    "nvml.gpm": 3,  # GPU Performance Monitoring counters (Hopper and newer)
    "dcgm": 4,  # DCGM profiling fields
}
SOURCE_NAMES: dict[int, str] = {code: name for name, code in UTIL_SOURCES.items()}
