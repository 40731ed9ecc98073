"""The one door to NVML: every call goes through `Nvml.call`, which turns a failure into `Absent(reason)`.

Nothing here raises inside the collection loop. Failures are counted per "function:reason" so the agent can
report them to the server; a value that the hardware does not have is `Absent`, never a made-up 0.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("gpufleet.agent.nvml")

T = TypeVar("T")

# NVML return codes (nvml.h) and the reason words the agent reports for them.
REASONS: dict[int, str] = {
    1: "uninitialized",
    2: "invalid_argument",
    3: "not_supported",
    4: "no_permission",
    6: "not_found",
    7: "insufficient_size",
    9: "driver_not_loaded",
    10: "timeout",
    12: "library_not_found",
    13: "function_not_found",
    15: "gpu_lost",
    16: "reset_required",
    18: "lib_rm_version_mismatch",
    999: "unknown",
}

_STARTUP_MESSAGES: dict[int, str] = {
    12: "NVML library not found: is the NVIDIA driver installed?",
    9: "NVIDIA kernel driver not loaded: check `lsmod | grep nvidia` and the driver install",
    4: "no permission to open /dev/nvidia*: run the agent as root or grant access to the device nodes",
    18: "NVIDIA driver and library versions differ: reboot after the driver upgrade",
    13: "this NVIDIA driver is too old for the agent's NVML bindings",
}

INIT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Absent:
    """A figure the hardware did not give, and why (`not_supported`, `gpu_lost`, `no_permission`, ...)."""

    reason: str

    def __bool__(self) -> bool:
        return False


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host at all; the message is one readable line."""


def reason_of(exc: BaseException) -> str:
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return REASONS.get(value, f"nvml_error_{value}")
    if type(exc).__name__ == "NVMLLibraryMismatchError":
        return "library_mismatch"
    return "error_" + type(exc).__name__.lower()


def load_library(fake_scenario: str | None = None, *, start: float | None = None) -> Any:
    """The real `pynvml` module, or the fake one loaded with a scenario (tests and demos). The fake runs on the
    wall clock, or on a clock that reads `start` (UTC epoch s) now and runs on from there."""
    if fake_scenario:
        from . import fake_nvml

        if not fake_nvml.is_known(fake_scenario):
            names = ", ".join(sorted(fake_nvml.SCENARIOS))
            raise NvmlUnavailable(f"unknown fake NVML scenario {fake_scenario!r}; known: {names}, report:PATH")
        try:
            # A wall clock, so scenarios with office hours follow the calendar.
            return fake_nvml.load(fake_scenario, clock=time.time if start is None else _clock_from(start))
        except fake_nvml.ReportError as exc:
            raise NvmlUnavailable(str(exc)) from None
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable("the pynvml module is missing: install the nvidia-ml-py package") from None


def _clock_from(start: float) -> Callable[[], float]:
    """A clock that reads `start` now and runs at the wall clock's pace."""
    offset = start - time.time()
    return lambda: time.time() + offset


class Nvml:
    """An initialised NVML library with error accounting.

    `call(fn, *args)` returns fn's result or `Absent(reason)`; `errors` counts failures as "function:reason"
    until `take_errors()` hands them over (once per batch).
    """

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.errors: Counter[str] = Counter()
        self._nvml_error: type[BaseException] = lib.NVMLError
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)
        self._catch: tuple[type[BaseException], ...] = (self._nvml_error,) + ((mismatch,) if mismatch else ())
        self._open = False

    @classmethod
    def open(cls, lib: Any, *, timeout_s: float = INIT_TIMEOUT_S) -> Nvml:
        """Initialise NVML, guarded by a watchdog: some drivers have hung in nvmlInit."""
        nvml = cls(lib)
        outcome: list[BaseException | None] = []

        def init() -> None:
            try:
                lib.nvmlInit()
                outcome.append(None)
            except BaseException as exc:  # handed to the caller's thread below
                outcome.append(exc)

        worker = threading.Thread(target=init, name="nvml-init", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if not outcome:
            raise NvmlUnavailable(f"NVML did not initialise within {timeout_s:g} s: the driver may be hung")
        exc = outcome[0]
        if exc is not None:
            code = getattr(exc, "value", None)
            if isinstance(code, int) and code in _STARTUP_MESSAGES:
                raise NvmlUnavailable(_STARTUP_MESSAGES[code]) from None
            raise NvmlUnavailable(f"NVML failed to start: {reason_of(exc)} ({exc})") from None
        nvml._open = True
        return nvml

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(*self._catch):
                self.lib.nvmlShutdown()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | Absent:
        try:
            return fn(*args, **kwargs)
        except self._catch as exc:
            reason = reason_of(exc)
            self.errors[f"{getattr(fn, '__name__', 'nvml')}:{reason}"] += 1
            return Absent(reason)

    def quiet(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | Absent:
        """Like `call`, but not counted: for probes whose failure is an expected answer (capability checks)."""
        try:
            return fn(*args, **kwargs)
        except self._catch as exc:
            return Absent(reason_of(exc))

    def take_errors(self) -> dict[str, int]:
        counts = dict(self.errors)
        self.errors.clear()
        return counts

    def driver_version(self) -> str | Absent:
        return self.call(self.lib.nvmlSystemGetDriverVersion)

    def cuda_version(self) -> str | Absent:
        value = self.call(self.lib.nvmlSystemGetCudaDriverVersion)
        if isinstance(value, Absent):
            return value
        return f"{value // 1000}.{(value % 1000) // 10}"


def text(value: object) -> str:
    """NVML strings arrive as str from current bindings and as bytes from old ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
