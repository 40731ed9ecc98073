"""The fake NVML against the real pynvml module: same names, signatures, types and errors; exact answers."""

from __future__ import annotations

import ctypes
import inspect
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from agent import fake_nvml
from agent.fake_nvml import LIBRARY_MISMATCH, SCENARIOS, FakeNvml

from .conftest import Clock

MIB = 1024 * 1024


@pytest.fixture
def clock() -> Clock:
    return Clock()


def opened(scenario: str, clock: Clock, seed: int = 0) -> FakeNvml:
    lib = fake_nvml.load(scenario, clock=clock, seed=seed)
    lib.nvmlInit()
    return lib


@pytest.fixture
def p4d(clock: Clock) -> Iterator[FakeNvml]:
    lib = opened("p4d-mig", clock)
    yield lib
    lib.nvmlShutdown()


def mig_handles(lib: FakeNvml, gpu: int) -> dict[int, Any]:
    parent = lib.nvmlDeviceGetHandleByIndex(gpu)
    found = {}
    for j in range(lib.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            found[j] = lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)
        except pynvml.NVMLError_NotFound:
            continue
    return found


def faked_functions() -> list[str]:
    return sorted(n for n, v in inspect.getmembers(FakeNvml, inspect.isfunction) if n.startswith("nvml"))


# -- conformance with the real module


@pytest.mark.parametrize("name", faked_functions())
def test_every_faked_function_matches_the_real_signature(name: str) -> None:
    real = getattr(pynvml, name, None)
    assert inspect.isfunction(real), f"pynvml has no function {name}"
    lib = fake_nvml.load("no-gpu")
    fake_params = list(inspect.signature(getattr(lib, name)).parameters.values())
    real_params = list(inspect.signature(real).parameters.values())
    assert [(p.name, p.kind, p.default) for p in fake_params] == [(p.name, p.kind, p.default) for p in real_params]


def test_constants_structs_and_errors_are_the_real_objects() -> None:
    lib = fake_nvml.load("p5")
    assert lib.NVMLError is pynvml.NVMLError
    assert lib.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert lib.NVMLLibraryMismatchError is pynvml.NVMLLibraryMismatchError
    assert lib.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    assert lib.NVML_ERROR_NOT_SUPPORTED == 3
    assert lib.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    assert lib.nvmlExceptionClass is pynvml.nvmlExceptionClass
    with pytest.raises(AttributeError):
        _ = lib.nvmlNoSuchThing


def test_unsimulated_functions_answer_not_supported(clock: Clock) -> None:
    lib = opened("p5", clock)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported) as err:
        lib.nvmlDeviceGetFanSpeed(h)
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert lib.nvmlDeviceGetFanSpeed.__name__ == "nvmlDeviceGetFanSpeed"
    assert lib.calls["nvmlDeviceGetFanSpeed"] == 1


# -- init, driver, enumeration


def test_calls_before_init_and_after_last_shutdown_are_uninitialized(clock: Clock) -> None:
    lib = fake_nvml.load("p5", clock=clock)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlShutdown()
    lib.nvmlInit()
    lib.nvmlInitWithFlags(0)
    lib.nvmlShutdown()
    assert lib.nvmlDeviceGetCount() == 8  # still one reference
    lib.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlSystemGetDriverVersion()


def test_no_driver_and_no_gpu(clock: Clock) -> None:
    lib = fake_nvml.load("no-driver", clock=clock)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound) as err:
        lib.nvmlInit()
    assert err.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    empty = opened("no-gpu", clock)
    assert empty.nvmlDeviceGetCount() == 0
    assert empty.nvmlSystemGetDriverVersion() == "550.127.05"
    assert empty.nvmlSystemGetCudaDriverVersion() == 12040
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        empty.nvmlDeviceGetHandleByIndex(0)


def test_scenarios_load_and_unknown_names_do_not() -> None:
    assert {"p4d-mig", "p5-mig", "p5", "g5-idle", "g6e-busy", "no-gpu", "no-driver"} <= set(SCENARIOS)
    assert {"p4d-train", "g5-forgotten", "p5-inference", "g5-batch", "p4d-shared", "p5-train"} <= set(SCENARIOS)
    with pytest.raises(ValueError):
        fake_nvml.load("p3")


def test_identity_of_gpus(p4d: FakeNvml, clock: Clock) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    again = p4d.nvmlDeviceGetHandleByIndex(0)
    assert again is not h and p4d.nvmlDeviceGetUUID(again) == p4d.nvmlDeviceGetUUID(h)
    assert p4d.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert p4d.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    pci = p4d.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t) and pci.busId == "00000000:10:1C.0"  # decoded by the real struct
    uuids = [p4d.nvmlDeviceGetUUID(p4d.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    assert len(set(uuids)) == 8 and all(u.startswith("GPU-") for u in uuids)
    same = opened("p4d-mig", clock)
    assert [same.nvmlDeviceGetUUID(same.nvmlDeviceGetHandleByIndex(i)) for i in range(8)] == uuids
    other_host = opened("p4d-mig", clock, seed=1)
    assert other_host.nvmlDeviceGetUUID(other_host.nvmlDeviceGetHandleByIndex(0)) != uuids[0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        p4d.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        p4d.nvmlDeviceGetUUID(pynvml.c_nvmlDevice_t())
    arch = {s: opened(s, clock) for s in ("p5", "g5-idle", "g6e-busy")}
    got = {s: lib.nvmlDeviceGetArchitecture(lib.nvmlDeviceGetHandleByIndex(0)) for s, lib in arch.items()}
    assert got == {"p5": 9, "g5-idle": 7, "g6e-busy": 8}


# -- memory and processes


def test_memory_v1_counts_reserved_as_used_and_v2_does_not(p4d: FakeNvml) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(6)  # idle, one process holding 30000 MiB
    v1 = p4d.nvmlDeviceGetMemoryInfo(h)
    v2 = p4d.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert type(v1) is pynvml.c_nvmlMemory_t and type(v2) is pynvml.c_nvmlMemory_v2_t
    assert v2.version == pynvml.nvmlMemory_v2
    assert v1.total == v2.total == 40960 * MIB
    assert v2.used == 30000 * MIB and 100 * MIB < v2.reserved < 1024 * MIB
    assert v1.used == v2.used + v2.reserved and v1.free == v2.free == v2.total - v1.used
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        p4d.nvmlDeviceGetMemoryInfo(h, version=7)


def test_processes_are_friendly_objects_like_the_v3_wrapper_returns(p4d: FakeNvml) -> None:
    whole = p4d.nvmlDeviceGetComputeRunningProcesses(p4d.nvmlDeviceGetHandleByIndex(4))
    assert all(isinstance(p, pynvml.nvmlFriendlyObject) for p in whole)
    assert sorted(p.usedGpuMemory // MIB for p in whole) == [4000, 22000]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in whole} == {(0xFFFFFFFF, 0xFFFFFFFF)}
    assert p4d.nvmlDeviceGetComputeRunningProcesses(p4d.nvmlDeviceGetHandleByIndex(7)) == []

    parent = p4d.nvmlDeviceGetComputeRunningProcesses(p4d.nvmlDeviceGetHandleByIndex(3))
    assert sorted((p.gpuInstanceId, p.computeInstanceId, p.usedGpuMemory // MIB) for p in parent) == [
        (2, 0, 14000),
        (3, 0, 3000),
    ]
    slices = mig_handles(p4d, 3)
    assert [p.pid for p in p4d.nvmlDeviceGetComputeRunningProcesses(slices[0])] == [
        p.pid for p in parent if p.gpuInstanceId == 3
    ]
    assert p4d.nvmlDeviceGetComputeRunningProcesses(slices[2]) == []
    # The two compute instances of GPU instance 3 share its memory.
    for j in (0, 2):
        mem = p4d.nvmlDeviceGetMemoryInfo(slices[j], version=pynvml.nvmlMemory_v2)
        assert (mem.total // MIB, mem.used // MIB) == (9984, 3000)

    p4d.add_process(3, 4242, 1000, slice_index=2)
    added = p4d.nvmlDeviceGetComputeRunningProcesses(slices[2])
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in added] == [(4242, 1000 * MIB, 3, 1)]
    assert p4d.nvmlDeviceGetMemoryInfo(slices[0], version=pynvml.nvmlMemory_v2).used == 4000 * MIB
    p4d.remove_process(3, 4242)
    assert p4d.nvmlDeviceGetComputeRunningProcesses(slices[2]) == []
    with pytest.raises(ValueError):
        p4d.add_process(3, 1, 1)  # MIG mode: which slice?


# -- utilization: rates and the sample buffer


def test_utilization_is_not_supported_under_mig(p4d: FakeNvml) -> None:
    parent = p4d.nvmlDeviceGetHandleByIndex(0)
    for h in (parent, mig_handles(p4d, 0)[0]):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            p4d.nvmlDeviceGetUtilizationRates(h)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    rates = p4d.nvmlDeviceGetUtilizationRates(p4d.nvmlDeviceGetHandleByIndex(5))
    assert type(rates) is pynvml.c_nvmlUtilization_t and 75 <= rates.gpu <= 100


def test_sample_buffer_returns_only_newer_samples(p4d: FakeNvml, clock: Clock) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(5)
    p4d.set_load(5, 42)
    kind, samples = p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) == 100 and all(type(s) is pynvml.c_nvmlSample_t for s in samples)
    stamps = [s.timeStamp for s in samples]
    assert all(b - a == 166_667 for a, b in itertools.pairwise(stamps))
    assert {s.sampleValue.uiVal for s in samples} == {42}
    assert stamps[-1] < 10**15  # µs on NVML's own clock, not since the epoch
    last = stamps[-1]
    with pytest.raises(pynvml.NVMLError_NotFound):
        p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
    clock.t += 1.0
    _, newer = p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
    assert len(newer) == 6 and newer[0].timeStamp == last + 166_667
    clock.t += 3600
    _, full = p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
    assert len(full) == 100  # the ring buffer forgot the rest


def test_idle_gpu_that_stops_sampling_answers_not_found(p4d: FakeNvml, clock: Clock) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        p4d.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert p4d.nvmlDeviceGetUtilizationRates(h).gpu == 0
    # Holding memory changes nothing: an idle GPU records no sample.
    with pytest.raises(pynvml.NVMLError_NotFound):
        p4d.nvmlDeviceGetSamples(p4d.nvmlDeviceGetHandleByIndex(6), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    g5 = opened("g5-idle", clock)
    g5h = g5.nvmlDeviceGetHandleByIndex(0)
    dry = 0
    for _ in range(60):
        clock.t += 60
        try:
            g5.nvmlDeviceGetSamples(g5h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        except pynvml.NVMLError_NotFound:
            dry += 1
    assert dry > 40


def test_utilization_moves_over_time_and_is_deterministic(clock: Clock) -> None:
    a, b = opened("p5", clock), opened("p5", clock)
    seen: list[tuple[int, ...]] = []
    for step in range(40):
        clock.t = 1000.0 + 37.0 * step
        row = tuple(a.nvmlDeviceGetUtilizationRates(a.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(8))
        assert row == tuple(b.nvmlDeviceGetUtilizationRates(b.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(8))
        seen.append(row)
    assert len({r[2] for r in seen}) > 5  # a job GPU moves
    assert {r[6] for r in seen} == {0}  # the idle one does not


# -- power and energy


def test_energy_is_the_integral_of_power(p4d: FakeNvml, clock: Clock) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(4)
    p4d.set_load(4, 50)
    assert p4d.nvmlDeviceGetPowerUsage(h) == 226_000  # 52 W idle + (400 - 52) W * 50 %
    assert p4d.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    e0 = p4d.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.t += 10
    assert abs(p4d.nvmlDeviceGetTotalEnergyConsumption(h) - e0 - 2_260_000) <= 1
    p4d.set_load(4, None)
    last = p4d.nvmlDeviceGetTotalEnergyConsumption(h)
    for _ in range(50):
        clock.t += 7.3
        now = p4d.nvmlDeviceGetTotalEnergyConsumption(h)
        assert now > last
        last = now
    clock.t -= 100  # a clock that steps back never makes the counter run backwards
    assert p4d.nvmlDeviceGetTotalEnergyConsumption(h) == last


def test_board_figures_follow_load_and_are_parent_only(p4d: FakeNvml) -> None:
    idle, busy = p4d.nvmlDeviceGetHandleByIndex(7), p4d.nvmlDeviceGetHandleByIndex(5)
    p4d.set_load(5, 100)
    assert p4d.nvmlDeviceGetClockInfo(idle, pynvml.NVML_CLOCK_SM) < p4d.nvmlDeviceGetClockInfo(
        busy, pynvml.NVML_CLOCK_SM
    )
    assert p4d.nvmlDeviceGetCurrentClocksEventReasons(idle) & pynvml.nvmlClocksEventReasonGpuIdle
    assert not p4d.nvmlDeviceGetCurrentClocksEventReasons(busy) & pynvml.nvmlClocksEventReasonGpuIdle
    t_idle = p4d.nvmlDeviceGetTemperatureV(idle, pynvml.NVML_TEMPERATURE_GPU)
    assert t_idle < p4d.nvmlDeviceGetTemperature(busy, pynvml.NVML_TEMPERATURE_GPU)
    ecc = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    assert p4d.nvmlDeviceGetTotalEccErrors(busy, *ecc) == 0
    mig = mig_handles(p4d, 0)[0]
    board_calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (p4d.nvmlDeviceGetPowerUsage, ()),
        (p4d.nvmlDeviceGetTotalEnergyConsumption, ()),
        (p4d.nvmlDeviceGetTemperatureV, (pynvml.NVML_TEMPERATURE_GPU,)),
        (p4d.nvmlDeviceGetClockInfo, (pynvml.NVML_CLOCK_SM,)),
        (p4d.nvmlDeviceGetTotalEccErrors, ecc),
    ]
    for fn, args in board_calls:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            fn(mig, *args)


def test_ecc_off_gpu_answers_not_supported(clock: Clock) -> None:
    lib = opened("g6e-busy", clock)
    ecc = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    answers: list[int | None] = []
    for i in range(4):
        try:
            answers.append(lib.nvmlDeviceGetTotalEccErrors(lib.nvmlDeviceGetHandleByIndex(i), *ecc))
        except pynvml.NVMLError_NotSupported:
            answers.append(None)
    assert answers == [0, 0, None, 0]
    for i in range(4):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        assert lib.nvmlDeviceGetUtilizationRates(h).gpu >= 75
        mem = lib.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert mem.used > 0.8 * mem.total


# -- MIG


def test_mig_enumeration_with_sparse_indices(p4d: FakeNvml) -> None:
    parent = p4d.nvmlDeviceGetHandleByIndex(3)
    assert p4d.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert p4d.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        p4d.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        p4d.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    slices = mig_handles(p4d, 3)
    assert sorted(slices) == [0, 2, 3]
    described = {}
    for j, m in slices.items():
        is_mig = p4d.nvmlDeviceIsMigDeviceHandle(m)
        assert type(is_mig) is ctypes.c_uint and is_mig.value == 1
        attrs = p4d.nvmlDeviceGetAttributes(m)
        assert type(attrs) is pynvml.c_nvmlDeviceAttributes
        described[j] = (
            p4d.nvmlDeviceGetGpuInstanceId(m),
            p4d.nvmlDeviceGetComputeInstanceId(m),
            attrs.gpuInstanceSliceCount,
            attrs.computeInstanceSliceCount,
            attrs.memorySizeMB,
            p4d.nvmlDeviceGetName(m),
        )
        assert p4d.nvmlDeviceGetUUID(m).startswith("MIG-")
        back = p4d.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        assert p4d.nvmlDeviceGetUUID(back) == p4d.nvmlDeviceGetUUID(parent)
    assert described == {
        0: (3, 0, 2, 1, 9984, "NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb"),
        2: (3, 1, 2, 1, 9984, "NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb"),
        3: (2, 0, 3, 3, 20096, "NVIDIA A100-SXM4-40GB MIG 3g.20gb"),
    }
    assert p4d.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        p4d.nvmlDeviceGetAttributes(parent)
    whole = p4d.nvmlDeviceGetHandleByIndex(4)
    assert p4d.nvmlDeviceGetMigMode(whole) == [0, 0]
    assert p4d.nvmlDeviceGetMaxMigDeviceCount(whole) == 0


def test_mig_layouts(clock: Clock) -> None:
    p4d, p5 = opened("p4d-mig", clock), opened("p5-mig", clock)
    p4d_profiles = [
        sorted(p4d.nvmlDeviceGetName(m).rsplit(" ", 1)[1] for m in mig_handles(p4d, g).values()) for g in range(4)
    ]
    assert p4d_profiles == [
        ["1g.5gb"] * 7,
        ["1g.5gb", "2g.10gb", "3g.20gb"],
        ["3g.20gb", "4g.20gb"],
        ["1c.2g.10gb", "1c.2g.10gb", "3g.20gb"],
    ]
    assert sum(len(mig_handles(p5, g)) for g in range(8)) == 24
    sizes = {p5.nvmlDeviceGetAttributes(m).memorySizeMB for g in range(8) for m in mig_handles(p5, g).values()}
    # nvidia_gpu_exporter's H100 capture (driver 590.48.01): 1g.10gb 9984, 2g.20gb 20096, 3g.40gb 40448 MiB.
    assert sizes == {9984, 20096, 40448, 81152}
    for scenario in ("g5-idle", "g6e-busy"):
        lib = opened(scenario, clock)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            lib.nvmlDeviceGetMigMode(lib.nvmlDeviceGetHandleByIndex(0))


# -- GPM


def metrics_between(lib: FakeNvml, clock: Clock, h: Any, seconds: float, gi: int | None = None) -> Any:
    s1, s2 = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    assert isinstance(s1, pynvml.c_nvmlGpmSample_t)
    take = lib.nvmlGpmSampleGet if gi is None else (lambda d, s: lib.nvmlGpmMigSampleGet(d, gi, s))
    take(h, s1)
    clock.t += seconds
    take(h, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    ids = [
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
    ]
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for i, metric in enumerate(ids):
        mg.metrics[i].metricId = metric
    try:
        return lib.nvmlGpmMetricsGet(mg)
    finally:
        lib.nvmlGpmSampleFree(s1)
        lib.nvmlGpmSampleFree(s2)


def test_gpm_only_on_hopper(clock: Clock) -> None:
    support = {}
    for scenario in ("p5", "p4d-mig", "g6e-busy", "g5-idle"):
        lib = opened(scenario, clock)
        h = lib.nvmlDeviceGetHandleByIndex(0)
        try:
            answer = lib.nvmlGpmQueryDeviceSupport(h)
            assert type(answer) is pynvml.c_nvmlGpmSupport_t
            support[scenario] = answer.isSupportedDevice
        except pynvml.NVMLError_NotSupported:
            support[scenario] = None
        if support[scenario] != 1:
            s = lib.nvmlGpmSampleAlloc()
            with pytest.raises(pynvml.NVMLError_NotSupported):
                lib.nvmlGpmSampleGet(h, s)
    assert support == {"p5": 1, "p4d-mig": 0, "g6e-busy": 0, "g5-idle": None}


def test_gpm_metrics_average_the_simulated_activity(clock: Clock) -> None:
    lib = opened("p5", clock)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    lib.set_load(0, 64)
    mg = metrics_between(lib, clock, h, 5.0)
    values = [mg.metrics[i].value for i in range(6)]
    returns = [mg.metrics[i].nvmlReturn for i in range(6)]
    assert returns == [0, 0, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert values[0] == pytest.approx(64)
    assert all(0 < v < 64 for v in values[1:5])
    assert mg.metrics[0].metricInfo.shortName == b"gr_util"

    s1, s2 = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    lib.nvmlGpmSampleGet(h, s1)
    clock.t += 0.05
    lib.nvmlGpmSampleGet(h, s2)
    close = pynvml.c_nvmlGpmMetricsGet_t()
    close.version, close.numMetrics, close.sample1, close.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 1, s1, s2
    close.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpmMetricsGet(close)
    clock.t += 1
    lib.nvmlGpmSampleGet(h, s2)
    close.version = 2
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpmMetricsGet(close)


def test_gpm_per_gpu_instance(clock: Clock) -> None:
    lib = opened("p5-mig", clock)
    h = lib.nvmlDeviceGetHandleByIndex(2)  # 4g.40gb (GI 1) + 3g.40gb (GI 2)
    lib.set_load(2, 80, slice_index=0)
    lib.set_load(2, 20, slice_index=1)
    assert metrics_between(lib, clock, h, 2.0, gi=1).metrics[0].value == pytest.approx(80)
    assert metrics_between(lib, clock, h, 2.0, gi=2).metrics[0].value == pytest.approx(20)
    whole = metrics_between(lib, clock, h, 2.0).metrics[0].value
    assert whole == pytest.approx((4 * 80 + 3 * 20) / 7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlGpmMigSampleGet(h, 9, lib.nvmlGpmSampleAlloc())


# -- failure injection and call counting


def test_failures_by_gpu_slice_and_count(p4d: FakeNvml) -> None:
    h0, h4 = p4d.nvmlDeviceGetHandleByIndex(0), p4d.nvmlDeviceGetHandleByIndex(4)
    p4d.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=4, times=2)
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_GpuIsLost) as err:
            p4d.nvmlDeviceGetMemoryInfo(h4)
        assert err.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    assert p4d.nvmlDeviceGetMemoryInfo(h4).total > 0
    assert p4d.nvmlDeviceGetMemoryInfo(h0).total > 0

    slices = mig_handles(p4d, 0)
    p4d.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, gpu=0, slice_index=2)
    with pytest.raises(pynvml.NVMLError_Unknown):
        p4d.nvmlDeviceGetMemoryInfo(slices[2])
    p4d.nvmlDeviceGetMemoryInfo(slices[1])
    p4d.nvmlDeviceGetMemoryInfo(h0)

    p4d.fail("nvmlDeviceGetComputeRunningProcesses", LIBRARY_MISMATCH)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        p4d.nvmlDeviceGetComputeRunningProcesses(h4)
    assert len(p4d.nvmlDeviceGetComputeRunningProcesses_v2(h4)) == 2
    p4d.clear_failures()
    p4d.nvmlDeviceGetMemoryInfo(slices[2])
    assert len(p4d.nvmlDeviceGetComputeRunningProcesses(h4)) == 2
    with pytest.raises(ValueError):
        p4d.fail("nvmlNoSuchCall", pynvml.NVML_ERROR_UNKNOWN)


def test_injected_init_failure(clock: Clock) -> None:
    lib = fake_nvml.load("p5", clock=clock)
    lib.fail("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, times=1)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        lib.nvmlInit()
    lib.nvmlInit()
    assert lib.nvmlDeviceGetCount() == 8
    assert lib.calls["nvmlInit"] == 2


def test_calls_are_counted(p4d: FakeNvml) -> None:
    h = p4d.nvmlDeviceGetHandleByIndex(0)
    for _ in range(3):
        p4d.nvmlDeviceGetUUID(h)
    assert p4d.calls["nvmlDeviceGetUUID"] == 3
    assert p4d.calls["nvmlDeviceGetHandleByIndex"] == 1


def test_an_interval_of_calls_is_cheap(p4d: FakeNvml, clock: Clock) -> None:
    handles = [p4d.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    slices = [m for g in range(4) for m in mig_handles(p4d, g).values()]
    v2 = pynvml.nvmlMemory_v2
    start = time.perf_counter()
    for _ in range(10):
        clock.t += 10
        for h in handles:
            p4d.nvmlDeviceGetMemoryInfo(h, version=v2)
            p4d.nvmlDeviceGetComputeRunningProcesses(h)
            p4d.nvmlDeviceGetTotalEnergyConsumption(h)
            p4d.nvmlDeviceGetPowerUsage(h)
            p4d.nvmlDeviceGetTemperatureV(h, 0)
            p4d.nvmlDeviceGetClockInfo(h, 1)
        for m in slices:
            p4d.nvmlDeviceGetMemoryInfo(m, version=v2)
            p4d.nvmlDeviceGetComputeRunningProcesses(m)
    per_call = (time.perf_counter() - start) / (10 * (8 * 6 + len(slices) * 2))
    assert per_call < 100e-6


# -- work that starts and stops: office hours, a job that ended


WEDNESDAY = 1_768_348_800.0  # 2026-01-14 00:00 UTC


def _busy_and_procs(lib: FakeNvml, gpu: int) -> tuple[int, int]:
    h = lib.nvmlDeviceGetHandleByIndex(gpu)
    return lib.nvmlDeviceGetUtilizationRates(h).gpu, len(lib.nvmlDeviceGetComputeRunningProcesses(h))


def test_office_hours_work_on_weekdays_in_the_teams_time_zone() -> None:
    clock = Clock(WEDNESDAY + 16 * 3600)  # 11:00 in UTC-5
    lib = opened("p4d-train", clock)
    for gpu in range(8):
        util, procs = _busy_and_procs(lib, gpu)
        assert util >= 75 and procs == 1
    for t in (WEDNESDAY + 5 * 3600, WEDNESDAY + 3 * 86400 + 16 * 3600):  # 00:00 local; Saturday 11:00
        clock.t = t
        for gpu in range(8):
            assert _busy_and_procs(lib, gpu) == (0, 0)
            memory = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(gpu), version=pynvml.nvmlMemory_v2)
            assert memory.used == 0


def test_office_hours_start_and_end_with_the_day_for_every_gpu() -> None:
    clock = Clock(WEDNESDAY)
    lib = opened("p4d-train", clock)
    for day in range(5):  # Wednesday to Sunday
        hours = []
        for hour in range(24):
            clock.t = WEDNESDAY + day * 86400 + (hour + 5) * 3600 + 1800
            working = {_busy_and_procs(lib, gpu)[1] for gpu in range(8)}
            assert len(working) == 1  # the whole team starts and stops together
            if working == {1}:
                hours.append(hour)
        if day < 3:
            assert hours[0] in (8, 9, 10) and hours[-1] in (17, 18, 19)
            assert hours == list(range(hours[0], hours[-1] + 1))
        else:
            assert hours == []


def test_a_job_that_ended_before_the_epoch_leaves_an_idle_gpu(clock: Clock) -> None:
    lib = fake_nvml.load("g5-forgotten", clock=clock, epoch=clock.t)
    lib.nvmlInit()
    assert _busy_and_procs(lib, 0) == (0, 0)
    clock.t -= 102 * 3600 + 60
    util, procs = _busy_and_procs(lib, 0)
    assert 45 <= util <= 65 and procs == 1
    # Without an epoch the story is told from the clock's reading when loaded.
    assert fake_nvml.load("g5-forgotten", clock=clock).epoch == clock.t


def test_truth_is_what_the_agent_measures() -> None:
    from agent.collect import Collector
    from agent.nvml import Nvml

    for scenario in ("p5-inference", "g5-batch", "p4d-shared"):
        clock = Clock(WEDNESDAY + 16 * 3600)
        lib = fake_nvml.load(scenario, clock=clock, seed=4)
        collector = Collector(Nvml.open(lib), clock=clock)
        collector.start()
        t0 = clock.t
        clock.t += 10
        interval = collector.collect()
        truth = lib.truth(t0, clock.t)
        assert {r.uuid for r in interval.readings} == set(truth)
        for r in interval.readings:
            expect = truth[r.uuid]
            if r.util is not None:
                # GPM integrates exactly; the sample buffer holds whole percents, 6 a second.
                assert r.util == pytest.approx(expect.util, abs=0.01 if r.util_source == "nvml.gpm" else 1.5)
            if r.sm_active is not None:
                assert r.sm_active == pytest.approx(expect.sm_active, abs=0.01)
            assert (r.mem_used_mib, r.procs, r.procs_mem_mib) == (
                expect.mem_used_mib,
                expect.procs,
                expect.procs_mem_mib,
            )
            if r.power_w is not None:
                assert r.power_w == pytest.approx(expect.power_w, abs=0.01)
        assert lib.truth(t0, clock.t) == truth  # no state changes


def test_truth_over_an_hour_is_the_mean_of_its_parts(clock: Clock) -> None:
    lib = fake_nvml.load("g5-batch", clock=clock, seed=2)
    whole = lib.truth(clock.t, clock.t + 3600)
    parts = [lib.truth(clock.t + k * 300, clock.t + (k + 1) * 300) for k in range(12)]
    for uuid, expect in whole.items():
        assert expect.util == pytest.approx(sum(p[uuid].util for p in parts) / 12)
    with pytest.raises(ValueError):
        lib.truth(clock.t, clock.t)
