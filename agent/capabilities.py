"""A capability report: what this host's driver answers to every NVML call the agent makes, per GPU and slice.

`gpufleet-agent doctor --json` writes it. It records the driver, NVML and binding versions, the agent's
privilege, the process-record layout the driver writes, and per GPU: name, MIG mode, the answer of each call
("ok" or the NVML error's reason word), the sample buffer's length and spacing, GPM support, and the units
seen. The fake NVML replays such a report as a scenario (`--fake-nvml report:PATH`), so a report from a real
host becomes a regression test. Nothing here changes the GPU.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import __version__
from .collect.model import GpuInfo
from .collect.privilege import GRANTS, held
from .collect.processes import ProcessReader
from .nvml import Absent, Nvml, text

FORMAT = "gpufleet-capability-report"
VERSION = 1
_MIB = 1024 * 1024


def report(nvml: Nvml, layout: tuple[GpuInfo, ...], *, simulated: str | None = None) -> dict[str, Any]:
    """The report for this host; `layout` is what the collector made of it (for what the agent would send)."""
    lib = nvml.lib
    driver, cuda = nvml.driver_version(), nvml.cuda_version()
    version = nvml.quiet(lib.nvmlSystemGetNVMLVersion)
    reader = ProcessReader(nvml)
    gpus = []
    count = nvml.quiet(lib.nvmlDeviceGetCount)
    for index in range(0 if isinstance(count, Absent) else int(count)):
        handle = nvml.quiet(lib.nvmlDeviceGetHandleByIndex, index)
        if not isinstance(handle, Absent):
            gpus.append(_gpu(nvml, reader, index, handle))
    grants = [
        {"gpu": g.index, "figure": d.figure, "call": d.call, "grant": d.grant, "text": GRANTS.get(d.grant, d.grant)}
        for g in layout
        for d in g.permission_denied
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "agent_version": __version__,
        "bindings": _bindings_version(),
        "driver": _answer(driver, str),
        "nvml": _answer(version, text),
        "cuda": _answer(cuda, str),
        "privilege": {"simulated": simulated} if simulated else held().to_wire(),
        "process_records": {"symbol": reader.symbol, "record_bytes": reader.record_bytes},
        "gpus": gpus,
        "grants": grants,
    }


def _gpu(nvml: Nvml, reader: ProcessReader, index: int, handle: Any) -> dict[str, Any]:
    lib = nvml.lib
    calls: dict[str, str] = {}
    ask = _asker(nvml, calls)
    name = ask("nvmlDeviceGetName", handle)
    uuid = ask("nvmlDeviceGetUUID", handle)
    pci = ask("nvmlDeviceGetPciInfo", handle)
    arch = ask("nvmlDeviceGetArchitecture", handle)
    memory = ask("nvmlDeviceGetMemoryInfo", handle, version=lib.nvmlMemory_v2)
    _processes(reader, handle, calls)
    ask("nvmlDeviceGetUtilizationRates", handle)
    samples = ask("nvmlDeviceGetSamples", handle, lib.NVML_GPU_UTILIZATION_SAMPLES, 0)
    if isinstance(samples, Absent) and samples.reason == "not_found":
        # NVML's answer for an empty buffer (an idle GPU records no sample), not a refusal.
        calls["nvmlDeviceGetSamples"], samples = "ok", (lib.NVML_VALUE_TYPE_UNSIGNED_INT, [])
    power = ask("nvmlDeviceGetPowerUsage", handle)
    energy = ask("nvmlDeviceGetTotalEnergyConsumption", handle)
    limit = ask("nvmlDeviceGetEnforcedPowerLimit", handle)
    temp = ask("nvmlDeviceGetTemperatureV", handle, lib.NVML_TEMPERATURE_GPU)
    clock = ask("nvmlDeviceGetClockInfo", handle, lib.NVML_CLOCK_SM)
    ask("nvmlDeviceGetTotalEccErrors", handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC)
    mig = ask("nvmlDeviceGetMigMode", handle)
    support = ask("nvmlGpmQueryDeviceSupport", handle)
    gpm_ok = not isinstance(support, Absent) and bool(support.isSupportedDevice)
    if gpm_ok:
        _gpm_sample(nvml, calls, "nvmlGpmSampleGet", handle)
    slices = _slices(nvml, reader, handle) if not isinstance(mig, Absent) and int(mig[0]) == 1 else []
    if gpm_ok and slices:
        _gpm_sample(nvml, calls, "nvmlGpmMigSampleGet", handle, slices[0]["gpu_instance_id"])
    return {
        "index": index,
        "name": _answer(name, text),
        "uuid": _answer(uuid, text),
        "pci_device_id": None if isinstance(pci, Absent) else f"0x{int(pci.pciDeviceId):08X}",
        "pci_bus": None if isinstance(pci, Absent) else int(pci.bus),
        "architecture": _answer(arch, int),
        "memory_total_mib": None if isinstance(memory, Absent) else int(memory.total) // _MIB,
        "memory_reserved_mib": None if isinstance(memory, Absent) else int(memory.reserved) // _MIB,
        "mig_mode": None if isinstance(mig, Absent) else {"current": int(mig[0]) == 1, "pending": int(mig[1]) == 1},
        "calls": calls,
        "samples": _buffer(samples),
        "gpm": {
            "supported": None if isinstance(support, Absent) else gpm_ok,
            "sample": calls.get("nvmlGpmSampleGet"),
        },
        "units": {
            "power_mw": _answer(power, int),
            "energy_mj": _answer(energy, int),
            "power_limit_mw": _answer(limit, int),
            "temperature_c": _answer(temp, int),
            "sm_clock_mhz": _answer(clock, int),
        },
        "slices": slices,
    }


def _slices(nvml: Nvml, reader: ProcessReader, parent: Any) -> list[dict[str, Any]]:
    lib = nvml.lib
    count = nvml.quiet(lib.nvmlDeviceGetMaxMigDeviceCount, parent)
    out = []
    for j in range(0 if isinstance(count, Absent) else int(count)):
        handle = nvml.quiet(lib.nvmlDeviceGetMigDeviceHandleByIndex, parent, j)
        if isinstance(handle, Absent):
            continue
        calls: dict[str, str] = {}
        ask = _asker(nvml, calls)
        uuid = ask("nvmlDeviceGetUUID", handle)
        name = ask("nvmlDeviceGetName", handle)
        gi = ask("nvmlDeviceGetGpuInstanceId", handle)
        ci = ask("nvmlDeviceGetComputeInstanceId", handle)
        attrs = ask("nvmlDeviceGetAttributes", handle)
        memory = ask("nvmlDeviceGetMemoryInfo", handle, version=lib.nvmlMemory_v2)
        _processes(reader, handle, calls)
        out.append(
            {
                "index": j,
                "uuid": _answer(uuid, text),
                "name": _answer(name, text),
                "gpu_instance_id": _answer(gi, int),
                "compute_instance_id": _answer(ci, int),
                "attributes": None
                if isinstance(attrs, Absent)
                else {
                    "gpu_instance_slices": int(attrs.gpuInstanceSliceCount),
                    "compute_instance_slices": int(attrs.computeInstanceSliceCount),
                    "memory_mib": int(attrs.memorySizeMB),
                    "multiprocessors": int(attrs.multiprocessorCount),
                    "copy_engines": int(attrs.sharedCopyEngineCount),
                    "decoders": int(attrs.sharedDecoderCount),
                    "jpegs": int(attrs.sharedJpegCount),
                    "ofas": int(attrs.sharedOfaCount),
                },
                "memory_used_mib": None if isinstance(memory, Absent) else int(memory.used) // _MIB,
                "calls": calls,
            }
        )
    return out


def _asker(nvml: Nvml, calls: dict[str, str]) -> Callable[..., Any]:
    """A caller of NVML functions by name that notes each answer ("ok" or the reason word) in `calls`."""

    def ask(name: str, *args: Any, **kwargs: Any) -> Any:
        value = nvml.quiet(getattr(nvml.lib, name), *args, **kwargs)
        calls[name] = value.reason if isinstance(value, Absent) else "ok"
        return value

    return ask


def _processes(reader: ProcessReader, handle: Any, calls: dict[str, str]) -> None:
    got = reader.read(handle)
    calls[reader.symbol or "nvmlDeviceGetComputeRunningProcesses_v3"] = got.reason if isinstance(got, Absent) else "ok"


def _gpm_sample(nvml: Nvml, calls: dict[str, str], name: str, *args: Any) -> None:
    """Whether a GPM sample can be taken (the sample is freed at once)."""
    lib = nvml.lib
    sample = nvml.quiet(lib.nvmlGpmSampleAlloc)
    if isinstance(sample, Absent):
        calls["nvmlGpmSampleAlloc"] = sample.reason
        return
    try:
        got = nvml.quiet(getattr(lib, name), *args, sample)
        calls[name] = got.reason if isinstance(got, Absent) else "ok"
    finally:
        nvml.quiet(lib.nvmlGpmSampleFree, sample)


def _buffer(samples: Any) -> dict[str, Any]:
    """The utilization sample buffer as first read: how many samples, how far apart, the largest value."""
    if isinstance(samples, Absent):
        return {"error": samples.reason}
    stamps = sorted(int(s.timeStamp) for s in samples[1])
    values = [int(s.sampleValue.uiVal) for s in samples[1]]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "count": len(stamps),
        "spacing_ms": round(statistics.median(gaps) / 1000, 3) if gaps else None,
        "span_s": round((stamps[-1] - stamps[0]) / 1e6, 3) if stamps else None,
        "max": max(values, default=None),
        "mean": round(statistics.fmean(values), 2) if values else None,
    }


def _answer(value: Any, convert: Callable[[Any], Any]) -> Any:
    return None if isinstance(value, Absent) else convert(value)


def _bindings_version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None
