from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from agent.collect import Interval

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


def _process_figures(h: Host, interval: Interval) -> dict[str, tuple[object, object]]:
    return {r.uuid: (r.procs, r.procs_mem_mib) for r in interval.readings}


def _true_process_figures(h: Host, interval: Interval) -> dict[str, tuple[object, object]]:
    t1 = h.clock.t
    truth = h.lib.truth(t1 - interval.duration_s, t1)
    return {uuid: (t.procs, t.procs_mem_mib) for uuid, t in truth.items()}


@pytest.mark.parametrize(
    ("driver", "symbol", "record_bytes"),
    [
        ("470.256.02", "nvmlDeviceGetComputeRunningProcesses_v2", 24),
        ("535.54.03", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
        ("535.98", "nvmlDeviceGetComputeRunningProcesses_v2", 24),
        ("535.183.01", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("550.127.05", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("550.127.08", "nvmlDeviceGetComputeRunningProcesses_v3", 16),
        ("570.172.08", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("580.105.08", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ],
)
def test_process_counts_and_memory_are_right_on_every_driver_layout(
    host: Callable[..., Host], driver: str, symbol: str, record_bytes: int
) -> None:
    """The drivers write the records of one entry point in three sizes; the agent reads each one right, on whole
    GPUs (several processes each) and on MIG slices."""
    h = host("p4d-mig", driver=driver)
    interval = h.interval()
    assert _process_figures(h, interval) == _true_process_figures(h, interval)
    reader = h.collector.device.processes
    assert (reader.symbol, reader.record_bytes) == (symbol, record_bytes)
    assert h.nvml.take_errors() == {}


def test_the_binding_s_own_reader_misreads_early_r535_records(host: Callable[..., Host]) -> None:
    """Why the agent reads the C entry point itself: nvidia-ml-py reads fixed-size records, and 535.43-535.86
    wrote bigger ones, so every record after the first is misread (XuehaiPan/nvitop#75)."""
    h = host("p4d-mig", driver="535.54.03")
    listed = h.lib.nvmlDeviceGetComputeRunningProcesses(h.lib.nvmlDeviceGetHandleByIndex(4))
    true_pids = sorted(p.pid for p in h.lib._gpus[4].procs)
    assert len(listed) == 2 and sorted(p.pid for p in listed) != true_pids
    assert listed[1].pid == 0 or listed[1].usedGpuMemory != h.lib._gpus[4].procs[1].used_bytes


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
        "nvmlDeviceGetComputeRunningProcesses_v3",
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
