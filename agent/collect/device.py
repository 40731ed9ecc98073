"""Point-in-time figures read at the end of each interval: memory, processes, temperature, SM clock, ECC.

Memory and processes are read on whole GPUs and on each MIG slice; temperature, clock and ECC describe the
whole board, so they are read on the GPU only. A figure NVML refuses for lack of privilege is recorded on the
GPU with what to grant, so the dashboard can say so.

With a `HolderReader`, each process is also described from /proc: on a whole GPU, and on each MIG slice. A
MIG-mode GPU's own list is the sum of its slices' lists, so its processes are described on the slices only.
"""

from __future__ import annotations

import operator
from typing import Any

from ..nvml import Absent, Nvml
from .holders import SAMPLE_HOLDERS, Holder, HolderReader, Vouched
from .model import Reading
from .privilege import DEVICE_ACCESS, MIG_MONITOR
from .processes import ProcessReader, ProcessRecord
from .source import PERMANENT, ask
from .topology import GpuDevice

_MIB = 1024 * 1024
_MEMORY_KEYS = {scope: (f"{scope}memory_v2", f"{scope}memory_v1") for scope in ("", "mig:")}


class DeviceSource:
    name = "device"

    def __init__(self, nvml: Nvml, holders: HolderReader | None = None) -> None:
        self.nvml = nvml
        self.holders = holders
        lib = nvml.lib
        self._temp_sensor = lib.NVML_TEMPERATURE_GPU
        self._clock_sm = lib.NVML_CLOCK_SM
        self._ecc_args = (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC)
        self._memory_v2 = lib.nvmlMemory_v2
        self.processes = ProcessReader(nvml)

    def poll(self, gpu: GpuDevice) -> None:
        pass

    def prime(self, gpu: GpuDevice) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        if gpu.lost:
            return
        lib, nvml, unsupported = self.nvml.lib, self.nvml, gpu.unsupported
        reading = readings[gpu.uuid]
        # A MIG-mode GPU's own memory and processes are aggregates over its slices: the MIG monitor right.
        grant = MIG_MONITOR if gpu.mig_mode else DEVICE_ACCESS
        reading.mem_used_mib = self._memory_used(gpu, gpu.handle, "", "mem_used_mib", grant)
        procs = self._processes(gpu, gpu.handle, "", "procs", grant)
        if procs is not None:
            reading.procs, reading.procs_mem_mib = _counts(procs)
            if not gpu.mig_mode:
                reading.holders = self._holders(gpu.memo, procs)

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
            sr.mem_used_mib = self._memory_used(gpu, s.handle, "mig:", "slice_memory", DEVICE_ACCESS)
            slice_procs = self._processes(gpu, s.handle, "mig:", "slice_procs", DEVICE_ACCESS)
            if slice_procs is not None:
                sr.procs, sr.procs_mem_mib = _counts(slice_procs)
                sr.holders = self._holders(s.memo, slice_procs)

    def _memory_used(self, gpu: GpuDevice, handle: Any, scope: str, figure: str, grant: str) -> int | None:
        lib, nvml, unsupported = self.nvml.lib, self.nvml, gpu.unsupported
        v2, v1 = _MEMORY_KEYS[scope]
        info: Any = Absent("not_supported")
        if v2 not in unsupported:
            info = ask(nvml, unsupported, lib.nvmlDeviceGetMemoryInfo, handle, version=self._memory_v2, key=v2)
        if isinstance(info, Absent) and v2 in unsupported:
            info = ask(nvml, unsupported, lib.nvmlDeviceGetMemoryInfo, handle, key=v1)
        if isinstance(info, Absent):
            if info.reason == "no_permission":
                gpu.deny(figure, "nvmlDeviceGetMemoryInfo", grant)
            return None
        return int(info.used) // _MIB

    def _processes(
        self, gpu: GpuDevice, handle: Any, scope: str, figure: str, grant: str
    ) -> list[ProcessRecord] | None:
        """The compute processes on `handle`; None when NVML did not list them."""
        if f"{scope}procs" in gpu.unsupported:
            return None
        procs = self.processes.read(handle)
        if isinstance(procs, Absent):
            if procs.reason in PERMANENT:
                gpu.unsupported.add(f"{scope}procs")
            elif procs.reason == "no_permission":
                gpu.deny(figure, self.processes.symbol or "nvmlDeviceGetComputeRunningProcesses", grant)
            return None
        return procs

    def _holders(self, memo: dict[str, Any], procs: list[ProcessRecord]) -> tuple[Holder, ...]:
        """Who the processes are, most memory first, at most `SAMPLE_HOLDERS`; those left over are counted as
        `holders:truncated`. A process that has exited since NVML listed it is none. The same holders as the
        device's last interval (the same objects: no process came, went or changed its memory) are the same
        tuple, which lets the batch reuse that tuple's references (`batch.HolderTable.refs`)."""
        if self.holders is None or not procs:
            memo.pop("holders", None)
            return ()
        last: tuple[list[ProcessRecord], tuple[Holder, ...], Vouched | None] | None = memo.get("holders")
        # The same records as last interval (the process reader gives an unchanged record as the same object, which
        # the comparison finds at once), all of them described and none due for a check: the same holders, without
        # sorting or looking up.
        if last is not None and last[2] is not None and last[0] == procs and self.holders.keep(last[2]):
            return last[1]
        # Sorted before reading /proc, so a crowded device costs reads of the kept processes only.
        ordered = sorted(procs, key=_by_memory)
        found: list[Holder] = []
        for i, record in enumerate(ordered):
            if len(found) == SAMPLE_HOLDERS:
                self.nvml.errors["holders:truncated"] += len(ordered) - i
                break
            holder = self.holders.read(record.pid, record.used_mib)
            if holder is not None:
                found.append(holder)
        held = tuple(found)
        if last is not None and len(last[1]) == len(held) and all(map(operator.is_, last[1], held)):
            held = last[1]
        # Kept next time only if every process listed was described: one that exited is read again.
        memo["holders"] = (procs, held, self.holders.vouch(held) if len(held) == len(procs) else None)
        return held

    @staticmethod
    def _mark_lost(gpu: GpuDevice, value: Absent) -> None:
        if value.reason == "gpu_lost":
            gpu.lost = "gpu_lost"


def _by_memory(p: ProcessRecord) -> tuple[bool, int, int]:
    return (p.used_mib is None, -(p.used_mib or 0), p.pid)


def _counts(procs: list[ProcessRecord]) -> tuple[int, int | None]:
    """(compute processes, MiB they hold); the MiB is None when the driver hides per-process memory."""
    known = [p.used_mib for p in procs if p.used_mib is not None]
    return len(procs), sum(known) if len(known) == len(procs) else None
