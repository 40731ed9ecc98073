"""Mean board power over the interval, W: the energy counter's growth divided by the time between reads.

`nvmlDeviceGetPowerUsage` is a 1 s average on most boards and instantaneous on A100, so it only stands in
where the energy counter is missing (or went backwards, as after a driver reload).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..nvml import Absent, Nvml
from .model import Reading
from .source import ask
from .topology import GpuDevice


class PowerSource:
    name = "power"

    def __init__(self, nvml: Nvml, clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.clock = clock

    def poll(self, gpu: GpuDevice) -> None:
        pass

    def prime(self, gpu: GpuDevice) -> None:
        if gpu.lost:
            return
        energy = self.nvml.quiet(self.nvml.lib.nvmlDeviceGetTotalEnergyConsumption, gpu.handle)
        if not isinstance(energy, Absent):
            gpu.memo["energy"] = (int(energy), self.clock())

    def close(self) -> None:
        pass

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        if gpu.lost:
            return
        lib, nvml = self.nvml.lib, self.nvml
        reading = readings[gpu.uuid]
        energy = ask(nvml, gpu.unsupported, lib.nvmlDeviceGetTotalEnergyConsumption, gpu.handle)
        now = self.clock()
        if not isinstance(energy, Absent):
            before = gpu.memo.get("energy")
            gpu.memo["energy"] = (int(energy), now)
            if before is not None and int(energy) >= before[0] and now - before[1] > 0:
                reading.power_w = (int(energy) - before[0]) / 1000 / (now - before[1])
                return
        elif energy.reason == "gpu_lost":
            gpu.lost = energy.reason
            return
        milliwatts = ask(nvml, gpu.unsupported, lib.nvmlDeviceGetPowerUsage, gpu.handle)
        if not isinstance(milliwatts, Absent):
            reading.power_w = int(milliwatts) / 1000
