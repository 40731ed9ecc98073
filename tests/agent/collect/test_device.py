from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from agent import fake_nvml

from .conftest import Host


def test_memory_uses_v2_so_reserved_memory_is_not_counted(host: Callable[[str], Host]) -> None:
    h = host("g5-idle")
    interval = h.interval()
    handle = h.lib.nvmlDeviceGetHandleByIndex(0)
    v1 = h.lib.nvmlDeviceGetMemoryInfo(handle)
    v2 = h.lib.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v1.used > v2.used
    assert h.reading(interval, interval.gpus[0].uuid)["mem_used_mib"] == v2.used // 2**20


def test_slices_report_their_own_memory_and_processes(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.lib.add_process(1, 4242, 1000, slice_index=2)
    interval = h.interval()
    gpu1 = interval.gpus[1]
    by_profile = {s.profile: h.reading(interval, s.uuid) for s in gpu1.slices}
    assert by_profile["1g.5gb"]["procs"] == 1 and by_profile["1g.5gb"]["procs_mem_mib"] == 1000
    assert by_profile["3g.20gb"]["mem_used_mib"] == 15000
    assert gpu1.slices[0].memory_total_mib is not None


def test_board_figures(host: Callable[[str], Host]) -> None:
    h = host("p5")
    interval = h.interval()
    wire = h.reading(interval, interval.gpus[0].uuid)
    assert {"temp_c", "sm_clock_mhz", "ecc_uncorrected", "procs", "procs_mem_mib", "mem_used_mib"} <= set(wire)


def test_ecc_off_is_absent_and_counted_once(host: Callable[[str], Host]) -> None:
    h = host("g6e-busy")
    for _ in range(3):
        interval = h.interval()
    assert "ecc_uncorrected" not in h.reading(interval, interval.gpus[2].uuid)
    assert h.reading(interval, interval.gpus[0].uuid)["ecc_uncorrected"] == 0
    assert h.nvml.take_errors() == {"nvmlDeviceGetTotalEccErrors:not_supported": 1}


def test_an_old_driver_without_the_v3_process_call_falls_back(host: Callable[[str], Host]) -> None:
    h = host("g6e-busy")
    h.lib.fail("nvmlDeviceGetComputeRunningProcesses", fake_nvml.LIBRARY_MISMATCH)
    interval = h.interval()
    assert all(h.reading(interval, g.uuid)["procs"] == 1 or h.reading(interval, g.uuid)["procs"] for g in interval.gpus)


def test_an_old_driver_without_the_versioned_temperature_call_falls_back(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.fail("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    interval = h.interval()
    assert all("temp_c" in h.reading(interval, g.uuid) for g in interval.gpus)


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTotalEccErrors",
    ],
)
@pytest.mark.parametrize(
    "error", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT]
)
def test_any_call_failing_on_one_gpu_costs_that_figure_only(
    host: Callable[[str], Host], function: str, error: int
) -> None:
    h = host("p5")
    healthy = h.interval()
    h.lib.fail(function, error, gpu=3)
    interval = h.interval()
    broken = h.reading(interval, interval.gpus[3].uuid)
    before = h.reading(healthy, healthy.gpus[3].uuid)
    lost = set(before) - set(broken)
    assert len(lost) in (1, 2), lost  # processes carry two figures
    for g in interval.gpus[:3]:
        assert set(h.reading(interval, g.uuid)) == set(h.reading(healthy, g.uuid))
    assert sum(h.nvml.take_errors().values()) == 1


def test_a_lost_gpu_is_reported_and_the_rest_go_on(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.interval()
    h.lib.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=5)
    h.lib.fail("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=5)
    h.interval()
    interval = h.interval()
    assert interval.gpus[5].util_unavailable_reason == "gpu_lost"
    assert set(h.reading(interval, interval.gpus[5].uuid)) == {"uuid", "util_source"}
    assert all("util" in h.reading(interval, g.uuid) for g in interval.gpus if g.index != 5)
