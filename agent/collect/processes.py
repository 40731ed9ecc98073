"""Compute-process lists read from NVML's C entry point, in the record layout this driver actually writes.

nvidia-ml-py reads `nvmlDeviceGetComputeRunningProcesses_v3` records with one fixed struct, but drivers have
written three sizes under that name: 24 bytes from 510.39, 32 bytes (with usedGpuCcProtectedMemory) on 535.43
to 535.86, 24 again from 535.104 (XuehaiPan/nvitop#75, #88, PR #94; the NVML headers of CUDA 12.2.0 and
12.2.2), and a container on 550.127.08 was seen writing 16 (nvitop PR #226). A wrong size misreads every record
after the first: PIDs of 0 or 4294967295, memory in the wrong field. So the agent calls the C function itself,
into a buffer filled with a marker byte, and learns the record size from how many bytes the driver wrote for
the records it says it returned. Drivers without `_v3` (470, 535.98) get `_v2` (24-byte records), and
older ones the unversioned call (16-byte records).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..nvml import Absent, Nvml, reason_of

SYMBOLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_LAYOUTS = {16: struct.Struct("=I4xQ"), 24: struct.Struct("=I4xQII"), 32: struct.Struct("=I4xQIIQ")}
_WIDEST = 32
_MARK = 0xA5  # no record ends in this byte: the last field is an id or a size, whose top byte is 0x00 or 0xFF
_NOT_AVAILABLE = (1 << 64) - 1
_NO_ID = 0xFFFFFFFF
_PID_MAX = 1 << 22  # Linux's largest pid_max
_SUCCESS, _INSUFFICIENT_SIZE = 0, 7
_KEPT_RECORDS = 4096  # records remembered for reuse; more are forgotten all at once


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One compute process on a GPU or MIG device: host PID, memory it holds (MiB, None where the driver hides
    it), and its GPU and compute instance ids (None outside MIG)."""

    pid: int
    used_mib: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


class ProcessReader:
    """Reads process lists; the entry point and the record size are found on first use and kept."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.symbol: str | None = None
        self.record_bytes: int | None = None
        self._fn: Callable[..., int] | None = None
        self._room = 0
        self._buffer: Any = None
        self._records: dict[tuple[int, ...], ProcessRecord] = {}

    def read(self, handle: Any) -> list[ProcessRecord] | Absent:
        """The processes on `handle`, or why not (counted under the C function's name)."""
        fn = self._entry_point()
        if isinstance(fn, Absent):
            return fn
        assert self.symbol is not None
        # One call into a buffer with room for the most processes seen so far; only a device with more needs
        # a second, with room for twice what it said (processes may start between the two calls).
        count = ctypes.c_uint(self._room)
        ret = int(fn(handle, ctypes.byref(count), self._fill()))
        if ret == _INSUFFICIENT_SIZE:
            self._room = count.value * 2 + 5
            self._buffer = None
            count.value = self._room
            ret = int(fn(handle, ctypes.byref(count), self._fill()))
        if ret != _SUCCESS:
            return self._failed(ret)
        n = count.value
        if n == 0:
            return []
        size = self.record_bytes or self._learn(bytes(self._buffer), n)
        if size is None:
            return self._failed(None, "layout_unknown")
        records = self._unpack(_LAYOUTS[size], ctypes.string_at(self._buffer, n * size))
        if any(not 0 < r.pid <= _PID_MAX for r in records):
            return self._failed(None, "implausible_pid")
        return records

    def _fill(self) -> Any:
        """The buffer for `_room` records (None while there is no room), filled with the marker until the record
        size is known."""
        if not self._room:
            return None
        if self._buffer is None:
            self._buffer = (ctypes.c_ubyte * (self._room * _WIDEST))()
        if self.record_bytes is None:
            ctypes.memset(self._buffer, _MARK, self._room * _WIDEST)
        return self._buffer

    def _unpack(self, layout: struct.Struct, raw: bytes) -> list[ProcessRecord]:
        """The records in `raw`; a record seen before (same process, memory and place) is the same object."""
        known = self._records
        if len(known) > _KEPT_RECORDS:
            known.clear()
        records = []
        for fields in layout.iter_unpack(raw):
            record = known.get(fields)
            if record is None:
                record = known[fields] = _record(fields)
            records.append(record)
        return records

    def _entry_point(self) -> Callable[..., int] | Absent:
        if self._fn is not None:
            return self._fn
        lookup = getattr(self.nvml.lib, "_nvmlGetFunctionPointer", None)
        if lookup is None:
            return Absent("function_not_found")
        for symbol in SYMBOLS:
            found = self.nvml.quiet(lookup, symbol)
            if not isinstance(found, Absent):
                fn: Callable[..., int] = found
                self._fn, self.symbol = fn, symbol
                return fn
        self.nvml.errors[f"{SYMBOLS[0]}:function_not_found"] += 1
        return Absent("function_not_found")

    def _learn(self, raw: bytes, n: int) -> int | None:
        """The record size from where the driver stopped writing: n records of that size end exactly there."""
        written = len(raw.rstrip(bytes([_MARK])))
        for size in _LAYOUTS:
            if size * n == written:
                self.record_bytes = size
                return size
        return None

    def _failed(self, ret: int | None, reason: str | None = None) -> Absent:
        if reason is None:
            error: Any = getattr(self.nvml.lib, "NVMLError", None)
            reason = reason_of(error(ret)) if error is not None and ret is not None else f"nvml_error_{ret}"
        self.nvml.errors[f"{self.symbol}:{reason}"] += 1
        return Absent(reason)


def _record(fields: tuple[int, ...]) -> ProcessRecord:
    used = fields[1]
    gi = fields[2] if len(fields) > 2 and fields[2] != _NO_ID else None
    ci = fields[3] if len(fields) > 3 and fields[3] != _NO_ID else None
    return ProcessRecord(fields[0], None if used == _NOT_AVAILABLE else used // (1024 * 1024), gi, ci)
