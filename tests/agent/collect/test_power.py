from __future__ import annotations

from collections.abc import Callable

import pynvml

from .conftest import Host


def test_power_is_the_energy_counter_s_mean_over_the_interval(host: Callable[[str], Host]) -> None:
    h = host("g6e-busy")
    h.lib.set_load(0, 100.0)
    h.interval()
    handle = h.lib.nvmlDeviceGetHandleByIndex(0)
    before = h.lib.nvmlDeviceGetTotalEnergyConsumption(handle)
    interval = h.interval(20.0)
    after = h.lib.nvmlDeviceGetTotalEnergyConsumption(handle)
    expected = (after - before) / 1000 / 20.0
    assert h.reading(interval, interval.gpus[0].uuid)["power_w"] == round(expected, 2)
    assert h.lib.calls["nvmlDeviceGetPowerUsage"] == 0


def test_without_an_energy_counter_the_power_reading_stands_in(host: Callable[[str], Host]) -> None:
    h = host("g6e-busy")
    h.lib.fail("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    interval = h.interval()
    handle = h.lib.nvmlDeviceGetHandleByIndex(1)
    assert h.reading(interval, interval.gpus[1].uuid)["power_w"] == round(
        h.lib.nvmlDeviceGetPowerUsage(handle) / 1000, 2
    )


def test_mig_slices_carry_no_power_the_parent_does(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    interval = h.interval()
    parent = interval.gpus[1]
    assert float(h.reading(interval, parent.uuid)["power_w"]) > 0  # type: ignore[arg-type]
    assert all("power_w" not in h.reading(interval, s.uuid) for s in parent.slices)
