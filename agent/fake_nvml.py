"""A stand-in for the `pynvml` module: simulated GPU hosts for tests and demos.

`load(scenario)` returns a `FakeNvml` that the agent uses exactly like `pynvml`: the same function names,
arguments, return types and exceptions. Constants, ctypes structs and the `NVMLError` classes are the real
module's own objects (looked up on first use), so `except lib.NVMLError_NotSupported` and
`err.value == lib.NVML_ERROR_NOT_SUPPORTED` behave as on real hardware. Functions the fake does not simulate
answer `NVMLError_NotSupported`.

Everything that changes over time (utilization, power and energy, the utilization sample buffer, GPM samples,
the processes of work that starts and stops) is a function of `clock()`, `seed` and `epoch`, so a test that
drives a fake clock gets the same answers every run. Handles are real `c_nvmlDevice_t` pointers to private
addresses; a fresh pointer object comes back on every call, as from the real bindings.

`FakeNvml.truth(t1, t2)` gives what every device did over a span of clock time, worked out exactly rather than
sampled: history written from it matches what an agent reading the same scenario live reports.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import importlib
import math
import struct
import time
import types
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Imported by name, not statement: pynvml ships without type information.
_nv: Any = importlib.import_module("pynvml")

LIBRARY_MISMATCH = -1
"""Pass to `FakeNvml.fail` as the error to raise `pynvml.NVMLLibraryMismatchError` instead of an `NVMLError`."""

SCENARIOS: dict[str, str] = {
    "p4d-mig": "p4d.24xlarge: 8x A100-SXM4-40GB; GPUs 0-3 in MIG mode (mixed layouts, a sparse index), 4-7 whole",
    "p5-mig": "p5.48xlarge: 8x H100 80GB HBM3, all in MIG mode with mixed profiles and free slices; GPM",
    "p5": "p5.48xlarge: 8x H100 80GB HBM3, MIG off, varied load; GPM",
    "g5-idle": "g5.xlarge: 1x A10G, idle, sample buffer mostly dry, no processes",
    "g6e-busy": "g6e.12xlarge: 4x L40S, busy 80-100% with most memory held; ECC off on GPU 2",
    "p4d-train": "p4d.24xlarge: 8x A100-SXM4-40GB training on weekdays from 8-10 to 18-20 (UTC-5), "
    "idle with no process at night and at weekends (clock: UTC epoch seconds)",
    "g5-forgotten": "g5.xlarge: 1x A10G, a fine-tuning job until 102 h before the epoch, idle and empty since",
    "p5-inference": "p5.48xlarge: 8x H100 80GB HBM3 in MIG mode serving inference: two slices unused, "
    "one compute slice in no GPU instance; GPM",
    "g5-batch": "g5.12xlarge: 4x A10G running batch jobs of 15 minutes that start and stop",
    "p4d-shared": "p4d.24xlarge: 8x A100-SXM4-40GB, all in MIG mode and shared: NVML measures no slice "
    "utilization; one slice has no process",
    "p5-train": "p5.48xlarge: 8x H100 80GB HBM3, MIG off, training at 80-90% with short pauses; GPM",
    "no-gpu": "a host whose driver loads but sees no GPU",
    "no-driver": "a host without the NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound",
}

_MIB = 1024 * 1024
_NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
_MIG_SLICES = 7  # compute slices of a MIG-capable GPU
_SAMPLE_PERIOD_US = 166_667  # the driver samples utilization every 1/6 s
_SAMPLE_SLOTS = 120  # samples the ring buffer holds (20 s)
_GPM_MIN_GAP_S = 0.1  # GPM refuses sample pairs closer than 100 ms
_SAMPLE = struct.Struct("=QI4x")  # c_nvmlSample_t: timeStamp, then an 8-byte union read through uiVal
_U64 = (1 << 64) - 1
_HELPERS = frozenset({"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"})

# Utilization wobble around a job's level: two sinusoids with relative amplitudes A1 and A2, so a level of at
# most 90 % never leaves 0-100 and the integral over time stays in closed form.
_A1 = 0.07
_A2 = 0.03

_IDLE, _STEADY, _JOBS, _OFFICE = 0, 1, 2, 3
_HOUR = 3600.0


def _mix(x: int) -> int:
    """A 64-bit integer hash (splitmix64 finaliser): the fake's only source of randomness."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def _rand(key: int, n: int) -> float:
    """The n-th uniform number in [0, 1) of the stream `key`."""
    return _mix(key ^ _mix(n & _U64)) / 2.0**64


def _key(*parts: object) -> int:
    return _mix(zlib.crc32("/".join(map(str, parts)).encode()))


def _uuid(key: int) -> str:
    return str(uuid.UUID(int=(_mix(key) << 64) | _mix(key ^ 0x5555), version=4))


def _error(code: int) -> Exception:
    # NVMLError.__new__ returns the subclass registered for the code, as _nvmlCheckReturn raises it.
    exc: Exception = _nv.NVMLError(code)
    return exc


# ---------------------------------------------------------------------------------------------------------------
# What the scenarios are made of


@dataclass(frozen=True, slots=True)
class _Profile:
    """A MIG GPU-instance profile as NVML's device attributes describe it (memory in MiB)."""

    slices: int
    memory_mb: int
    sms: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int


@dataclass(frozen=True, slots=True)
class _Model:
    name: str
    total_mib: int
    reserved_mib: int
    arch: int
    tdp_w: float
    idle_w: float
    sm_idle_mhz: int
    sm_boost_mhz: int
    mem_mhz: int
    video_mhz: int
    temp_idle_c: float
    temp_busy_c: float
    pci_device_id: int
    gpm: str  # "yes": Hopper GPM; "no": isSupportedDevice 0; "error": the support query raises NotSupported
    profiles: dict[str, _Profile] = field(default_factory=dict)

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)


_A100 = _Model(
    "NVIDIA A100-SXM4-40GB", 40960, 438, 7, 400.0, 52.0, 210, 1410, 1215, 1155, 31.0, 67.0, 0x20B010DE, "no",
    {
        "1g.5gb": _Profile(1, 4864, 14, 1, 0, 0, 0),
        "2g.10gb": _Profile(2, 9728, 28, 2, 1, 0, 0),
        "3g.20gb": _Profile(3, 19968, 42, 3, 2, 0, 0),
        "4g.20gb": _Profile(4, 19968, 56, 4, 2, 0, 0),
        "7g.40gb": _Profile(7, 40192, 98, 7, 5, 1, 1),
    },
)  # fmt: skip
_H100 = _Model(
    "NVIDIA H100 80GB HBM3", 81559, 521, 9, 700.0, 71.0, 345, 1980, 2619, 1755, 29.0, 71.0, 0x233010DE, "yes",
    {
        "1g.10gb": _Profile(1, 9856, 16, 1, 1, 1, 0),
        "1g.20gb": _Profile(1, 19968, 26, 1, 1, 1, 0),
        "2g.20gb": _Profile(2, 19968, 32, 2, 2, 2, 0),
        "3g.40gb": _Profile(3, 40448, 60, 3, 3, 3, 0),
        "4g.40gb": _Profile(4, 40448, 64, 4, 4, 4, 0),
        "7g.80gb": _Profile(7, 80896, 132, 8, 7, 7, 1),
    },
)  # fmt: skip
_A10G = _Model("NVIDIA A10G", 23028, 354, 7, 300.0, 16.0, 210, 1710, 6251, 1530, 24.0, 68.0, 0x223710DE, "error")
_L40S = _Model("NVIDIA L40S", 46068, 533, 8, 350.0, 33.0, 210, 2520, 9001, 1965, 27.0, 73.0, 0x26B910DE, "no")


@dataclass(frozen=True, slots=True)
class _Load:
    """How a compute unit's utilization behaves: idle, steady at `level` %, jobs that start and stop, or work in
    office hours. With `until_s`, all work (and the unit's processes) ends that many seconds after the epoch."""

    kind: int
    level: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    p_on: float = 0.0
    seg_s: float = 300.0
    dry: bool = False  # the driver stops filling the sample buffer while the GPU is idle
    utc_offset_h: int = 0  # office hours: the team's time zone
    until_s: float | None = None


_NO_LOAD = _Load(_IDLE)
_NO_LOAD_DRY = _Load(_IDLE, dry=True)


def _steady(level: float) -> _Load:
    return _Load(_STEADY, level=level)


def _jobs(lo: float, hi: float, p_on: float, seg_s: float = 300.0, *, dry: bool = False) -> _Load:
    """Segments of `seg_s` seconds, each busy with probability `p_on` at a level drawn from [lo, hi]."""
    return _Load(_JOBS, lo=lo, hi=hi, p_on=p_on, seg_s=seg_s, dry=dry)


def _office(lo: float, hi: float, utc_offset_h: int) -> _Load:
    """Busy at a level drawn from [lo, hi] for each hour of the working day (weekdays, starting at 8, 9 or 10 and
    ending at 18, 19 or 20 local time, the same for every unit), idle otherwise; the unit's processes run only
    while it works. Reads the clock as UTC epoch seconds."""
    return _Load(_OFFICE, lo=lo, hi=hi, seg_s=_HOUR, dry=True, utc_offset_h=utc_offset_h)


def _ending(load: _Load, until_s: float) -> _Load:
    """`load` until `until_s` seconds after the epoch (negative: before it); idle, with no process, after."""
    return dataclasses.replace(load, until_s=until_s)


@dataclass(frozen=True, slots=True)
class _CiSpec:
    index: int  # MIG device index under the parent
    ci_id: int
    slices: int  # compute slices of this compute instance (at most its GPU instance's)
    load: _Load
    procs_mib: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _GiSpec:
    gi_id: int
    profile: str
    cis: tuple[_CiSpec, ...]


@dataclass(frozen=True, slots=True)
class _GpuSpec:
    load: _Load = _NO_LOAD
    procs_mib: tuple[int, ...] = ()
    mig: tuple[_GiSpec, ...] | None = None
    ecc: bool = True


def _gi(gi_id: int, profile: str, index: int, load: _Load, *procs_mib: int) -> _GiSpec:
    """A GPU instance holding one compute instance of its full size."""
    slices = int(profile.split("g", 1)[0])
    return _GiSpec(gi_id, profile, (_CiSpec(index, 0, slices, load, procs_mib),))


@dataclass(frozen=True, slots=True)
class _Scenario:
    model: _Model | None
    gpus: tuple[_GpuSpec, ...]
    bus_ids: tuple[int, ...] = ()
    driver: bool = True


def _scenario(name: str) -> _Scenario:
    if name == "p4d-mig":
        return _Scenario(
            _A100,
            (
                _GpuSpec(
                    mig=(
                        _gi(7, "1g.5gb", 0, _jobs(20, 85, 0.7), 3800),
                        _gi(8, "1g.5gb", 1, _NO_LOAD),
                        _gi(9, "1g.5gb", 2, _steady(75), 4200),
                        _gi(10, "1g.5gb", 3, _NO_LOAD, 4000),
                        _gi(11, "1g.5gb", 4, _jobs(10, 60, 0.5), 2000),
                        _gi(12, "1g.5gb", 5, _NO_LOAD),
                        _gi(13, "1g.5gb", 6, _steady(35), 1500),
                    )
                ),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.20gb", 0, _steady(60), 12000, 3000),
                        _gi(3, "2g.10gb", 1, _jobs(15, 70, 0.6), 6000),
                        _gi(9, "1g.5gb", 2, _NO_LOAD),
                    )
                ),
                _GpuSpec(
                    mig=(_gi(1, "4g.20gb", 0, _steady(85), 18000), _gi(2, "3g.20gb", 1, _jobs(30, 90, 0.5), 9000))
                ),
                _GpuSpec(
                    mig=(
                        # One 2g GPU instance split into two 1-slice compute instances; MIG index 1 is empty.
                        _GiSpec(3, "2g.10gb", (_CiSpec(0, 0, 1, _steady(50), (3000,)), _CiSpec(2, 1, 1, _NO_LOAD))),
                        _gi(2, "3g.20gb", 3, _jobs(10, 80, 0.4), 14000),
                    )
                ),
                _GpuSpec(_jobs(10, 90, 0.6), (22000, 4000)),
                _GpuSpec(_steady(88), (36000,)),
                _GpuSpec(_NO_LOAD, (30000,)),  # idle-held: memory allocated, nothing running
                _GpuSpec(_NO_LOAD_DRY),
            ),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
        )
    if name == "p5-mig":
        return _Scenario(
            _H100,
            (
                _GpuSpec(
                    mig=(
                        _gi(7, "1g.10gb", 0, _steady(80), 8000),
                        _gi(8, "1g.10gb", 1, _jobs(20, 90, 0.6), 6000),
                        _gi(9, "1g.10gb", 2, _NO_LOAD),
                        _gi(10, "1g.10gb", 3, _steady(45), 5000),
                        _gi(11, "1g.10gb", 4, _NO_LOAD, 7000),
                        _gi(12, "1g.10gb", 5, _jobs(10, 50, 0.4), 3000),
                        _gi(13, "1g.10gb", 6, _steady(20), 2000),
                    )
                ),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.40gb", 0, _steady(70), 30000),
                        _gi(3, "2g.20gb", 1, _jobs(15, 85, 0.5), 12000),
                        _gi(9, "1g.10gb", 2, _NO_LOAD),
                    )
                ),
                _GpuSpec(mig=(_gi(1, "4g.40gb", 0, _steady(90), 38000), _gi(2, "3g.40gb", 1, _steady(30), 20000))),
                _GpuSpec(mig=(_gi(0, "7g.80gb", 0, _jobs(40, 90, 0.8), 70000),)),
                _GpuSpec(
                    mig=(
                        _gi(3, "2g.20gb", 0, _steady(65), 15000),
                        _gi(4, "2g.20gb", 1, _NO_LOAD, 10000),
                        _gi(5, "2g.20gb", 2, _jobs(20, 75, 0.5), 9000),
                        _gi(13, "1g.10gb", 3, _steady(10), 1000),
                    )
                ),
                _GpuSpec(
                    mig=(
                        _gi(9, "1g.20gb", 0, _steady(55), 16000),
                        _gi(10, "1g.20gb", 1, _NO_LOAD),
                        _gi(11, "1g.20gb", 2, _jobs(10, 60, 0.3), 8000),
                        _gi(12, "1g.20gb", 3, _NO_LOAD),
                    )
                ),
                _GpuSpec(
                    mig=(_gi(1, "3g.40gb", 0, _steady(85), 35000), _gi(2, "3g.40gb", 1, _jobs(5, 40, 0.5), 12000))
                ),
                _GpuSpec(mig=(_gi(1, "4g.40gb", 0, _NO_LOAD, 25000),)),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "p5":
        return _Scenario(
            _H100,
            (
                _GpuSpec(_steady(90), (70000,)),
                _GpuSpec(_steady(82), (65000,)),
                _GpuSpec(_jobs(20, 90, 0.7), (40000,)),
                _GpuSpec(_jobs(10, 70, 0.5), (30000, 8000)),
                _GpuSpec(_steady(60), (50000,)),
                _GpuSpec(_NO_LOAD, (40000,)),
                _GpuSpec(_NO_LOAD),
                _GpuSpec(_jobs(5, 50, 0.3), (12000,)),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "g5-idle":
        return _Scenario(_A10G, (_GpuSpec(_jobs(3, 25, 0.1, 240.0, dry=True)),), (0x1E,))
    if name == "g6e-busy":
        return _Scenario(
            _L40S,
            (
                _GpuSpec(_steady(90), (42000,)),
                _GpuSpec(_steady(90), (40000, 2500)),
                _GpuSpec(_steady(89), (43000,), ecc=False),
                _GpuSpec(_steady(90), (41000,)),
            ),
            (0x38, 0x3A, 0x3C, 0x3E),
        )
    if name == "p4d-train":
        work = _office(78, 90, -5)
        return _Scenario(
            _A100,
            tuple(_GpuSpec(work, (30000 + 1000 * i,)) for i in range(8)),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
        )
    if name == "g5-forgotten":
        job = _ending(_Load(_STEADY, level=55.0, dry=True), -102 * _HOUR)
        return _Scenario(_A10G, (_GpuSpec(job, (17500,)),), (0x1E,))
    if name == "p5-inference":
        serve = _jobs(30, 80, 0.85, 600.0)
        return _Scenario(
            _H100,
            (
                _GpuSpec(mig=tuple(_gi(7 + k, "1g.10gb", k, _steady(40 + 6 * k), 6000 + 300 * k) for k in range(7))),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.40gb", 0, _steady(72), 32000),
                        _gi(3, "2g.20gb", 1, serve, 14000),
                        _gi(4, "2g.20gb", 2, _steady(48), 15000),
                    )
                ),
                _GpuSpec(mig=(_gi(1, "4g.40gb", 0, _steady(81), 36000), _gi(2, "3g.40gb", 1, serve, 28000))),
                _GpuSpec(mig=(_gi(0, "7g.80gb", 0, _steady(66), 72000),)),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.40gb", 0, _steady(58), 30000),
                        _gi(3, "2g.20gb", 1, serve, 12000),
                        _gi(9, "1g.10gb", 2, _steady(35), 5000),
                        _gi(10, "1g.10gb", 3, _NO_LOAD),  # unused
                    )
                ),
                _GpuSpec(
                    mig=(
                        _gi(3, "2g.20gb", 0, _steady(62), 16000),
                        _gi(4, "2g.20gb", 1, _NO_LOAD),  # unused
                        _gi(5, "2g.20gb", 2, serve, 13000),
                        _gi(13, "1g.10gb", 3, _steady(44), 6000),
                    )
                ),
                _GpuSpec(
                    mig=(
                        _gi(1, "4g.40gb", 0, _steady(76), 34000),
                        _gi(5, "2g.20gb", 1, serve, 15000),
                        _gi(13, "1g.10gb", 2, _steady(52), 7000),
                    )
                ),
                # 3 + 2 + 1 of 7 compute slices: one was never made into a GPU instance.
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.40gb", 0, _steady(69), 31000),
                        _gi(3, "2g.20gb", 1, serve, 14000),
                        _gi(9, "1g.10gb", 2, _steady(38), 6000),
                    )
                ),
            ),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "g5-batch":
        return _Scenario(
            _A10G,
            (
                _GpuSpec(_jobs(40, 90, 0.6, 900.0), (18000,)),
                _GpuSpec(_jobs(40, 90, 0.6, 900.0), (18500,)),
                _GpuSpec(_jobs(30, 90, 0.5, 900.0), (12000,)),
                _GpuSpec(_jobs(30, 90, 0.5, 900.0), (11000,)),
            ),
            (0x1B, 0x1C, 0x1D, 0x1E),
        )
    if name == "p4d-shared":
        return _Scenario(
            _A100,
            (
                _GpuSpec(mig=tuple(_gi(7 + k, "1g.5gb", k, _jobs(20, 80, 0.7), 3500 + 100 * k) for k in range(7))),
                _GpuSpec(mig=(_gi(1, "4g.20gb", 0, _steady(70), 17000), _gi(2, "3g.20gb", 1, _steady(55), 15000))),
                _GpuSpec(mig=(_gi(0, "7g.40gb", 0, _jobs(40, 90, 0.8), 36000),)),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.20gb", 0, _steady(64), 16000),
                        _gi(3, "2g.10gb", 1, _jobs(15, 70, 0.6), 8000),
                        _gi(9, "1g.5gb", 2, _steady(40), 4000),
                        _gi(10, "1g.5gb", 3, _NO_LOAD),  # no process
                    )
                ),
                _GpuSpec(
                    mig=(_gi(1, "4g.20gb", 0, _jobs(30, 90, 0.6), 18000), _gi(2, "3g.20gb", 1, _steady(48), 14000))
                ),
                _GpuSpec(
                    mig=(
                        _gi(2, "3g.20gb", 0, _steady(45), 14000),
                        _gi(3, "2g.10gb", 1, _steady(35), 8000),
                        _gi(4, "2g.10gb", 2, _jobs(20, 80, 0.7), 8000),
                    )
                ),
                _GpuSpec(mig=(_gi(0, "7g.40gb", 0, _steady(82), 38000),)),
                _GpuSpec(
                    mig=(_gi(2, "3g.20gb", 0, _jobs(20, 85, 0.7), 15000), _gi(1, "4g.20gb", 1, _steady(60), 18000))
                ),
            ),
            (0x10, 0x10, 0x20, 0x20, 0x90, 0x90, 0xA0, 0xA0),
        )
    if name == "p5-train":
        return _Scenario(
            _H100,
            tuple(_GpuSpec(_jobs(80, 90, 0.97, 1800.0), (72000 + 500 * i,)) for i in range(8)),
            (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
        )
    if name == "no-gpu":
        return _Scenario(None, ())
    if name == "no-driver":
        return _Scenario(None, (), driver=False)
    raise ValueError(f"unknown fake NVML scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")


# ---------------------------------------------------------------------------------------------------------------
# The simulation


def _working_hour(local_hour: int) -> bool:
    """Whether a local hour (counted from 1970-01-01 00:00, a Thursday) is in office hours: weekdays, from 8, 9 or
    10 to 18, 19 or 20 o'clock, varying by day."""
    day, hour = divmod(local_hour, 24)
    if (day + 3) % 7 >= 5:
        return False
    return 8 + _mix(2 * day) % 3 <= hour < 18 + _mix(2 * day + 1) % 3


class _Curve:
    """Utilization of one compute unit (a whole GPU or a MIG compute instance) over clock time, in percent."""

    __slots__ = (
        "_seg",
        "_seg_level",
        "dry",
        "f_dram",
        "f_mem",
        "f_occ",
        "f_sm",
        "f_tensor",
        "hi",
        "key",
        "kind",
        "level",
        "lo",
        "p1",
        "p2",
        "p_on",
        "pin",
        "seg_off",
        "seg_s",
        "until",
        "w1",
        "w2",
    )

    def __init__(self, load: _Load, key: int, epoch: float) -> None:
        self.kind = load.kind
        self.level = load.level
        self.lo = load.lo
        self.hi = load.hi
        self.p_on = load.p_on
        self.seg_s = load.seg_s
        self.dry = load.dry
        self.key = key
        self.until = None if load.until_s is None else epoch + load.until_s
        # Office hours count whole local hours; other work starts and stops at its own phase.
        self.seg_off = load.utc_offset_h * _HOUR if load.kind == _OFFICE else _rand(key, 1) * load.seg_s
        self.w1 = 2 * math.pi / (60.0 + 120.0 * _rand(key, 2))
        self.p1 = 2 * math.pi * _rand(key, 3)
        self.w2 = 2 * math.pi / (7.0 + 11.0 * _rand(key, 4))
        self.p2 = 2 * math.pi * _rand(key, 5)
        # How the other activity figures relate to utilization, per unit so that slices differ.
        self.f_sm = 0.85 + 0.13 * _rand(key, 6)
        self.f_occ = 0.30 + 0.35 * _rand(key, 7)
        self.f_tensor = 0.10 + 0.60 * _rand(key, 8)
        self.f_dram = 0.15 + 0.45 * _rand(key, 9)
        self.f_mem = 0.20 + 0.45 * _rand(key, 10)
        self.pin: float | None = None
        self._seg: int | None = None
        self._seg_level = 0.0

    def _level_of(self, seg: int) -> float:
        if self.kind == _OFFICE:
            if not _working_hour(seg):
                return 0.0
        elif _rand(self.key ^ 0xA5A5A5A5, 2 * seg) >= self.p_on:
            return 0.0
        return self.lo + (self.hi - self.lo) * _rand(self.key ^ 0xA5A5A5A5, 2 * seg + 1)

    def working(self, t: float) -> bool:
        """Whether the unit's processes exist at clock time `t`: not after `until`, nor outside office hours."""
        if self.until is not None and t >= self.until:
            return False
        return self.kind != _OFFICE or _working_hour(math.floor((t + self.seg_off) / self.seg_s))

    def at(self, t: float) -> float:
        """Utilization at clock time `t` (s), percent."""
        if self.pin is not None:
            return self.pin
        if self.kind == _IDLE or (self.until is not None and t >= self.until):
            return 0.0
        if self.kind == _STEADY:
            level = self.level
        else:
            seg = math.floor((t + self.seg_off) / self.seg_s)
            if seg != self._seg:
                self._seg, self._seg_level = seg, self._level_of(seg)
            level = self._seg_level
            if level == 0.0:
                return 0.0
        return level * (1.0 + _A1 * math.sin(self.w1 * t + self.p1) + _A2 * math.sin(self.w2 * t + self.p2))

    def _wobble(self, level: float, a: float, b: float) -> float:
        w1, w2, p1, p2 = self.w1, self.w2, self.p1, self.p2
        swing = _A1 * (math.cos(w1 * a + p1) - math.cos(w1 * b + p1)) / w1
        swing += _A2 * (math.cos(w2 * a + p2) - math.cos(w2 * b + p2)) / w2
        return level * ((b - a) + swing)

    def integral(self, t1: float, t2: float) -> float:
        """Integral of utilization over [t1, t2], percent-seconds."""
        if self.pin is not None:
            return self.pin * max(0.0, t2 - t1)
        if self.until is not None:
            t2 = min(t2, self.until)
        if t2 <= t1 or self.kind == _IDLE:
            return 0.0
        if self.kind == _STEADY:
            return self._wobble(self.level, t1, t2)
        total, a = 0.0, t1
        seg = math.floor((a + self.seg_off) / self.seg_s)
        while a < t2:
            end = min(t2, (seg + 1) * self.seg_s - self.seg_off)
            level = self._level_of(seg)
            if level and end > a:
                total += self._wobble(level, a, end)
            a = max(a, end)
            seg += 1
        return total


@dataclass(eq=False, slots=True)
class _Proc:
    pid: int
    used_bytes: int
    gi_id: int = _NO_ID
    ci_id: int = _NO_ID
    unit: _Curve | None = None  # the work it belongs to: the process exists while that unit is working


@dataclass(eq=False, slots=True)
class _Gi:
    gi_id: int
    profile: str
    spec: _Profile
    cis: list[_Mig] = field(default_factory=list)
    weights: list[tuple[float, _Curve]] = field(default_factory=list)  # CI share of this GI's compute


@dataclass(eq=False, slots=True)
class _Mig:
    parent: _Gpu
    index: int
    gi: _Gi
    ci_id: int
    ci_slices: int
    name: str
    uuid: str
    curve: _Curve
    handle: Any  # a c_nvmlDevice_t to copy for callers
    attrs: tuple[int, ...]


@dataclass(eq=False, slots=True)
class _Gpu:
    index: int
    model: _Model
    name: str
    uuid: str
    bus: int
    device: int
    ecc: bool
    handle: Any
    curve: _Curve | None  # None in MIG mode: the compute instances carry the load
    sample_phase_us: int
    energy_t: float
    energy_mj: float
    mig: dict[int, _Mig] = field(default_factory=dict)  # MIG device index -> device
    gis: dict[int, _Gi] = field(default_factory=dict)
    procs: list[_Proc] = field(default_factory=list)
    weights: list[tuple[float, _Curve]] = field(default_factory=list)  # share of the whole GPU's compute

    @property
    def mig_mode(self) -> bool:
        return self.curve is None


class Truth(NamedTuple):
    """What one GPU or MIG device did over a span of clock time, exactly.

    `util` and `sm_active` are means over the span in %: of a whole GPU, of a MIG device's GPU instance (what
    GPM reports for each of its devices), or of a MIG-mode GPU weighted by compute slices (GPM's whole-GPU
    figure). Memory in use (MiB, without driver-reserved memory; a MIG device: its GPU instance's) and the
    processes are those running at the middle of the span. Power (mean, W), temperature (°C) and SM clock
    (MHz) describe the board and are None for a MIG device.
    """

    util: float
    sm_active: float
    mem_used_mib: int
    procs: int
    procs_mem_mib: int
    power_w: float | None
    temp_c: int | None
    sm_clock_mhz: int | None


@dataclass(slots=True)
class _Failure:
    function: str
    error: int
    gpu: int | None
    slice_index: int | None
    times: int | None


@dataclass(eq=False, slots=True)
class _GpmSample:
    buffer: Any
    gpu: _Gpu | None = None
    gi: _Gi | None = None
    t: float = 0.0


_GPM_METRICS: dict[int, tuple[str, bytes, bytes]] = {
    1: ("graphics", b"gr_util", b"Graphics activity"),
    2: ("sm", b"sm_util", b"SM utilization"),
    3: ("occ", b"sm_occupancy", b"SM occupancy"),
    5: ("tensor", b"any_tensor_util", b"Any tensor activity"),
    10: ("dram", b"dram_bw_util", b"DRAM bandwidth utilization"),
}


class FakeNvml:
    """A simulated NVML: call it like the `pynvml` module. Build one with `load(scenario)`.

    `calls` counts the calls of every nvml* function by name. `fail`, `clear_failures`, `set_load`,
    `add_process` and `remove_process` steer the simulation from tests. The energy counters integrate power
    from the clock reading taken here, so with a fake clock they too are exact and repeatable.
    """

    def __init__(self, scenario: str, clock: Callable[[], float], seed: int, epoch: float | None = None) -> None:
        spec = _scenario(scenario)
        self.scenario = scenario
        self.seed = seed
        self.calls: collections.Counter[str] = collections.Counter()
        self._clock = clock
        self._driver = spec.driver
        self._refs = 0
        self._failures: list[_Failure] = []
        self._gpus: list[_Gpu] = []
        self._nodes: dict[int, _Gpu | _Mig] = {}
        self._gpm: dict[int, _GpmSample] = {}
        self._pids = 0
        base = _key(scenario, seed)
        # NVML timestamps count µs on the driver's own clock: here, a day or so of uptime ahead of `clock`.
        self._ts_offset_us = 86_400_000_000 + int(_rand(base, 1) * 3_600_000_000)
        nodes = len(spec.gpus) + sum(len(gi.cis) for g in spec.gpus for gi in (g.mig or ()))
        # Handles point into this buffer: one 8-byte cell per GPU and MIG device, never dereferenced.
        self._arena = ctypes.create_string_buffer(8 * max(1, nodes))
        t0 = clock()
        self.epoch = t0 if epoch is None else epoch
        for i, gspec in enumerate(spec.gpus):
            self._gpus.append(self._build_gpu(i, gspec, spec, t0))

    # -- construction

    def _handle(self) -> Any:
        cell = len(self._nodes)
        return ctypes.cast(ctypes.addressof(self._arena) + 8 * cell, _nv.c_nvmlDevice_t)

    def _pid(self, base: int) -> int:
        self._pids += 1
        return 1000 + int(_rand(base, 1000 + self._pids) * 3_000_000)

    def _build_gpu(self, i: int, gspec: _GpuSpec, spec: _Scenario, t0: float) -> _Gpu:
        model = spec.model
        assert model is not None
        key = _key(self.scenario, self.seed, i)
        mig = gspec.mig is not None
        gpu = _Gpu(
            index=i,
            model=model,
            name=model.name,
            uuid="GPU-" + _uuid(key),
            bus=spec.bus_ids[i],
            device=0x1C + i % 2 if spec.bus_ids.count(spec.bus_ids[i]) > 1 else 0,
            ecc=gspec.ecc,
            handle=self._handle(),
            curve=None if mig else _Curve(gspec.load, key, self.epoch),
            sample_phase_us=int(_rand(key, 20) * _SAMPLE_PERIOD_US),
            energy_t=t0,
            # The counter runs since the driver loaded: some days at idle power.
            energy_mj=model.idle_w * 1000.0 * 86_400 * (1 + 20 * _rand(key, 21)),
        )
        self._nodes[ctypes.addressof(gpu.handle.contents)] = gpu
        if gpu.curve is not None:
            gpu.weights = [(1.0, gpu.curve)]
            gpu.procs = [_Proc(self._pid(key), mib * _MIB, unit=gpu.curve) for mib in gspec.procs_mib]
            return gpu
        for gi_spec in gspec.mig or ():
            profile = model.profiles[gi_spec.profile]
            gi = _Gi(gi_spec.gi_id, gi_spec.profile, profile)
            gpu.gis[gi.gi_id] = gi
            for ci in gi_spec.cis:
                mkey = _key(self.scenario, self.seed, i, "mig", gi.gi_id, ci.ci_id)
                full = ci.slices == profile.slices
                name = f"{model.name} MIG {gi_spec.profile if full else f'{ci.slices}c.{gi_spec.profile}'}"
                attrs = (
                    profile.sms * ci.slices // profile.slices,
                    profile.copy_engines,
                    profile.decoders,
                    0,
                    profile.jpegs,
                    profile.ofas,
                    profile.slices,
                    ci.slices,
                    profile.memory_mb,
                )
                dev = _Mig(
                    parent=gpu,
                    index=ci.index,
                    gi=gi,
                    ci_id=ci.ci_id,
                    ci_slices=ci.slices,
                    name=name,
                    uuid="MIG-" + _uuid(mkey),
                    curve=_Curve(ci.load, mkey, self.epoch),
                    handle=self._handle(),
                    attrs=attrs,
                )
                self._nodes[ctypes.addressof(dev.handle.contents)] = dev
                gpu.mig[ci.index] = dev
                gi.cis.append(dev)
                gi.weights.append((ci.slices / profile.slices, dev.curve))
                gpu.weights.append((ci.slices / _MIG_SLICES, dev.curve))
                gpu.procs += [_Proc(self._pid(key), mib * _MIB, gi.gi_id, ci.ci_id, dev.curve) for mib in ci.procs_mib]
        gpu.mig = dict(sorted(gpu.mig.items()))
        return gpu

    # -- plumbing

    def __getattr__(self, name: str) -> Any:
        """Real constants, structs and error classes; un-simulated nvml* functions answer NotSupported."""
        try:
            value = getattr(_nv, name)
        except AttributeError:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}") from None
        if name.startswith("nvml") and isinstance(value, types.FunctionType) and name not in _HELPERS:
            value = self._unsupported(name)
        self.__dict__[name] = value
        return value

    def _unsupported(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._begin(name)
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)

        call.__name__ = call.__qualname__ = name
        return call

    def _begin(self, name: str) -> None:
        """Count the call; raise as the real library does before init, or as a failure injected for all."""
        self.calls[name] += 1
        if not self._refs:
            raise _error(_nv.NVML_ERROR_UNINITIALIZED)
        if self._failures:
            self._check(name, None, None)

    def _node(self, name: str, handle: Any) -> _Gpu | _Mig:
        """Count the call, check init, resolve the handle and apply injected failures."""
        self.calls[name] += 1
        if not self._refs:
            raise _error(_nv.NVML_ERROR_UNINITIALIZED)
        try:
            node = self._nodes.get(ctypes.addressof(handle.contents))
        except (AttributeError, TypeError, ValueError):
            node = None
        if node is None:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            if isinstance(node, _Gpu):
                self._check(name, node.index, None)
            else:
                self._check(name, node.parent.index, node.index)
        return node

    def _gpu(self, name: str, handle: Any) -> _Gpu:
        """Like `_node` for calls about the whole board: a MIG device handle answers NotSupported."""
        node = self._node(name, handle)
        if isinstance(node, _Mig):
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return node

    def _check(self, name: str, gpu: int | None, slice_index: int | None) -> None:
        for rule in self._failures:
            if rule.function != name:
                continue
            if rule.gpu is not None and (
                rule.gpu != gpu or (rule.slice_index is not None and rule.slice_index != slice_index)
            ):
                continue
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._failures.remove(rule)
            if rule.error == LIBRARY_MISMATCH:
                raise _nv.NVMLLibraryMismatchError(
                    "Unversioned function called and the pyNVML version does not match the NVML lib version."
                )
            raise _error(rule.error)

    def _now(self) -> float:
        return self._clock()

    def _ts_us(self, t: float) -> int:
        return int(t * 1e6) + self._ts_offset_us

    @staticmethod
    def _busy(gpu: _Gpu, t: float) -> float:
        """Whole-GPU utilization at `t`, percent: the compute-weighted sum over its units."""
        return sum(w * c.at(t) for w, c in gpu.weights)

    def _energy(self, gpu: _Gpu, t: float) -> int:
        if t > gpu.energy_t:
            model = gpu.model
            busy = sum(w * c.integral(gpu.energy_t, t) for w, c in gpu.weights)
            gpu.energy_mj += 1000.0 * (model.idle_w * (t - gpu.energy_t) + (model.tdp_w - model.idle_w) * busy / 100.0)
            gpu.energy_t = t
        return int(gpu.energy_mj)

    def _device_handle(self, node: _Gpu | _Mig) -> Any:
        return _nv.c_nvmlDevice_t.from_buffer_copy(node.handle)

    # -- test controls

    def fail(
        self,
        function: str,
        error: int,
        *,
        gpu: int | None = None,
        slice_index: int | None = None,
        times: int | None = None,
    ) -> None:
        """Make calls of `function` raise NVMLError(`error`) (or `LIBRARY_MISMATCH`).

        Scope: every call (`gpu=None`), calls on GPU `gpu` and its MIG devices, or only calls on its MIG device
        `slice_index`. The first `times` matching calls fail (`None`: all of them). For nvmlInit with
        NVML_ERROR_LIBRARY_NOT_FOUND this is a host without a driver.
        """
        if not isinstance(getattr(_nv, function, None), types.FunctionType):
            raise ValueError(f"pynvml has no function {function!r}")
        if slice_index is not None and gpu is None:
            raise ValueError("slice_index needs gpu")
        if times is not None and times < 1:
            raise ValueError("times must be at least 1")
        self._failures.append(_Failure(function, error, gpu, slice_index, times))

    def clear_failures(self) -> None:
        self._failures.clear()

    def _target(self, gpu: int, slice_index: int | None) -> tuple[_Gpu, _Mig | None]:
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu} in scenario {self.scenario!r}")
        g = self._gpus[gpu]
        if slice_index is None:
            return g, None
        if slice_index not in g.mig:
            raise ValueError(f"GPU {gpu} has no MIG device at index {slice_index}")
        return g, g.mig[slice_index]

    def set_load(self, gpu: int, util: float | None, *, slice_index: int | None = None) -> None:
        """Pin utilization (percent) of a GPU, or of one of its MIG devices; `None` lets it move again.

        The pin holds for all times, sample history and GPM included, so tests get exact answers; the energy
        counter only integrates it from now on. On a MIG-mode GPU without `slice_index` every MIG device is
        pinned.
        """
        if util is not None and not 0.0 <= util <= 100.0:
            raise ValueError("util is a percentage, 0-100")
        g, dev = self._target(gpu, slice_index)
        self._energy(g, self._now())
        for _, curve in [(1.0, dev.curve)] if dev is not None else g.weights:
            curve.pin = util

    def add_process(self, gpu: int, pid: int, used_mib: int, *, slice_index: int | None = None) -> None:
        """A compute process holding `used_mib` MiB on a GPU, or on one MIG device of a MIG-mode GPU."""
        g, dev = self._target(gpu, slice_index)
        if g.mig_mode and dev is None:
            raise ValueError(f"GPU {gpu} is in MIG mode: name the MIG device (slice_index)")
        proc = _Proc(pid, used_mib * _MIB)
        if dev is not None:
            proc.gi_id, proc.ci_id = dev.gi.gi_id, dev.ci_id
        g.procs.append(proc)

    def remove_process(self, gpu: int, pid: int) -> None:
        """Remove every entry of process `pid` from GPU `gpu` (KeyError when it has none)."""
        g, _ = self._target(gpu, None)
        kept = [p for p in g.procs if p.pid != pid]
        if len(kept) == len(g.procs):
            raise KeyError(pid)
        g.procs = kept

    # -- the simulation's own answers

    def truth(self, t1: float, t2: float) -> dict[str, Truth]:
        """Every GPU's and MIG device's figures over clock time [t1, t2], by UUID: the exact integrals an
        ideal collector would measure, not one sampled reading. Needs no nvmlInit and changes no state."""
        if not t2 > t1:
            raise ValueError("t2 must be after t1")
        span = t2 - t1
        mid = t1 + span / 2
        out: dict[str, Truth] = {}
        for gpu in self._gpus:
            means = {id(c): c.integral(t1, t2) / span for _, c in gpu.weights}
            busy = sum(w * means[id(c)] for w, c in gpu.weights)
            sm = sum(w * means[id(c)] * c.f_sm for w, c in gpu.weights)
            running = [p for p in gpu.procs if p.unit is None or p.unit.working(mid)]
            held = sum(p.used_bytes for p in running) // _MIB
            m = gpu.model
            out[gpu.uuid] = Truth(
                busy,
                sm,
                held,
                len(running),
                held,
                m.idle_w + (m.tdp_w - m.idle_w) * busy / 100.0,
                int(m.temp_idle_c + (m.temp_busy_c - m.temp_idle_c) * busy / 100.0 + 0.5),
                m.sm_boost_mhz if busy >= 1.0 else m.sm_idle_mhz,
            )
            for gi in gpu.gis.values():
                gi_util = sum(w * means[id(c)] for w, c in gi.weights)
                gi_sm = sum(w * means[id(c)] * c.f_sm for w, c in gi.weights)
                in_gi = [p for p in running if p.gi_id == gi.gi_id]
                gi_held = sum(p.used_bytes for p in in_gi) // _MIB
                for dev in gi.cis:
                    own = [p.used_bytes for p in in_gi if p.ci_id == dev.ci_id]
                    out[dev.uuid] = Truth(gi_util, gi_sm, gi_held, len(own), sum(own) // _MIB, None, None, None)
        return out

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
        if not self._driver:
            raise _error(_nv.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._refs += 1

    def nvmlShutdown(self) -> None:
        self._begin("nvmlShutdown")
        self._refs -= 1

    def nvmlErrorString(self, result: int) -> str:
        self.calls["nvmlErrorString"] += 1
        text: str = _nv.NVMLError._errcode_to_string.get(result, "Unknown Error")
        return text

    def nvmlSystemGetDriverVersion(self) -> str:
        self._begin("nvmlSystemGetDriverVersion")
        return "550.127.05"

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._begin("nvmlSystemGetNVMLVersion")
        return "12.550.127.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._begin("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._begin("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

    # -- enumeration and identity

    def nvmlDeviceGetCount(self) -> int:
        self._begin("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if not self._refs:
            raise _error(_nv.NVML_ERROR_UNINITIALIZED)
        if self._failures:
            self._check("nvmlDeviceGetHandleByIndex", index, None)
        if not 0 <= index < len(self._gpus):
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(self._gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._begin("nvmlDeviceGetHandleByUUID")
        for node in self._nodes.values():
            if node.uuid == uuid:
                return self._device_handle(node)
        raise _error(_nv.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._node("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._node("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetArchitecture", device)
        gpu = node if isinstance(node, _Gpu) else node.parent
        return gpu.model.arch

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        return self._pci(self._gpu("nvmlDeviceGetPciInfo_v3", handle))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self._pci(self._gpu("nvmlDeviceGetPciInfo", handle))

    @staticmethod
    def _pci(gpu: _Gpu) -> Any:
        info = _nv.nvmlPciInfo_t()
        info.busIdLegacy = f"0000:{gpu.bus:02X}:{gpu.device:02X}.0".encode()
        info.busId = f"00000000:{gpu.bus:02X}:{gpu.device:02X}.0".encode()
        info.domain, info.bus, info.device = 0, gpu.bus, gpu.device
        info.pciDeviceId = gpu.model.pci_device_id
        info.pciSubSystemId = 0x145110DE
        return info

    # -- memory and processes

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """Bytes. Without `version`, `used` includes driver-reserved memory; with nvmlMemory_v2 it does not."""
        node = self._node("nvmlDeviceGetMemoryInfo", handle)
        if version and version != _nv.nvmlMemory_v2:
            raise _error(_nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, used = self._memory(node, self._now())
        free = max(0, total - reserved - used)
        if not version:
            return _nv.c_nvmlMemory_t(total, free, used + reserved)
        return _nv.c_nvmlMemory_v2_t(version, total, reserved, free, used)

    @staticmethod
    def _running(node: _Gpu | _Mig, t: float) -> list[_Proc]:
        """The processes on a GPU (its MIG devices' included) or on one MIG device at clock time `t`."""
        if isinstance(node, _Gpu):
            return [p for p in node.procs if p.unit is None or p.unit.working(t)]
        gi_id, ci_id = node.gi.gi_id, node.ci_id
        return [
            p
            for p in node.parent.procs
            if p.gi_id == gi_id and p.ci_id == ci_id and (p.unit is None or p.unit.working(t))
        ]

    @staticmethod
    def _memory(node: _Gpu | _Mig, t: float) -> tuple[int, int, int]:
        """(total, reserved, used by processes) in bytes at clock time `t`; a MIG device has its GPU instance's."""
        if isinstance(node, _Gpu):
            used = sum(p.used_bytes for p in node.procs if p.unit is None or p.unit.working(t))
            return node.model.total_mib * _MIB, node.model.reserved_mib * _MIB, used
        gi_id = node.gi.gi_id
        used = sum(
            p.used_bytes for p in node.parent.procs if p.gi_id == gi_id and (p.unit is None or p.unit.working(t))
        )
        return node.gi.spec.memory_mb * _MIB, 0, used

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._procs(self._node("nvmlDeviceGetComputeRunningProcesses", handle))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._procs(self._node("nvmlDeviceGetComputeRunningProcesses_v3", handle))

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._procs(self._node("nvmlDeviceGetComputeRunningProcesses_v2", handle))

    def _procs(self, node: _Gpu | _Mig) -> list[Any]:
        # The real wrapper converts each c_nvmlProcessInfo_v2_t to an nvmlFriendlyObject with the same fields.
        friendly = _nv.nvmlFriendlyObject
        procs = self._running(node, self._now())
        return [
            friendly(
                {"pid": p.pid, "usedGpuMemory": p.used_bytes, "gpuInstanceId": p.gi_id, "computeInstanceId": p.ci_id}
            )
            for p in procs
        ]

    # -- utilization

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Percent, over the last sample period. NotSupported in MIG mode."""
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        curve = gpu.curve
        if curve is None:
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        u = curve.at(self._now())
        return _nv.c_nvmlUtilization_t(int(u + 0.5), int(u * curve.f_mem + 0.5))

    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list[Any]]:
        """The driver's ring buffer: samples every 1/6 s, the last 120 kept, timestamps in µs on NVML's clock.

        Only samples newer than `timeStamp` come back (0: the whole buffer); none at all raises NotFound.
        """
        gpu = self._gpu("nvmlDeviceGetSamples", device)
        if not 0 <= sampling_type < _nv.NVML_SAMPLINGTYPE_COUNT:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        curve = gpu.curve
        if curve is None or sampling_type not in (
            _nv.NVML_GPU_UTILIZATION_SAMPLES,
            _nv.NVML_MEMORY_UTILIZATION_SAMPLES,
        ):
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        scale = 1.0 if sampling_type == _nv.NVML_GPU_UTILIZATION_SAMPLES else curve.f_mem
        phase, offset = gpu.sample_phase_us, self._ts_offset_us
        last = (self._ts_us(self._now()) - phase) // _SAMPLE_PERIOD_US
        first = last - _SAMPLE_SLOTS + 1
        if timeStamp:
            first = max(first, (timeStamp - phase) // _SAMPLE_PERIOD_US + 1)
        packed: list[bytes] = []
        pack, at, dry = _SAMPLE.pack, curve.at, curve.dry
        for k in range(first, last + 1):
            ts = k * _SAMPLE_PERIOD_US + phase
            u = at((ts - offset) / 1e6)
            if dry and u <= 0.0:
                continue
            packed.append(pack(ts, int(u * scale + 0.5)))
        if not packed:
            raise _error(_nv.NVML_ERROR_NOT_FOUND)
        n = len(packed)
        samples = (_nv.c_nvmlSample_t * n).from_buffer_copy(b"".join(packed))
        return _nv.NVML_VALUE_TYPE_UNSIGNED_INT, samples[0:n]

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

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = _nv.nvmlTemperature_v1) -> int:
        """Degrees Celsius."""
        if version != _nv.nvmlTemperature_v1:
            raise _error(_nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._temperature(self._gpu("nvmlDeviceGetTemperatureV", handle), sensor)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """Degrees Celsius."""
        return self._temperature(self._gpu("nvmlDeviceGetTemperature", handle), sensor)

    def _temperature(self, gpu: _Gpu, sensor: int) -> int:
        if sensor != _nv.NVML_TEMPERATURE_GPU:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        m = gpu.model
        return int(m.temp_idle_c + (m.temp_busy_c - m.temp_idle_c) * self._busy(gpu, self._now()) / 100.0 + 0.5)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """MHz: idle clocks while the GPU is idle, boost clocks while it works."""
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        m = gpu.model
        if type in (_nv.NVML_CLOCK_SM, _nv.NVML_CLOCK_GRAPHICS):
            return m.sm_boost_mhz if self._busy(gpu, self._now()) >= 1.0 else m.sm_idle_mhz
        if type == _nv.NVML_CLOCK_MEM:
            return m.mem_mhz
        if type == _nv.NVML_CLOCK_VIDEO:
            return m.video_mhz
        raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._reasons(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._reasons(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    def _reasons(self, gpu: _Gpu) -> int:
        busy = self._busy(gpu, self._now())
        if busy < 1.0:
            return int(_nv.nvmlClocksEventReasonGpuIdle)
        if busy >= 95.0:
            return int(_nv.nvmlClocksEventReasonSwPowerCap)
        return int(_nv.nvmlClocksEventReasonNone)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        mode = int(self._gpu("nvmlDeviceGetEccMode", handle).ecc)
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if errorType not in (0, 1) or counterType not in (0, 1):
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.ecc:
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return 0

    # -- MIG

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        """[current, pending]: 1 enabled, 0 disabled. NotSupported on GPUs without MIG."""
        gpu = self._gpu("nvmlDeviceGetMigMode", device)
        if not gpu.model.mig_capable:
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig_mode)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetMaxMigDeviceCount", device)
        if isinstance(node, _Mig):
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return _MIG_SLICES if node.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        """NotFound for an index without a MIG device: indices can be sparse."""
        self.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        if not self._refs:
            raise _error(_nv.NVML_ERROR_UNINITIALIZED)
        try:
            gpu = self._nodes.get(ctypes.addressof(device.contents))
        except (AttributeError, TypeError, ValueError):
            gpu = None
        if not isinstance(gpu, _Gpu):
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            self._check("nvmlDeviceGetMigDeviceHandleByIndex", gpu.index, index)
        if not gpu.mig_mode or not 0 <= index < _MIG_SLICES:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        dev = gpu.mig.get(index)
        if dev is None:
            raise _error(_nv.NVML_ERROR_NOT_FOUND)
        return self._device_handle(dev)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # The real binding returns the ctypes c_uint itself, not its value.
        return ctypes.c_uint(isinstance(self._node("nvmlDeviceIsMigDeviceHandle", device), _Mig))

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetGpuInstanceId", device)
        if isinstance(node, _Gpu):
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return node.gi.gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        node = self._node("nvmlDeviceGetComputeInstanceId", device)
        if isinstance(node, _Gpu):
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return node.ci_id

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        return self._attributes(self._node("nvmlDeviceGetAttributes_v2", device))

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        """A MIG device's engines and sizes (memorySizeMB in MiB). NotSupported on whole GPUs."""
        return self._attributes(self._node("nvmlDeviceGetAttributes", device))

    @staticmethod
    def _attributes(node: _Gpu | _Mig) -> Any:
        if isinstance(node, _Gpu):
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return _nv.c_nvmlDeviceAttributes(*node.attrs)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        node = self._node("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        if isinstance(node, _Gpu):
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(node.parent)

    # -- GPM (Hopper)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        node = self._node("nvmlGpmQueryDeviceSupport", device)
        gpu = node if isinstance(node, _Gpu) else node.parent
        if gpu.model.gpm == "error":
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        return _nv.c_nvmlGpmSupport_t(_nv.NVML_GPM_SUPPORT_VERSION, int(gpu.model.gpm == "yes"))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._begin("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        self._gpm[ctypes.addressof(buffer)] = _GpmSample(buffer)
        return ctypes.cast(buffer, _nv.c_nvmlGpmSample_t)

    def _sample(self, gpmSample: Any) -> _GpmSample:
        try:
            sample = self._gpm.get(ctypes.addressof(gpmSample.contents))
        except (AttributeError, TypeError, ValueError):
            sample = None
        if sample is None:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._begin("nvmlGpmSampleFree")
        del self._gpm[ctypes.addressof(self._sample(gpmSample).buffer)]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        """Snapshot the whole GPU's counters (also in MIG mode) into `gpmSample`."""
        gpu = self._gpu("nvmlGpmSampleGet", device)
        if gpu.model.gpm != "yes":
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        sample = self._sample(gpmSample)
        sample.gpu, sample.gi, sample.t = gpu, None, self._now()
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        """Snapshot one GPU instance's counters into `gpmSample`."""
        gpu = self._gpu("nvmlGpmMigSampleGet", device)
        if gpu.model.gpm != "yes":
            raise _error(_nv.NVML_ERROR_NOT_SUPPORTED)
        if not gpu.mig_mode:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        gi = gpu.gis.get(gpuInstanceId)
        if gi is None:
            raise _error(_nv.NVML_ERROR_NOT_FOUND)
        sample = self._sample(gpmSample)
        sample.gpu, sample.gi, sample.t = gpu, gi, self._now()
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fill metrics[i].value (percent, averaged between the two samples) and metrics[i].nvmlReturn."""
        self._begin("nvmlGpmMetricsGet")
        mg = metricsGet
        if mg.version != _nv.NVML_GPM_METRICS_GET_VERSION or not 0 < mg.numMetrics <= _nv.NVML_GPM_METRIC_MAX:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        s1, s2 = self._sample(mg.sample1), self._sample(mg.sample2)
        gpu = s1.gpu
        if gpu is None or s2.gpu is not gpu or s1.gi is not s2.gi or s2.t - s1.t < _GPM_MIN_GAP_S:
            raise _error(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if self._failures:
            self._check("nvmlGpmMetricsGet", gpu.index, None)
        dt = s2.t - s1.t
        weights = s1.gi.weights if s1.gi is not None else gpu.weights
        avg = {"graphics": 0.0, "sm": 0.0, "occ": 0.0, "tensor": 0.0, "dram": 0.0}
        for w, curve in weights:
            u = w * curve.integral(s1.t, s2.t) / dt
            avg["graphics"] += u
            avg["sm"] += u * curve.f_sm
            avg["occ"] += u * curve.f_occ
            avg["tensor"] += u * curve.f_tensor
            avg["dram"] += u * curve.f_dram
        for i in range(mg.numMetrics):
            metric = mg.metrics[i]
            known = _GPM_METRICS.get(metric.metricId)
            if known is None:
                metric.nvmlReturn = _nv.NVML_ERROR_NOT_SUPPORTED
                metric.value = 0.0
                continue
            metric.nvmlReturn = _nv.NVML_SUCCESS
            metric.value = min(100.0, max(0.0, avg[known[0]]))
            metric.metricInfo.shortName = known[1]
            metric.metricInfo.longName = known[2]
            metric.metricInfo.unit = b"%"
        return mg


def load(
    scenario: str, *, clock: Callable[[], float] | None = None, seed: int = 0, epoch: float | None = None
) -> FakeNvml:
    """A fake NVML for `scenario` (a key of SCENARIOS). `clock` returns seconds (default time.monotonic);
    `seed` varies UUIDs, PIDs and the shape of the load curves between simulated hosts; `epoch` is the clock
    time a scenario's story is told from (work that ended "102 h before the epoch"), by default the clock's
    reading now. Office hours read the clock as UTC epoch seconds: pass `clock=time.time` for those."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown fake NVML scenario {scenario!r}; known: {', '.join(sorted(SCENARIOS))}")
    return FakeNvml(scenario, clock or time.monotonic, seed, epoch)
