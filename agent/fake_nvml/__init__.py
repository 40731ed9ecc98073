"""A stand-in for the `pynvml` module: simulated GPU hosts for tests and demos.

`load(scenario)` returns a `FakeNvml` that the agent uses exactly like `pynvml`: the same function names,
arguments, return types and exceptions. Constants, ctypes structs and the `NVMLError` classes are the real
module's own objects (looked up on first use), so `except lib.NVMLError_NotSupported` and
`err.value == lib.NVML_ERROR_NOT_SUPPORTED` behave as on real hardware. Functions the fake does not simulate
answer `NVMLError_NotSupported`. The process lists also exist as C entry points (`_nvmlGetFunctionPointer`)
that write the record layout of the simulated driver build.

What real hardware does, the fake does, with the source cited where it is simulated: MIG sizes and names per
GPU model (`hardware`), the answers an unprivileged caller gets, the sample buffer's length, spacing and dry
spells, GPM's counters and its 100 ms minimum, MIG mode changes that wait for a GPU reset.

Everything that changes over time (utilization, power and energy, the sample buffer, GPM counters, the
processes of work that starts and stops) is a function of `clock()`, `seed` and `epoch`, so a test that drives
a fake clock gets the same answers every run. Handles are real `c_nvmlDevice_t` pointers to private addresses;
a fresh pointer object comes back on every call, as from the real bindings.

`FakeNvml.truth(t1, t2)` gives what every device did over a span of clock time, worked out exactly rather than
sampled: history written from it matches what an agent reading the same scenario live reports.

Every scenario process has a user, an executable and a Slurm job, container, pod or login session;
`FakeNvml.proc_tree()` writes their /proc entries as files (`procfs`), which the agent reads to say who holds
each GPU.

A scenario named `report:PATH` replays a capability report that `gpufleet-agent doctor --json` wrote on a real
host (`replay`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .core import LIBRARY_MISMATCH
from .devices import DeviceCalls
from .hardware import DRIVERS, PRIVILEGES
from .mig import InUse, MigCalls
from .model import Truth
from .processes import ProcessCalls
from .replay import REPORT_PREFIX, ReportError, scenario_from_report
from .scenarios import SCENARIOS, scenario

__all__ = [
    "DRIVERS",
    "LIBRARY_MISMATCH",
    "PRIVILEGES",
    "SCENARIOS",
    "FakeNvml",
    "InUse",
    "ReportError",
    "Truth",
    "is_known",
    "load",
]


class FakeNvml(MigCalls, ProcessCalls, DeviceCalls):
    """A simulated NVML: call it like the `pynvml` module. Build one with `load(scenario)`.

    `calls` counts the calls of every nvml* function by name. `fail`, `clear_failures`, `set_load`,
    `add_process`, `remove_process`, `request_mig_mode`, `reset_gpu`, `create_gpu_instance` and
    `destroy_gpu_instance` steer the simulation from tests; `proc_tree` writes its processes' /proc entries.
    The energy and GPM counters integrate activity up to the clock reading taken here, so with a fake clock
    they too are exact and repeatable.
    """


def is_known(name: str) -> bool:
    """Whether `name` names a scenario: a key of SCENARIOS, or `report:PATH`."""
    return name in SCENARIOS or name.startswith(REPORT_PREFIX)


def load(
    scenario_name: str,
    *,
    clock: Callable[[], float] | None = None,
    seed: int = 0,
    epoch: float | None = None,
    driver: str | None = None,
    privilege: str | None = None,
) -> FakeNvml:
    """A fake NVML for `scenario_name` (a key of SCENARIOS, or `report:PATH`). `clock` returns seconds (default
    time.monotonic); `seed` varies UUIDs, PIDs and the shape of the load curves between simulated hosts; `epoch`
    is the clock time a scenario's story is told from (work that ended "102 h before the epoch"), by default the
    clock's reading now. Office hours read the clock as UTC epoch seconds: pass `clock=time.time` for those.
    `driver` (a key of DRIVERS) and `privilege` (a key of PRIVILEGES: admin, monitor, none) replace the
    scenario's. Raises ValueError for an unknown name and ReportError for a report that cannot be read."""
    if scenario_name.startswith(REPORT_PREFIX):
        spec = scenario_from_report(scenario_name[len(REPORT_PREFIX) :])
    elif scenario_name in SCENARIOS:
        spec = scenario(scenario_name)
    else:
        raise ValueError(f"unknown fake NVML scenario {scenario_name!r}; known: {', '.join(sorted(SCENARIOS))}")
    if driver is not None and driver not in DRIVERS:
        raise ValueError(f"unknown simulated driver {driver!r}; known: {', '.join(DRIVERS)}")
    if privilege is not None and privilege not in PRIVILEGES:
        raise ValueError(f"unknown privilege {privilege!r}; known: {', '.join(PRIVILEGES)}")
    return FakeNvml(spec, scenario_name, clock or time.monotonic, seed, epoch, driver=driver, privilege=privilege)
