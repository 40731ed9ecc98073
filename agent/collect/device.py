"""Point-in-time figures read at the end of each interval: memory, processes, temperature, SM clock, ECC.

Memory and processes are read on whole GPUs and on each MIG slice; temperature, clock and ECC describe the
whole board, so they are read on the GPU only.
"""

from __future__ import annotations

from typing import Any

from ..nvml import Absent, Nvml
from .model import Reading
from .source import ask
from .topology import GpuDevice

_MIB = 1024 * 1024


class DeviceSource:
    name = "device"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        lib = nvml.lib
        self._temp_sensor = lib.NVML_TEMPERATURE_GPU
        self._clock_sm = lib.NVML_CLOCK_SM
        self._ecc_args = (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC)

    def prime(self, gpu: GpuDevice) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        if gpu.lost:
            return
        lib, nvml, unsupported = self.nvml.lib, self.nvml, gpu.unsupported
        reading = readings[gpu.uuid]
        reading.mem_used_mib = self._memory_used(gpu.handle, unsupported, "")
        procs = self._processes(gpu.handle, unsupported, "")
        if procs is not None:
            reading.procs, reading.procs_mem_mib = procs

        temp = ask(nvml, unsupported, lib.nvmlDeviceGetTemperatureV, gpu.handle, self._temp_sensor)
        if isinstance(temp, Absent) and "nvmlDeviceGetTemperatureV" in unsupported:
            # Older drivers lack the versioned call; the plain one is deprecated but still there.
            temp = ask(nvml, unsupported, lib.nvmlDeviceGetTemperature, gpu.handle, self._temp_sensor)
        if isinstance(temp, Absent):
            self._mark_lost(gpu, temp)
        else:
            reading.temp_c = int(temp)
        clock = ask(nvml, unsupported, lib.nvmlDeviceGetClockInfo, gpu.handle, self._clock_sm)
        if not isinstance(clock, Absent):
            reading.sm_clock_mhz = int(clock)
        ecc = ask(nvml, unsupported, lib.nvmlDeviceGetTotalEccErrors, gpu.handle, *self._ecc_args)
        if not isinstance(ecc, Absent):
            reading.ecc_uncorrected = int(ecc)

        for s in gpu.slices.values():
            sr = readings[s.uuid]
            sr.mem_used_mib = self._memory_used(s.handle, unsupported, "mig:")
            slice_procs = self._processes(s.handle, unsupported, "mig:")
            if slice_procs is not None:
                sr.procs, sr.procs_mem_mib = slice_procs

    def _memory_used(self, handle: Any, unsupported: set[str], scope: str) -> int | None:
        lib, nvml = self.nvml.lib, self.nvml
        info: Any = Absent("not_supported")
        if f"{scope}memory_v2" not in unsupported:
            info = ask(
                nvml,
                unsupported,
                lib.nvmlDeviceGetMemoryInfo,
                handle,
                version=lib.nvmlMemory_v2,
                key=f"{scope}memory_v2",
            )
        if isinstance(info, Absent) and f"{scope}memory_v2" in unsupported:
            info = ask(nvml, unsupported, lib.nvmlDeviceGetMemoryInfo, handle, key=f"{scope}memory_v1")
        return None if isinstance(info, Absent) else int(info.used) // _MIB

    def _processes(self, handle: Any, unsupported: set[str], scope: str) -> tuple[int, int | None] | None:
        """(compute processes, MiB they hold); the MiB is None when the driver hides per-process memory."""
        lib, nvml = self.nvml.lib, self.nvml
        procs = ask(nvml, unsupported, lib.nvmlDeviceGetComputeRunningProcesses, handle, key=f"{scope}procs")
        if isinstance(procs, Absent) and procs.reason == "library_mismatch":
            fallback = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v2", None)
            if fallback is not None:
                procs = ask(nvml, unsupported, fallback, handle, key=f"{scope}procs_v2")
        if isinstance(procs, Absent):
            return None
        held = [p.usedGpuMemory for p in procs]
        known = [int(b) for b in held if b is not None]
        mem = sum(known) // _MIB if known or not held else None
        return len(procs), mem

    @staticmethod
    def _mark_lost(gpu: GpuDevice, value: Absent) -> None:
        if value.reason == "gpu_lost":
            gpu.lost = "gpu_lost"
