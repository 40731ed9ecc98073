"""Simulated NVML calls about one device: memory, utilization and its sample buffer, power, thermals, clocks,
ECC. Process lists are in `processes`."""

from __future__ import annotations

import struct
from typing import Any

from .controls import Controls
from .core import error, nv
from .model import Gpu, memory

_SAMPLE = struct.Struct("=QI4x")  # c_nvmlSample_t: timeStamp, then an 8-byte union read through uiVal


class DeviceCalls(Controls):
    # -- memory

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """Bytes. Without `version`, `used` includes driver-reserved memory; with nvmlMemory_v2 it does not.
        A MIG-mode GPU's own figure is an aggregate: NO_PERMISSION without the MIG monitor right."""
        node = self._node("nvmlDeviceGetMemoryInfo", handle)
        self._aggregate(node)
        if version and version != nv.nvmlMemory_v2:
            raise error(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = memory(node, self._now())
        free = max(0, total - reserved - used)
        if not version:
            return nv.c_nvmlMemory_t(total, free, used + reserved)
        return nv.c_nvmlMemory_v2_t(version, total, reserved, free, used)

    # -- utilization

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Percent, over the last sample period. NotSupported in MIG mode."""
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        curve = gpu.curve
        if curve is None:
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        u = curve.at(self._now())
        return nv.c_nvmlUtilization_t(int(u + 0.5), int(u * curve.f_mem + 0.5))

    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list[Any]]:
        """The driver's ring buffer: a sample every period (1/6 s by default), the last 100 kept, timestamps in
        µs on NVML's clock. The driver records no sample while the GPU is idle (polarsignals/gpu-metrics-agent
        PR #37), so an idle stretch leaves a gap and an idle GPU's buffer runs dry.

        Only samples newer than `timeStamp` come back (0: the whole buffer); none at all raises NotFound.
        """
        gpu = self._gpu("nvmlDeviceGetSamples", device)
        if not 0 <= sampling_type < nv.NVML_SAMPLINGTYPE_COUNT:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        curve = gpu.curve
        if curve is None or sampling_type not in (
            nv.NVML_GPU_UTILIZATION_SAMPLES,
            nv.NVML_MEMORY_UTILIZATION_SAMPLES,
        ):
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        scale = 1.0 if sampling_type == nv.NVML_GPU_UTILIZATION_SAMPLES else curve.f_mem
        phase, offset = gpu.sample_phase_us, self._ts_offset_us
        period = self.spec.sample_period_us
        last = (self._ts_us(self._now()) - phase) // period
        first = last - self.spec.sample_slots + 1
        if timeStamp:
            first = max(first, (timeStamp - phase) // period + 1)
        packed: list[bytes] = []
        pack, at = _SAMPLE.pack, curve.at
        for k in range(first, last + 1):
            ts = k * period + phase
            u = at((ts - offset) / 1e6)
            if u <= 0.0:
                continue
            packed.append(pack(ts, int(u * scale + 0.5)))
        if not packed:
            raise error(nv.NVML_ERROR_NOT_FOUND)
        n = len(packed)
        samples = (nv.c_nvmlSample_t * n).from_buffer_copy(b"".join(packed))
        return nv.NVML_VALUE_TYPE_UNSIGNED_INT, samples[0:n]

    # -- power, thermals, clocks, ECC (whole board)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Milliwatts, now."""
        gpu = self._gpu("nvmlDeviceGetPowerUsage", handle)
        m = gpu.model
        return int(1000.0 * (m.idle_w + (m.tdp_w - m.idle_w) * self._busy(gpu, self._now()) / 100.0))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Millijoules since the driver loaded: the integral of the simulated power."""
        return self._energy(self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle), self._now())

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        """Milliwatts."""
        return int(self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).model.tdp_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """Milliwatts."""
        return int(self._gpu("nvmlDeviceGetPowerManagementLimit", handle).model.tdp_w * 1000)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = nv.nvmlTemperature_v1) -> int:
        """Degrees Celsius."""
        if version != nv.nvmlTemperature_v1:
            raise error(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._temperature(self._gpu("nvmlDeviceGetTemperatureV", handle), sensor)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """Degrees Celsius."""
        return self._temperature(self._gpu("nvmlDeviceGetTemperature", handle), sensor)

    def _temperature(self, gpu: Gpu, sensor: int) -> int:
        if sensor != nv.NVML_TEMPERATURE_GPU:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        m = gpu.model
        return int(m.temp_idle_c + (m.temp_busy_c - m.temp_idle_c) * self._busy(gpu, self._now()) / 100.0 + 0.5)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """MHz: idle clocks while the GPU is idle, boost clocks while it works."""
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        m = gpu.model
        if type in (nv.NVML_CLOCK_SM, nv.NVML_CLOCK_GRAPHICS):
            return m.sm_boost_mhz if self._busy(gpu, self._now()) >= 1.0 else m.sm_idle_mhz
        if type == nv.NVML_CLOCK_MEM:
            return m.mem_mhz
        if type == nv.NVML_CLOCK_VIDEO:
            return m.video_mhz
        raise error(nv.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._reasons(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._reasons(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    def _reasons(self, gpu: Gpu) -> int:
        busy = self._busy(gpu, self._now())
        if busy < 1.0:
            return int(nv.nvmlClocksEventReasonGpuIdle)
        if busy >= 95.0:
            return int(nv.nvmlClocksEventReasonSwPowerCap)
        return int(nv.nvmlClocksEventReasonNone)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        mode = int(self._gpu("nvmlDeviceGetEccMode", handle).ecc)
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if errorType not in (0, 1) or counterType not in (0, 1):
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.ecc:
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return 0
