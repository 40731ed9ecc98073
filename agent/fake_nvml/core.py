"""The fake library's core: building a scenario's devices, resolving handles, injected failures, test controls,
the exact truth, init and identity. The NVML calls about devices and about MIG and GPM live in `devices` and
`mig`, which extend this class."""

from __future__ import annotations

import collections
import ctypes
import importlib
import types
from collections.abc import Callable
from typing import Any

from .curves import Curve, Load, key_of, rand, uuid_of
from .hardware import DRIVERS, PRIVILEGES, Driver, Privilege
from .model import MIB, MIG_SLICES, NO_ID, Failure, GpmCounters, GpmSample, Gpu, GpuInstance, MigDevice, Proc
from .procfs import owner
from .scenarios import GpuSpec, Scenario, Who

# Imported by name, not statement: pynvml ships without type information.
nv: Any = importlib.import_module("pynvml")

LIBRARY_MISMATCH = -1
"""Pass to `FakeNvml.fail` as the error to raise `pynvml.NVMLLibraryMismatchError` instead of an `NVMLError`."""

_HELPERS = frozenset({"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"})


def error(code: int) -> Exception:
    # NVMLError.__new__ returns the subclass registered for the code, as _nvmlCheckReturn raises it.
    exc: Exception = nv.NVMLError(code)
    return exc


class Core:
    """State and plumbing shared by every simulated call. `calls` counts the calls of each nvml* function."""

    def __init__(
        self,
        spec: Scenario,
        name: str,
        clock: Callable[[], float],
        seed: int,
        epoch: float | None = None,
        *,
        driver: str | None = None,
        privilege: str | None = None,
    ) -> None:
        self.scenario = name
        self.spec = spec
        self.seed = seed
        self.calls: collections.Counter[str] = collections.Counter()
        chosen = driver or spec.driver
        self.driver: Driver = chosen if isinstance(chosen, Driver) else DRIVERS[chosen]
        self.privilege: Privilege = PRIVILEGES[privilege or spec.privilege]
        self._clock = clock
        self._has_driver = spec.has_driver
        self._refs = 0
        self._loaded = False  # the library stays loaded after the first nvmlInit, as pynvml keeps it
        self._failures: list[Failure] = []
        self._gpus: list[Gpu] = []
        self._nodes: dict[int, Gpu | MigDevice] = {}
        # Handles point at these 8-byte cells, one per GPU and MIG device; they are never dereferenced.
        self._cells: list[Any] = []
        self._gpm: dict[int, GpmSample] = {}
        self._pids = 0
        base = key_of(name, seed)
        # NVML timestamps count µs on the driver's own clock: here, a day or so of uptime ahead of `clock`.
        self._ts_offset_us = 86_400_000_000 + int(rand(base, 1) * 3_600_000_000)
        t0 = clock()
        self.epoch = t0 if epoch is None else epoch
        for i, gspec in enumerate(spec.gpus):
            self._gpus.append(self._build_gpu(i, gspec, t0))
        for rule in spec.failures:
            self.fail(rule.function, rule.error, gpu=rule.gpu, slice_index=rule.slice_index, gpu_only=rule.gpu_only)

    # -- construction

    def _handle(self) -> Any:
        cell = ctypes.create_string_buffer(8)
        self._cells.append(cell)
        return ctypes.cast(ctypes.addressof(cell), nv.c_nvmlDevice_t)

    def _register(self, node: Gpu | MigDevice) -> None:
        self._nodes[ctypes.addressof(node.handle.contents)] = node

    def _pid(self, base: int) -> int:
        self._pids += 1
        return 1000 + int(rand(base, 1000 + self._pids) * 3_000_000)

    def _proc(self, base: int, mib: int, unit: Curve, who: Who, *device: int) -> Proc:
        """A scenario's process on the device `device` names (GPU index, then GPU and compute instance ids),
        with the identity its /proc entry shows; its rank in the scenario is its Slurm task."""
        task = self._pids
        who_key = key_of(self.scenario, self.seed, "who", *device)
        gi_id, ci_id = device[1:] if len(device) == 3 else (NO_ID, NO_ID)
        return Proc(self._pid(base), mib * MIB, gi_id, ci_id, unit, owner(who, who_key, task, self.spec.cgroups))

    def _build_gpu(self, i: int, gspec: GpuSpec, t0: float) -> Gpu:
        spec = self.spec
        model = gspec.model or spec.model
        assert model is not None
        key = key_of(self.scenario, self.seed, i)
        mig = gspec.mig is not None
        gpu = Gpu(
            index=i,
            model=model,
            name=model.name,
            uuid=gspec.uuid or "GPU-" + uuid_of(key),
            bus=spec.bus_ids[i] if spec.bus_ids else 0x10 + i,
            device=0x1C + i % 2 if spec.bus_ids and spec.bus_ids.count(spec.bus_ids[i]) > 1 else 0,
            ecc=gspec.ecc,
            handle=self._handle(),
            curve=None if mig else Curve(gspec.load, key, self.epoch),
            sample_phase_us=int(rand(key, 20) * spec.sample_period_us),
            energy_t=t0,
            # The counter runs since the driver loaded: some days at idle power.
            energy_mj=model.idle_w * 1000.0 * 86_400 * (1 + 20 * rand(key, 21)),
            counters=GpmCounters(t0),
            mig_pending=gspec.mig_pending,
        )
        self._register(gpu)
        if gpu.curve is not None:
            gpu.weights = [(1.0, gpu.curve)]
            who = gspec.who or spec.who
            gpu.procs = [self._proc(key, mib, gpu.curve, who, i) for mib in gspec.procs_mib]
            return gpu
        for gi_spec in gspec.mig or ():
            gi = self._make_gi(gpu, gi_spec.gi_id, gi_spec.profile, t0)
            for ci in gi_spec.cis:
                dev = self._make_ci(gpu, gi, ci.index, ci.ci_id, ci.slices, ci.load, ci.uuid)
                who = ci.who or gspec.who or spec.who
                gpu.procs += [self._proc(key, mib, dev.curve, who, i, gi.gi_id, ci.ci_id) for mib in ci.procs_mib]
        gpu.mig = dict(sorted(gpu.mig.items()))
        return gpu

    def _make_gi(self, gpu: Gpu, gi_id: int, profile: str, t: float) -> GpuInstance:
        gi = GpuInstance(gi_id, profile, gpu.model.profiles[profile], GpmCounters(t))
        gpu.gis[gi_id] = gi
        return gi

    def _make_ci(
        self, gpu: Gpu, gi: GpuInstance, index: int, ci_id: int, slices: int, load: Load, uuid: str | None = None
    ) -> MigDevice:
        profile = gi.spec
        # MIG UUIDs are derived from the instance's place and shape, so an identical instance made again in the
        # same place gets the same UUID (nvidia_gpu_exporter docs/METRICS.md); another shape gets another one.
        mkey = key_of(self.scenario, self.seed, gpu.index, "mig", gi.gi_id, ci_id, gi.profile)
        full = slices == profile.slices
        attrs = (
            profile.sms * slices // profile.slices,
            profile.copy_engines,
            profile.decoders,
            0,
            profile.jpegs,
            profile.ofas,
            profile.slices,
            slices,
            profile.memory_mb,
        )
        dev = MigDevice(
            parent=gpu,
            index=index,
            gi=gi,
            ci_id=ci_id,
            ci_slices=slices,
            name=f"{gpu.model.name} MIG {gi.profile if full else f'{slices}c.{gi.profile}'}",
            uuid=uuid or "MIG-" + uuid_of(mkey),
            curve=Curve(load, mkey, self.epoch),
            handle=self._handle(),
            attrs=attrs,
        )
        self._register(dev)
        gpu.mig[index] = dev
        gi.cis.append(dev)
        gi.weights.append((slices / profile.slices, dev.curve))
        gpu.weights.append((slices / MIG_SLICES, dev.curve))
        return dev

    # -- plumbing

    def __getattr__(self, name: str) -> Any:
        """Real constants, structs and error classes; un-simulated nvml* functions answer NotSupported."""
        try:
            value = getattr(nv, name)
        except AttributeError:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}") from None
        if name.startswith("nvml") and isinstance(value, types.FunctionType) and name not in _HELPERS:
            value = self._unsupported(name)
        self.__dict__[name] = value
        return value

    def _unsupported(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._begin(name)
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)

        call.__name__ = call.__qualname__ = name
        return call

    def _begin(self, name: str) -> None:
        """Count the call; raise as the real library does before init, or as a failure injected for all."""
        self.calls[name] += 1
        if not self._refs:
            raise error(nv.NVML_ERROR_UNINITIALIZED)
        if self._failures:
            self._check(name, None, None)

    @staticmethod
    def _address(handle: Any) -> int | None:
        try:
            return ctypes.addressof(handle.contents)
        except (AttributeError, TypeError, ValueError):
            return None

    def _node(self, name: str, handle: Any) -> Gpu | MigDevice:
        """Count the call, check init, resolve the handle and apply injected failures."""
        return self._node_at(name, self._address(handle))

    def _node_at(self, name: str, address: int | None) -> Gpu | MigDevice:
        """`_node` for a handle given as the address it points at (how a C entry point receives it)."""
        self.calls[name] += 1
        if not self._refs:
            raise error(nv.NVML_ERROR_UNINITIALIZED)
        node = self._nodes.get(address) if address is not None else None
        if node is None:
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            if isinstance(node, Gpu):
                self._check(name, node.index, None)
            else:
                self._check(name, node.parent.index, node.index)
        return node

    def _gpu(self, name: str, handle: Any) -> Gpu:
        """Like `_node` for calls about the whole board: a MIG device handle answers NotSupported."""
        node = self._node(name, handle)
        if isinstance(node, MigDevice):
            raise error(nv.NVML_ERROR_NOT_SUPPORTED)
        return node

    def _aggregate(self, node: Gpu | MigDevice) -> None:
        """A MIG-mode GPU's own memory and processes are aggregates: NO_PERMISSION without the monitor right."""
        if isinstance(node, Gpu) and node.mig_mode and not self.privilege.aggregate_mig:
            raise error(nv.NVML_ERROR_NO_PERMISSION)

    def _check(self, name: str, gpu: int | None, slice_index: int | None) -> None:
        for rule in self._failures:
            if rule.function != name:
                continue
            if rule.gpu is not None and (
                rule.gpu != gpu
                or (rule.slice_index is not None and rule.slice_index != slice_index)
                or (rule.gpu_only and slice_index is not None)
            ):
                continue
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._failures.remove(rule)
            if rule.error == LIBRARY_MISMATCH:
                raise nv.NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the NVML lib version."
                )
            raise error(rule.error)

    def _now(self) -> float:
        return self._clock()

    def _ts_us(self, t: float) -> int:
        return int(t * 1e6) + self._ts_offset_us

    @staticmethod
    def _busy(gpu: Gpu, t: float) -> float:
        """Whole-GPU utilization at `t`, percent: the compute-weighted sum over its units."""
        return sum(w * c.at(t) for w, c in gpu.weights)

    def _energy(self, gpu: Gpu, t: float) -> int:
        if t > gpu.energy_t:
            model = gpu.model
            busy = sum(w * c.integral(gpu.energy_t, t) for w, c in gpu.weights)
            gpu.energy_mj += 1000.0 * (model.idle_w * (t - gpu.energy_t) + (model.tdp_w - model.idle_w) * busy / 100.0)
            gpu.energy_t = t
        return int(gpu.energy_mj)

    def _device_handle(self, node: Gpu | MigDevice) -> Any:
        return nv.c_nvmlDevice_t.from_buffer_copy(node.handle)

    # -- init and system

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls["nvmlInitWithFlags"] += 1
        self._init("nvmlInitWithFlags")

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        self._init("nvmlInit")

    def _init(self, name: str) -> None:
        if self._failures:
            self._check(name, None, None)
            if name == "nvmlInit":
                self._check("nvmlInitWithFlags", None, None)  # the real nvmlInit goes through it
        if not self._has_driver:
            raise error(nv.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._loaded = True
        self._refs += 1

    def nvmlShutdown(self) -> None:
        self._begin("nvmlShutdown")
        self._refs -= 1

    @property
    def clients(self) -> int:
        """Open NVML clients of this library (nvmlInit calls not yet shut down)."""
        return self._refs

    def nvmlErrorString(self, result: int) -> str:
        self.calls["nvmlErrorString"] += 1
        text: str = nv.NVMLError._errcode_to_string.get(result, "Unknown Error")
        return text

    def nvmlSystemGetDriverVersion(self) -> str:
        self._begin("nvmlSystemGetDriverVersion")
        return self.driver.version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._begin("nvmlSystemGetNVMLVersion")
        return self.driver.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._begin("nvmlSystemGetCudaDriverVersion")
        return self.driver.cuda

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._begin("nvmlSystemGetCudaDriverVersion_v2")
        return self.driver.cuda

    # -- enumeration and identity

    def nvmlDeviceGetCount(self) -> int:
        self._begin("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if not self._refs:
            raise error(nv.NVML_ERROR_UNINITIALIZED)
        if self._failures:
            self._check("nvmlDeviceGetHandleByIndex", index, None)
        if not 0 <= index < len(self._gpus):
            raise error(nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(self._gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._begin("nvmlDeviceGetHandleByUUID")
        for node in self._nodes.values():
            if node.uuid == uuid:
                return self._device_handle(node)
        raise error(nv.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._node("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._node("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetArchitecture", device)
        gpu = node if isinstance(node, Gpu) else node.parent
        return gpu.model.arch

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        return self._pci(self._gpu("nvmlDeviceGetPciInfo_v3", handle))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self._pci(self._gpu("nvmlDeviceGetPciInfo", handle))

    @staticmethod
    def _pci(gpu: Gpu) -> Any:
        info = nv.nvmlPciInfo_t()
        info.busIdLegacy = f"0000:{gpu.bus:02X}:{gpu.device:02X}.0".encode()
        info.busId = f"00000000:{gpu.bus:02X}:{gpu.device:02X}.0".encode()
        info.domain, info.bus, info.device = 0, gpu.bus, gpu.device
        info.pciDeviceId = gpu.model.pci_device_id
        info.pciSubSystemId = 0x145110DE
        return info
