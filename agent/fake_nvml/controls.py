"""Steering the simulation from tests (failures, loads, processes) and its exact answers (`truth`)."""

from __future__ import annotations

import types

from .core import Core, nv
from .model import MIB, Failure, Gpu, MigDevice, Proc, Truth


class Controls(Core):
    # -- test controls

    def fail(
        self,
        function: str,
        error: int,
        *,
        gpu: int | None = None,
        slice_index: int | None = None,
        times: int | None = None,
        gpu_only: bool = False,
    ) -> None:
        """Make calls of `function` raise NVMLError(`error`) (or `LIBRARY_MISMATCH`).

        Scope: every call (`gpu=None`), calls on GPU `gpu` and its MIG devices (only the GPU itself with
        `gpu_only`), or only calls on its MIG device `slice_index`. The first `times` matching calls fail
        (`None`: all of them). For nvmlInit with NVML_ERROR_LIBRARY_NOT_FOUND this is a host without a driver.
        A C-level entry point (a name that `_nvmlGetFunctionPointer` gives) fails by its C name.
        """
        if not isinstance(getattr(nv, function, None), types.FunctionType):
            raise ValueError(f"pynvml has no function {function!r}")
        if slice_index is not None and gpu is None:
            raise ValueError("slice_index needs gpu")
        if times is not None and times < 1:
            raise ValueError("times must be at least 1")
        self._failures.append(Failure(function, error, gpu, slice_index, times, gpu_only))

    def clear_failures(self) -> None:
        self._failures.clear()

    def _target(self, gpu: int, slice_index: int | None) -> tuple[Gpu, MigDevice | None]:
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu} in scenario {self.scenario!r}")
        g = self._gpus[gpu]
        if slice_index is None:
            return g, None
        if slice_index not in g.mig:
            raise ValueError(f"GPU {gpu} has no MIG device at index {slice_index}")
        return g, g.mig[slice_index]

    def set_load(
        self, gpu: int, util: float | None, *, slice_index: int | None = None, since: float | None = None
    ) -> None:
        """Pin utilization (percent) of a GPU, or of one of its MIG devices; `None` lets it move again.

        Without `since` the pin holds for all times, sample history and GPM included, so tests get exact
        answers; with `since` (clock time) it holds from then on, and earlier pins stay before it. The energy
        and GPM counters only integrate it from now on. On a MIG-mode GPU without `slice_index` every MIG
        device is pinned.
        """
        if util is not None and not 0.0 <= util <= 100.0:
            raise ValueError("util is a percentage, 0-100")
        g, dev = self._target(gpu, slice_index)
        now = self._now()
        self._energy(g, now)
        self._advance_counters(g, now)
        for _, curve in [(1.0, dev.curve)] if dev is not None else g.weights:
            curve.pin(util, since)

    def add_process(self, gpu: int, pid: int, used_mib: int, *, slice_index: int | None = None) -> None:
        """A compute process holding `used_mib` MiB on a GPU, or on one MIG device of a MIG-mode GPU."""
        g, dev = self._target(gpu, slice_index)
        if g.mig_mode and dev is None:
            raise ValueError(f"GPU {gpu} is in MIG mode: name the MIG device (slice_index)")
        proc = Proc(pid, used_mib * MIB)
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

    def _advance_counters(self, gpu: Gpu, t: float) -> None:
        """Bring the GPM counters of a GPU and its GPU instances up to clock time `t` (overridden by `mig`)."""

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
            held = sum(p.used_bytes for p in running) // MIB
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
                gi_held = sum(p.used_bytes for p in in_gi) // MIB
                for dev in gi.cis:
                    own = [p.used_bytes for p in in_gi if p.ci_id == dev.ci_id]
                    out[dev.uuid] = Truth(gi_util, gi_sm, gi_held, len(own), sum(own) // MIB, None, None, None)
        return out
