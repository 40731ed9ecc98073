"""Process lists, down to the C entry points and the record layout each driver writes.

`_nvmlGetFunctionPointer` hands out the process-list entry points as C functions (ctypes callbacks) with the C
signature `nvmlReturn_t fn(nvmlDevice_t, unsigned int *infoCount, nvmlProcessInfo_t *infos)`. Each writes its
records in the layout the simulated driver uses (`hardware.Driver`): 16-byte v1 records for the unversioned
symbol (nvml.h's nvmlProcessInfo_v1_t; nvitop reads it so on drivers without `_v2`), 24-byte v2 records for
`_v2`, and for `_v3` whatever that driver build writes, 32 bytes on 535.43 to 535.86. The Python-level
functions behave as nvidia-ml-py's wrappers do: they read the records through the installed binding's own
struct, so a binding whose record size differs from the driver's misreads them, as on real hosts
(XuehaiPan/nvitop#75).

`proc_tree` writes the processes' /proc entries (`procfs`), so the agent can say who they are.
"""

from __future__ import annotations

import ctypes
import shutil
import struct
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .controls import Controls
from .core import error, nv
from .model import Gpu, MigDevice, running
from .procfs import ProcTree, write_tree

NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long: usedGpuMemory unknown

# pid, 4 bytes of padding, usedGpuMemory, then gpuInstanceId and computeInstanceId (v2) and
# usedGpuCcProtectedMemory (v3 of 535.43-535.86), native alignment as the C structs have (nvml.h).
RECORDS = {16: struct.Struct("=I4xQ"), 24: struct.Struct("=I4xQII"), 32: struct.Struct("=I4xQIIQ")}
_ARITY = {16: 2, 24: 4, 32: 5}

_PROCESS_LIST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p)
_STUB = ctypes.CFUNCTYPE(ctypes.c_int)
PROCESS_SYMBOLS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
)


class ProcessCalls(Controls):
    """Compute-process lists of GPUs and MIG devices."""

    _entry_points: dict[str, Any]

    def proc_tree(self, root: Path | None = None) -> ProcTree:
        """Write the /proc entries of every scenario process (running now or not) and kubelet's pod folders
        under `root`, by default a temporary folder of this library's own, removed with it; call again after
        adding processes. Processes added by tests (`add_process`) have none: to the agent they have exited.
        Start times count from the epoch when the clock reads UTC epoch seconds, else from now."""
        if root is None:
            root = self.__dict__.get("_proc_root")
            if root is None:
                root = Path(tempfile.mkdtemp(prefix="gpufleet-fake-proc-"))
                weakref.finalize(self, shutil.rmtree, root, True)
                self.__dict__["_proc_root"] = root
        wall = self.epoch if self.epoch > 1e9 else time.time()
        return write_tree(root, (p for g in self._gpus for p in g.procs), wall)

    def record_bytes(self, symbol: str) -> int | None:
        """Bytes per record that `symbol` writes on this driver; None when the driver does not export it."""
        if symbol == "nvmlDeviceGetComputeRunningProcesses":
            return 16
        if symbol == "nvmlDeviceGetComputeRunningProcesses_v2":
            return 24
        if symbol == "nvmlDeviceGetComputeRunningProcesses_v3":
            return self.driver.v3_record_bytes
        return None

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """A C entry point of the simulated library, as pynvml's lookup gives it; FunctionNotFound for a symbol
        the simulated driver does not export. Only the process lists (and two symbols that tell driver builds
        apart) are exported at this level."""
        self.calls["_nvmlGetFunctionPointer"] += 1
        if not self._loaded:
            raise error(nv.NVML_ERROR_UNINITIALIZED)
        cache = self.__dict__.setdefault("_entry_points", {})
        if name in cache:
            return cache[name]
        stride = self.record_bytes(name) if name in PROCESS_SYMBOLS else None
        if stride is not None:
            fn: Any = _PROCESS_LIST(self._entry(name, stride))
        elif (name == "nvmlDeviceGetRunningProcessDetailList" and self.driver.detail_list) or (
            name == "nvmlDeviceGetConfComputeMemSizeInfo" and self.driver.conf_compute
        ):
            fn = _STUB(lambda: int(nv.NVML_ERROR_NOT_SUPPORTED))
        else:
            raise error(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        cache[name] = fn
        return fn

    def _entry(self, name: str, stride: int) -> Callable[[int | None, Any, int | None], int]:
        def entry(device: int | None, count: Any, infos: int | None) -> int:
            # A C function returns its error; nothing may raise through ctypes.
            try:
                node = self._node_at(name, device)
                self._aggregate(node)
            except nv.NVMLError as exc:
                return int(exc.value)
            if not count:
                return int(nv.NVML_ERROR_INVALID_ARGUMENT)
            return self._write(node, stride, count, infos)

        return entry

    def _write(self, node: Gpu | MigDevice, stride: int, count: Any, infos: int | None) -> int:
        """Fill `infos` with one record per process if `*count` leaves room; else say how many there are."""
        procs = running(node, self._now())
        room = count[0]
        count[0] = len(procs)
        if not procs:
            return int(nv.NVML_SUCCESS)
        if infos is None or room < len(procs):
            return int(nv.NVML_ERROR_INSUFFICIENT_SIZE)
        pack, arity = RECORDS[stride].pack, _ARITY[stride]
        packed = b"".join(pack(*(p.pid, p.used_bytes, p.gi_id, p.ci_id, 0)[:arity]) for p in procs)
        ctypes.memmove(infos, packed, len(packed))
        return int(nv.NVML_SUCCESS)

    def _binding_list(self, symbol: str, record: Any, handle: Any) -> list[Any]:
        """What nvidia-ml-py's wrapper of `symbol` does: ask for the count, then read `count * 2 + 5` records of
        the binding's struct `record`, whatever size the driver wrote."""
        stride = self.record_bytes(symbol)
        node = self._node(symbol, handle)
        self._aggregate(node)
        if stride is None:
            raise error(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        count = ctypes.c_uint(0)
        ret = self._write(node, stride, ctypes.pointer(count), None)
        if ret == nv.NVML_SUCCESS:
            return []
        if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            raise error(ret)
        count.value = count.value * 2 + 5
        records = (record * count.value)()
        ret = self._write(node, stride, ctypes.pointer(count), ctypes.addressof(records))
        if ret != nv.NVML_SUCCESS:
            raise error(ret)
        out = []
        for i in range(count.value):
            obj = nv.nvmlStructToFriendlyObject(records[i])
            if obj.usedGpuMemory == NOT_AVAILABLE:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._binding_list("nvmlDeviceGetComputeRunningProcesses_v3", nv.c_nvmlProcessInfo_v3_t, handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._binding_list("nvmlDeviceGetComputeRunningProcesses_v2", nv.c_nvmlProcessInfo_v2_t, handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """The binding's unversioned call goes to `_v3`; a driver without it raises NVMLLibraryMismatchError."""
        self._node("nvmlDeviceGetComputeRunningProcesses", handle)
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        except nv.NVMLError_FunctionNotFound:
            raise nv.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            ) from None
