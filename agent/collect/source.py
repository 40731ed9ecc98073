"""The shape every source of figures has, and the capability memory they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..nvml import Absent, Nvml
from .model import Reading
from .topology import GpuDevice

T = TypeVar("T")

# Answers that mean "this device will never give this figure": stop asking until the layout changes.
PERMANENT = frozenset({"not_supported", "function_not_found"})


class Source(Protocol):
    """One origin of figures (one NVML feature). `prime` sets a baseline at the start of an interval;
    `poll` may be called any number of times during it (to read a buffer before it wraps); `read` fills
    readings at its end and makes the end the next baseline. All handle one GPU (and its slices), so one GPU's
    failure never reaches another."""

    name: str

    def prime(self, gpu: GpuDevice) -> None: ...

    def poll(self, gpu: GpuDevice) -> None: ...

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None: ...

    def close(self) -> None: ...


def ask(
    nvml: Nvml, unsupported: set[str], fn: Callable[..., T], *args: Any, key: str = "", **kwargs: Any
) -> T | Absent:
    """Call `fn` unless this device already said it cannot; remember a permanent "cannot" (counted once)."""
    name = key or getattr(fn, "__name__", "nvml")
    if name in unsupported:
        return Absent("not_supported")
    value = nvml.call(fn, *args, **kwargs)
    if isinstance(value, Absent) and value.reason in PERMANENT:
        unsupported.add(name)
    return value
