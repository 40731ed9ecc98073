"""SM and graphics-engine activity from GPU Performance Monitoring (GPM): Hopper and newer only.

GPM is the one NVML path that measures MIG slices: a sample per GPU instance at each interval boundary, and
the metrics between two samples are that interval's means. On a MIG slice the graphics-engine activity is
what `util` reports (source `nvml.gpm`); on a whole GPU, `util` stays the sample-buffer figure and GPM adds
`sm_active` and `gr_active`. Ampere MIG slices get no utilization at all, with the reason, never 0.

GPU-instance ids are reused when a slice is destroyed and made again, and the new instance's counters start
afresh, so a baseline is kept per GPU instance as identified by its MIG devices' UUIDs, never by its id alone,
and dropped when the instance goes. (An identical instance made again in the same place gets the same UUIDs,
which nothing outside the driver can tell apart: nvidia_gpu_exporter docs/METRICS.md.)
"""

from __future__ import annotations

from typing import Any

from ..nvml import Absent, Nvml
from .model import Reading
from .privilege import SYS_ADMIN
from .topology import GpuDevice

GPM = "nvml.gpm"
AMPERE_MIG_REASON = "NVML cannot measure MIG slice utilization before Hopper (needs DCGM profiling metrics)"
NO_GPM_REASON = "GPM not supported on this GPU: no per-slice utilization"
FIRST_SAMPLE_REASON = "slice appeared during the interval: GPM needs two samples"
MIN_GAP_S = 0.1  # NVML wants samples more than 100 ms apart
WHOLE = "gpu"  # the baseline of the whole GPU


class GpmSource:
    name = "gpm"

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        lib = nvml.lib
        self._metric_ids = (lib.NVML_GPM_METRIC_GRAPHICS_UTIL, lib.NVML_GPM_METRIC_SM_UTIL)
        self._request: Any = None
        self._entries: list[Any] = []
        self._spare: list[Any] = []
        self._held: list[dict[Any, Any]] = []

    def prime(self, gpu: GpuDevice) -> None:
        if not self._supported(gpu):
            return
        baselines: dict[str, Any] = gpu.memo.setdefault("gpm", {})
        self._held.append(baselines)
        self._take(gpu, WHOLE, None, baselines)
        if gpu.mig_mode:
            for gi, key in _instances(gpu).items():
                self._take(gpu, key, gi, baselines)

    def poll(self, gpu: GpuDevice) -> None:
        pass

    def read(self, gpu: GpuDevice, readings: dict[str, Reading], elapsed_s: float) -> None:
        if gpu.lost:
            return
        if not self._supported(gpu):
            reason = AMPERE_MIG_REASON if not gpu.is_hopper_or_newer else NO_GPM_REASON
            for s in gpu.slices.values():
                s.util_reason = reason
            return
        if elapsed_s <= MIN_GAP_S:
            return
        baselines: dict[str, Any] = gpu.memo.setdefault("gpm", {})
        whole = self._measure(gpu, WHOLE, None, baselines)
        reading = readings[gpu.uuid]
        if not isinstance(whole, Absent):
            reading.gr_active, reading.sm_active = whole
            if gpu.mig_mode and whole[0] is not None:
                reading.util, reading.util_source = whole[0], GPM
                gpu.util_reason = None
        if not gpu.mig_mode:
            return
        live = _instances(gpu)
        keys = set(live.values())
        for gone in [k for k in baselines if k != WHOLE and k not in keys]:
            self._spare.append(baselines.pop(gone))
        by_gi = {gi: self._measure(gpu, key, gi, baselines) for gi, key in live.items()}
        for s in gpu.slices.values():
            figures = by_gi[s.gpu_instance_id]
            if isinstance(figures, Absent):
                s.util_reason = figures.reason
                continue
            sr = readings[s.uuid]
            sr.gr_active, sr.sm_active = figures
            if figures[0] is not None:
                sr.util, sr.util_source = figures[0], GPM
                s.util_reason = None

    def close(self) -> None:
        for baselines in self._held:
            self._spare.extend(baselines.values())
            baselines.clear()
        for sample in self._spare:
            self.nvml.quiet(self.nvml.lib.nvmlGpmSampleFree, sample)
        self._spare.clear()

    def _supported(self, gpu: GpuDevice) -> bool:
        known = gpu.memo.get("gpm_ok")
        if known is None:
            support = self.nvml.quiet(self.nvml.lib.nvmlGpmQueryDeviceSupport, gpu.handle)
            known = not isinstance(support, Absent) and bool(support.isSupportedDevice)
            gpu.memo["gpm_ok"] = known
        return bool(known)

    def _sample(self) -> Any:
        return self._spare.pop() if self._spare else self.nvml.call(self.nvml.lib.nvmlGpmSampleAlloc)

    def _take(self, gpu: GpuDevice, key: str, gi: int | None, baselines: dict[str, Any]) -> Any:
        """Fill a fresh sample for the whole GPU (`gi` None) or one GPU instance; Absent on failure."""
        lib = self.nvml.lib
        sample = self._sample()
        if isinstance(sample, Absent):
            return sample
        if gi is None:
            got = self.nvml.call(lib.nvmlGpmSampleGet, gpu.handle, sample)
        else:
            got = self.nvml.call(lib.nvmlGpmMigSampleGet, gpu.handle, gi, sample)
        if isinstance(got, Absent):
            self._spare.append(sample)
            if got.reason == "gpu_lost":
                gpu.lost = got.reason
            elif got.reason == "no_permission":
                call = "nvmlGpmSampleGet" if gi is None else "nvmlGpmMigSampleGet"
                for figure in ("sm_active", "gr_active") if gi is None else ("util", "sm_active", "gr_active"):
                    gpu.deny(figure, call, SYS_ADMIN)
            return got
        old = baselines.get(key)
        baselines[key] = sample
        return old

    def _measure(
        self, gpu: GpuDevice, key: str, gi: int | None, baselines: dict[str, Any]
    ) -> tuple[float | None, float | None] | Absent:
        """(graphics-engine %, SM %) between the previous sample of `key` and a new one."""
        old = self._take(gpu, key, gi, baselines)
        if isinstance(old, Absent):
            return old
        if old is None:
            return Absent(FIRST_SAMPLE_REASON)
        try:
            return self._metrics(old, baselines[key])
        finally:
            self._spare.append(old)

    def _metrics(self, first: Any, second: Any) -> tuple[float | None, float | None] | Absent:
        lib = self.nvml.lib
        request = self._request
        if request is None:
            # Version, count and metric ids are inputs NVML leaves alone: set once, for every later call.
            request = self._request = lib.c_nvmlGpmMetricsGet_t()
            request.version = lib.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._metric_ids)
            metrics = request.metrics
            self._entries = [metrics[i] for i in range(len(self._metric_ids))]  # views into `request`
            for entry, metric in zip(self._entries, self._metric_ids, strict=True):
                entry.metricId = metric
        request.sample1 = first
        request.sample2 = second
        got = self.nvml.call(lib.nvmlGpmMetricsGet, request)
        if isinstance(got, Absent):
            return got
        values: list[float | None] = []
        for entry in self._entries:
            value = entry.value
            ok = int(entry.nvmlReturn) == 0 and 0 <= value <= 100.5
            values.append(min(100.0, float(value)) if ok else None)
        return values[0], values[1]


def _instances(gpu: GpuDevice) -> dict[int, str]:
    """The live GPU instances of a MIG-mode GPU: GPU-instance id -> what identifies the instance across
    intervals, the UUIDs of its MIG devices."""
    uuids: dict[int, list[str]] = {}
    for s in gpu.slices.values():
        uuids.setdefault(s.gpu_instance_id, []).append(s.uuid)
    return {gi: "gi:" + ",".join(sorted(found)) for gi, found in uuids.items()}
