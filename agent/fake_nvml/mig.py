"""Simulated MIG and GPM calls, and the test controls that change a MIG layout: a MIG mode request that waits
for a GPU reset, and GPU instances made and destroyed."""

from __future__ import annotations

import ctypes
from typing import Any

from .controls import Controls
from .core import error, nv
from .curves import NO_LOAD, Curve, Load, key_of
from .model import GPM_METRICS, MIG_SLICES, GpmCounters, GpmSample, Gpu, MigDevice

GPM_MIN_GAP_S = 0.1  # GPM refuses sample pairs closer than 100 ms (NVML GPM API docs)
GPM_METRIC_IDS: dict[int, tuple[str, bytes, bytes]] = {
    1: ("graphics", b"gr_util", b"Graphics activity"),
    2: ("sm", b"sm_util", b"SM utilization"),
    3: ("occ", b"sm_occupancy", b"SM occupancy"),
    5: ("tensor", b"any_tensor_util", b"Any tensor activity"),
    10: ("dram", b"dram_bw_util", b"DRAM bandwidth utilization"),
}
_get, _set = object.__getattribute__, object.__setattr__  # a ctypes field itself, past the binding's wrapper
_FACTORS = {"graphics": None, "sm": "f_sm", "occ": "f_occ", "tensor": "f_tensor", "dram": "f_dram"}


class InUse(RuntimeError):
    """The GPU reset was refused: an NVML client still holds the GPU (nvidia-smi: "In use by another client")."""


class MigCalls(Controls):
    # -- MIG

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        """[current, pending]: 1 enabled, 0 disabled; pending differs while a change waits for a GPU reset.
        NotSupported on GPUs without MIG."""
        gpu = self._gpu("nvmlDeviceGetMigMode", device)
        if not gpu.model.mig_capable:
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig_mode)
        return [mode, mode if gpu.mig_pending is None else int(gpu.mig_pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetMaxMigDeviceCount", device)
        if isinstance(node, MigDevice):
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        return MIG_SLICES if node.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        """NotFound for an index without a MIG device: indices can be sparse."""
        self.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        if not self._refs:
            raise error(nv.NVML_ERROR_UNINITIALIZED)
        address = self._address(device)
        gpu = self._nodes.get(address) if address is not None else None
        if not isinstance(gpu, Gpu):
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            self._check("nvmlDeviceGetMigDeviceHandleByIndex", gpu.index, index)
        if not gpu.mig_mode or not 0 <= index < MIG_SLICES:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        dev = gpu.mig.get(index)
        if dev is None:
            raise error(nv.NVML_ERROR_NOT_FOUND)
        return self._device_handle(dev)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # The real binding returns the ctypes c_uint itself, not its value.
        return ctypes.c_uint(isinstance(self._node("nvmlDeviceIsMigDeviceHandle", device), MigDevice))

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetGpuInstanceId", device)
        if isinstance(node, Gpu):
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return node.gi.gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetComputeInstanceId", device)
        if isinstance(node, Gpu):
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return node.ci_id

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        return self._attributes(self._node("nvmlDeviceGetAttributes_v2", device))

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        """A MIG device's engines and sizes (memorySizeMB in MiB). NotSupported on whole GPUs."""
        return self._attributes(self._node("nvmlDeviceGetAttributes", device))

    @staticmethod
    def _attributes(node: Gpu | MigDevice) -> Any:
        if isinstance(node, Gpu):
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return nv.c_nvmlDeviceAttributes(*node.attrs)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        node = self._node("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        if isinstance(node, Gpu):
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(node.parent)

    # -- GPM (Hopper)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        node = self._node("nvmlGpmQueryDeviceSupport", device)
        gpu = node if isinstance(node, Gpu) else node.parent
        if gpu.model.gpm == "error":
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return nv.c_nvmlGpmSupport_t(nv.NVML_GPM_SUPPORT_VERSION, int(gpu.model.gpm == "yes"))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._begin("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        self._gpm[ctypes.addressof(buffer)] = GpmSample(buffer)
        return ctypes.cast(buffer, nv.c_nvmlGpmSample_t)

    def _sample(self, gpmSample: Any) -> GpmSample:
        address = self._address(gpmSample)
        sample = self._gpm.get(address) if address is not None else None
        if sample is None:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._begin("nvmlGpmSampleFree")
        del self._gpm[ctypes.addressof(self._sample(gpmSample).buffer)]

    def _gpm_gpu(self, name: str, device: Any) -> Gpu:
        gpu = self._gpu(name, device)
        if gpu.model.gpm != "yes":
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        if not self.privilege.profiling:
            raise error(nv.NVML_ERROR_NO_PERMISSION)
        return gpu

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        """Snapshot the whole GPU's counters (also in MIG mode) into `gpmSample`."""
        gpu = self._gpm_gpu("nvmlGpmSampleGet", device)
        now = self._now()
        _accumulate(gpu.counters, gpu.weights, now)  # its instances' counters catch up when they are read
        sample = self._sample(gpmSample)
        sample.gpu, sample.gi_id, sample.t, sample.totals = gpu, None, now, dict(gpu.counters.totals)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        """Snapshot one GPU instance's counters into `gpmSample`."""
        gpu = self._gpm_gpu("nvmlGpmMigSampleGet", device)
        if not gpu.mig_mode:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        gi = gpu.gis.get(gpuInstanceId)
        if gi is None:
            raise error(nv.NVML_ERROR_NOT_FOUND)
        now = self._now()
        _accumulate(gi.counters, gi.weights, now)
        sample = self._sample(gpmSample)
        sample.gpu, sample.gi_id, sample.t, sample.totals = gpu, gpuInstanceId, now, dict(gi.counters.totals)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fill metrics[i].value (percent: the counters' increase between the two samples over the time between
        them) and metrics[i].nvmlReturn. Like the hardware, it cannot know that two samples of one GPU-instance
        id come from two different instances: if the instance was remade in between, the answer is wrong."""
        self._begin("nvmlGpmMetricsGet")
        # The binding's structs read and write every field through Python (to turn str into bytes); no string
        # is read here and only bytes are written, so the fields are used directly: the same values, cheaper.
        mg = metricsGet
        count = _get(mg, "numMetrics")
        if _get(mg, "version") != nv.NVML_GPM_METRICS_GET_VERSION or not 0 < count <= nv.NVML_GPM_METRIC_MAX:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        s1, s2 = self._sample(_get(mg, "sample1")), self._sample(_get(mg, "sample2"))
        gpu = s1.gpu
        if gpu is None or s2.gpu is not gpu or s1.gi_id != s2.gi_id or s2.t - s1.t < GPM_MIN_GAP_S:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            self._check("nvmlGpmMetricsGet", gpu.index, None)
        dt = s2.t - s1.t
        metrics = _get(mg, "metrics")
        for i in range(count):
            metric = metrics[i]
            known = GPM_METRIC_IDS.get(_get(metric, "metricId"))
            if known is None:
                _set(metric, "nvmlReturn", nv.NVML_ERROR_NOT_SUPPORTED)
                _set(metric, "value", 0.0)
                continue
            rise = s2.totals[known[0]] - s1.totals[known[0]]
            _set(metric, "nvmlReturn", nv.NVML_SUCCESS)
            _set(metric, "value", min(100.0, max(0.0, rise / dt)))
            info = _get(metric, "metricInfo")
            _set(info, "shortName", known[1])
            _set(info, "longName", known[2])
            _set(info, "unit", b"%")
        return mg

    def _advance_counters(self, gpu: Gpu, t: float) -> None:
        _accumulate(gpu.counters, gpu.weights, t)
        for gi in gpu.gis.values():
            _accumulate(gi.counters, gi.weights, t)

    # -- test controls: changing the MIG layout

    def request_mig_mode(self, gpu: int, enabled: bool) -> None:
        """What `nvidia-smi -i GPU -mig 1|0` does. On Hopper the mode changes at once, with no GPU reset (NVIDIA
        MIG user guide, "Enable MIG Mode"); before Hopper it stays pending until `reset_gpu`."""
        g, _ = self._target(gpu, None)
        if not g.model.mig_capable:
            raise ValueError(f"GPU {gpu} ({g.name}) does not support MIG")
        if enabled == g.mig_mode:
            g.mig_pending = None
        elif g.model.arch >= 9:
            self._switch_mig_mode(g, enabled)
        else:
            g.mig_pending = enabled

    def reset_gpu(self, gpu: int) -> None:
        """An administrator's GPU reset, which applies a pending MIG mode. NVIDIA's MIG user guide: a running NVML
        client (a monitoring agent, nvidia-smi, DCGM) blocks it; this fake knows only its own clients."""
        g, _ = self._target(gpu, None)
        if self._refs:
            raise InUse(f"GPU {gpu}: In use by another client ({self._refs} NVML clients open)")
        if g.mig_pending is not None:
            self._switch_mig_mode(g, g.mig_pending)

    def _switch_mig_mode(self, g: Gpu, enabled: bool) -> None:
        now = self._now()
        self._energy(g, now)
        nodes: list[Gpu | MigDevice] = [*g.mig.values(), g]
        for node in nodes:
            self._nodes.pop(ctypes.addressof(node.handle.contents), None)
        g.mig.clear()
        g.gis.clear()
        g.procs = []
        g.mig_pending = None
        g.counters = GpmCounters(now)
        if enabled:
            g.curve, g.weights = None, []
        else:
            g.curve = Curve(NO_LOAD, key_of(self.scenario, self.seed, g.index, "whole"), self.epoch)
            g.weights = [(1.0, g.curve)]
        self._register(g)

    def create_gpu_instance(
        self, gpu: int, profile: str, *, gi_id: int | None = None, load: Load = NO_LOAD, procs_mib: tuple[int, ...] = ()
    ) -> int:
        """Make a GPU instance of `profile` holding one compute instance of its full size, on a MIG-mode GPU;
        returns its id (`gi_id`, else the lowest free one). Its GPM counters start at zero."""
        g, _ = self._target(gpu, None)
        if not g.mig_mode:
            raise ValueError(f"GPU {gpu} is not in MIG mode")
        if profile not in g.model.profiles:
            raise ValueError(f"{g.name} has no MIG profile {profile!r}")
        used = sum(gi.spec.slices for gi in g.gis.values())
        if used + g.model.profiles[profile].slices > MIG_SLICES:
            raise ValueError(f"GPU {gpu} has no room for {profile}")
        if gi_id is None:
            gi_id = min(set(range(1, 15)) - set(g.gis))
        elif gi_id in g.gis:
            raise ValueError(f"GPU {gpu} already has GPU instance {gi_id}")
        index = min(set(range(MIG_SLICES)) - set(g.mig))
        now = self._now()
        self._advance_counters(g, now)
        gi = self._make_gi(g, gi_id, profile, now)
        self._make_ci(g, gi, index, 0, gi.spec.slices, load)
        for mib in procs_mib:
            self.add_process(gpu, self._pid(key_of(self.scenario, gpu, gi_id)), mib, slice_index=index)
        g.mig = dict(sorted(g.mig.items()))
        return gi_id

    def destroy_gpu_instance(self, gpu: int, gi_id: int) -> None:
        """Destroy a GPU instance with its compute instances; its processes end with it."""
        g, _ = self._target(gpu, None)
        gi = g.gis.pop(gi_id, None)
        if gi is None:
            raise ValueError(f"GPU {gpu} has no GPU instance {gi_id}")
        self._energy(g, self._now())
        self._advance_counters(g, self._now())
        for dev in gi.cis:
            del g.mig[dev.index]
            self._nodes.pop(ctypes.addressof(dev.handle.contents), None)
        gone = {id(dev.curve) for dev in gi.cis}
        g.weights = [(w, c) for w, c in g.weights if id(c) not in gone]
        g.procs = [p for p in g.procs if p.gi_id != gi_id]


def _accumulate(counters: GpmCounters, weights: list[tuple[float, Curve]], t: float) -> None:
    """Add the activity of [counters.t, t] to the counters, per GPM metric."""
    if t <= counters.t:
        return
    totals = counters.totals
    for w, curve in weights:
        busy = w * curve.integral(counters.t, t)
        for metric in GPM_METRICS:
            factor = _FACTORS[metric]
            totals[metric] += busy if factor is None else busy * getattr(curve, factor)
    counters.t = t
