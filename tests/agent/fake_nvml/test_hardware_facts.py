"""The fake answers as real hardware does where the agent's figures depend on it: privilege, process-record
layouts per driver build, MIG mode changes and GPU instances, GPM counters."""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from agent import fake_nvml
from agent.fake_nvml import FakeNvml

from .conftest import Clock

MIB = 1024 * 1024


def opened(scenario: str, **kwargs: Any) -> tuple[FakeNvml, Clock]:
    clock = Clock()
    lib = fake_nvml.load(scenario, clock=clock, **kwargs)
    lib.nvmlInit()
    return lib, clock


def mig_handle(lib: FakeNvml, gpu: int, index: int) -> Any:
    return lib.nvmlDeviceGetMigDeviceHandleByIndex(lib.nvmlDeviceGetHandleByIndex(gpu), index)


# -- privilege


def test_without_the_mig_monitor_right_a_mig_gpu_s_aggregates_are_refused() -> None:
    lib, _ = opened("p4d-mig-unprivileged")
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceGetMemoryInfo(parent, version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        lib.nvmlDeviceGetComputeRunningProcesses(parent)
    count = ctypes.c_uint(0)
    entry = lib._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    assert entry(parent, ctypes.byref(count), None) == pynvml.NVML_ERROR_NO_PERMISSION
    # The slices answer for themselves, and a whole GPU is no aggregate.
    assert lib.nvmlDeviceGetMemoryInfo(mig_handle(lib, 0, 0)).total == 4864 * MIB
    assert len(lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(4))) == 2


def test_the_monitor_right_opens_the_aggregates_and_gpm_needs_admin() -> None:
    lib, _ = opened("p4d-mig", privilege="monitor")
    assert lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(0)).total == 40960 * MIB
    hopper, _ = opened("p5-mig", privilege="monitor")
    sample = hopper.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        hopper.nvmlGpmSampleGet(hopper.nvmlDeviceGetHandleByIndex(0), sample)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        hopper.nvmlGpmMigSampleGet(hopper.nvmlDeviceGetHandleByIndex(0), 7, sample)
    admin, _ = opened("p5-mig")
    assert admin.nvmlGpmSampleGet(admin.nvmlDeviceGetHandleByIndex(0), admin.nvmlGpmSampleAlloc())


# -- process records


def _records(lib: FakeNvml, symbol: str, handle: Any) -> tuple[int, bytes]:
    entry = lib._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(0)
    assert entry(handle, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    n = count.value
    buffer = ctypes.create_string_buffer(b"\xa5" * 64 * n, 64 * n)
    count.value = 2 * n
    assert entry(handle, ctypes.byref(count), buffer) == pynvml.NVML_SUCCESS
    return count.value, buffer.raw


@pytest.mark.parametrize(
    ("driver", "symbol", "size"),
    [
        ("535.54.03", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
        ("535.183.01", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("570.172.08", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("570.172.08", "nvmlDeviceGetComputeRunningProcesses_v2", 24),
        ("570.172.08", "nvmlDeviceGetComputeRunningProcesses", 16),
    ],
)
def test_each_entry_point_writes_the_records_of_its_driver_build(driver: str, symbol: str, size: int) -> None:
    lib, _ = opened("p4d-mig", driver=driver)
    n, raw = _records(lib, symbol, lib.nvmlDeviceGetHandleByIndex(4))
    assert n == 2 and raw[n * size :].strip(b"\xa5") == b""
    fields = [struct.unpack_from("=I4xQ", raw, i * size) for i in range(n)]
    assert sorted(mem // MIB for _, mem in fields) == [4000, 22000]
    assert sorted(pid for pid, _ in fields) == sorted(p.pid for p in lib._gpus[4].procs)


@pytest.mark.parametrize("driver", ["470.256.02", "535.98"])
def test_drivers_without_v3_have_no_such_entry_point(driver: str) -> None:
    lib, _ = opened("g6e-busy", driver=driver)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        lib._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(0))
    assert len(lib.nvmlDeviceGetComputeRunningProcesses_v2(lib.nvmlDeviceGetHandleByIndex(1))) == 2


def test_entry_points_exist_only_after_the_library_is_loaded() -> None:
    lib = fake_nvml.load("p5", clock=Clock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        opened("p5")[0]._nvmlGetFunctionPointer("nvmlDeviceGetNoSuchThing")


# -- MIG mode changes and GPU instances


def test_an_ampere_mig_request_waits_for_a_reset_that_open_clients_block() -> None:
    lib, _ = opened("p4d-mig")
    whole = lib.nvmlDeviceGetHandleByIndex(6)
    lib.request_mig_mode(6, True)
    assert lib.nvmlDeviceGetMigMode(whole) == [0, 1]
    with pytest.raises(fake_nvml.InUse):
        lib.reset_gpu(6)
    lib.nvmlShutdown()
    lib.reset_gpu(6)
    lib.nvmlInit()
    assert lib.nvmlDeviceGetMigMode(whole) == [1, 1]
    assert lib.nvmlDeviceGetMaxMigDeviceCount(whole) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(whole, 0)


def test_a_hopper_mig_request_applies_at_once() -> None:
    lib, _ = opened("p5")
    lib.request_mig_mode(3, True)
    assert lib.nvmlDeviceGetMigMode(lib.nvmlDeviceGetHandleByIndex(3)) == [1, 1]


def test_mig_uuids_follow_place_and_shape() -> None:
    """nvidia_gpu_exporter docs/METRICS.md: the same shape made again in the same place has the same UUID."""
    lib, _ = opened("p5-mig")
    before = lib.nvmlDeviceGetUUID(mig_handle(lib, 5, 1))
    lib.destroy_gpu_instance(5, 10)
    lib.create_gpu_instance(5, "1g.20gb", gi_id=10)
    assert lib.nvmlDeviceGetUUID(mig_handle(lib, 5, 1)) == before
    lib.destroy_gpu_instance(5, 10)
    lib.create_gpu_instance(5, "2g.20gb", gi_id=10)
    assert lib.nvmlDeviceGetUUID(mig_handle(lib, 5, 1)) != before
    with pytest.raises(ValueError, match="no room"):
        lib.create_gpu_instance(5, "4g.40gb")


def test_gpm_counters_of_a_remade_instance_start_again() -> None:
    """Two samples of one GPU-instance id taken across a remake diff two different instances' counters."""
    lib, clock = opened("p5-mig")
    parent = lib.nvmlDeviceGetHandleByIndex(5)
    lib.set_load(5, 90.0, slice_index=1)
    s1, s2 = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    clock.t += 30
    lib.nvmlGpmMigSampleGet(parent, 10, s1)
    lib.destroy_gpu_instance(5, 10)
    lib.create_gpu_instance(5, "2g.20gb", gi_id=10)
    lib.set_load(5, 40.0, slice_index=1)
    clock.t += 10
    lib.nvmlGpmMigSampleGet(parent, 10, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 1, s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    lib.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].value != pytest.approx(40.0, abs=1)
    clock.t += 0.05
    lib.nvmlGpmMigSampleGet(parent, 10, s1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpmMetricsGet(mg)  # samples under 100 ms apart
