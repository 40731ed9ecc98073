"""One interval of figures from every source, for every GPU and MIG slice.

`start()` finds the GPUs and sets each source's baseline; each `collect()` closes the interval that began at
the previous call and opens the next, so intervals are back to back with no gap and no overlap. A source
that fails on one GPU loses that GPU's figures from that source only; the failure is counted.

Given a `HolderReader`, the collector also says who holds each device (`Reading.holders`); what the reader
could not read is counted with NVML's failures, as "holders:reason".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from ..nvml import Nvml
from .device import DeviceSource
from .gpm import GpmSource
from .holders import HolderReader
from .model import Denied, GpuInfo, Interval, Reading, SliceInfo
from .power import PowerSource
from .source import Source
from .topology import GpuDevice, Topology
from .utilization import POLL_S, UtilizationSource

log = logging.getLogger("gpufleet.agent.collect")


def utc_now() -> datetime:
    return datetime.now(UTC)


class Collector:
    def __init__(
        self,
        nvml: Nvml,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
        holders: HolderReader | None = None,
    ) -> None:
        self.nvml = nvml
        self.clock = clock
        self.wall_clock = wall_clock
        self.holders = holders
        self.topology = Topology(nvml)
        # Order matters: utilization before GPM, so GPM fills a MIG parent's util only where the buffer cannot.
        self.device = DeviceSource(nvml, holders)
        self.sources: list[Source] = [
            self.device,
            UtilizationSource(nvml),
            GpmSource(nvml),
            PowerSource(nvml, clock),
        ]
        self._began: float | None = None
        self._start: datetime | None = None
        self._failed_once: set[str] = set()

    @property
    def gpus(self) -> list[GpuDevice]:
        return self.topology.gpus

    def start(self) -> None:
        self.topology.discover()
        for gpu in self.gpus:
            for source in self.sources:
                self._guard(source.name, gpu, partial(source.prime, gpu))
        self._began = self.clock()
        self._start = self.wall_clock()

    def poll(self) -> None:
        """Read what must be read during an interval (NVML's sample buffer holds about 16 s): call it at least
        every `POLL_S` seconds between `collect` calls."""
        for gpu in self.gpus:
            for source in self.sources:
                self._guard(source.name, gpu, partial(source.poll, gpu))

    def collect(self) -> Interval:
        """Close the current interval and return it; the next one starts now."""
        if self._began is None or self._start is None:
            raise RuntimeError("Collector.start() first")
        ended = self.clock()
        end_wall = self.wall_clock()
        elapsed = max(ended - self._began, 1e-6)
        readings: dict[str, Reading] = {}
        for gpu in self.gpus:
            gpu.denied.clear()
            layout_before = (gpu.mig_mode, frozenset(gpu.slices))
            self._guard("topology", gpu, partial(self.topology.refresh, gpu))
            if gpu.mig_mode != layout_before[0]:
                gpu.unsupported.clear()  # a MIG mode switch changes what the board supports
            readings[gpu.uuid] = Reading(gpu.uuid)
            for s in gpu.slices.values():
                readings[s.uuid] = Reading(s.uuid)
        if self.holders is not None:
            self.holders.begin_interval()
        for gpu in self.gpus:
            for source in self.sources:
                self._guard(source.name, gpu, partial(source.read, gpu, readings, elapsed))
        if self.holders is not None and self.holders.errors:
            self.nvml.errors.update(self.holders.errors)
            self.holders.errors.clear()
        interval = Interval(start=self._start, duration_s=elapsed, gpus=self.layout(), readings=list(readings.values()))
        self._began, self._start = ended, end_wall
        return interval

    def sample(self, seconds: float) -> Interval:
        """Start, wait `seconds` (polling on the way), and return that one interval; the sources are closed
        afterwards."""
        try:
            self.start()
            end = self.clock() + seconds
            while (left := end - self.clock()) > 0:
                time.sleep(min(left, POLL_S))
                if end - self.clock() > 0:
                    self.poll()
            return self.collect()
        finally:
            self.close()

    def pending_mig_changes(self) -> list[GpuDevice]:
        """GPUs whose MIG mode was changed but waits for a GPU reset (which this process's NVML use blocks)."""
        return [gpu for gpu in self.gpus if gpu.mig_pending is not None and not gpu.lost]

    def layout(self) -> tuple[GpuInfo, ...]:
        """Every GPU as the batch describes it. A GPU whose description did not change since the last interval
        gives the same object again, so the batch tells an unchanged layout at a glance."""
        return tuple(self._described(gpu) for gpu in self.gpus)

    @staticmethod
    def _described(gpu: GpuDevice) -> GpuInfo:
        # What the description is made of. A slice is compared as the object (the same one while it lasts: its
        # place and size never change) and its reason.
        key = (
            gpu.mig_mode,
            gpu.unpartitioned_slices,
            gpu.lost,
            gpu.util_reason,
            gpu.layout_complete,
            tuple(gpu.denied.items()),
            tuple([(s, s.util_reason) for s in gpu.slices.values()]),
        )
        made: tuple[tuple[Any, ...], GpuInfo] | None = gpu.memo.get("described")
        if made is not None and made[0] == key:
            return made[1]
        info = GpuInfo(
            uuid=gpu.uuid,
            index=gpu.index,
            name=gpu.name,
            memory_total_mib=gpu.memory_total_mib,
            mig_mode=gpu.mig_mode,
            unpartitioned_slices=gpu.unpartitioned_slices if gpu.mig_mode else None,
            util_unavailable_reason=gpu.lost or gpu.util_reason,
            layout_complete=gpu.layout_complete or not gpu.mig_mode,
            permission_denied=tuple(
                Denied(figure, call, grant) for figure, (call, grant) in sorted(gpu.denied.items())
            ),
            slices=tuple(
                SliceInfo(
                    uuid=s.uuid,
                    gpu_instance_id=s.gpu_instance_id,
                    compute_instance_id=s.compute_instance_id,
                    profile=s.profile,
                    compute_slices=s.compute_slices,
                    memory_total_mib=s.memory_total_mib,
                    util_unavailable_reason=gpu.lost or s.util_reason,
                )
                for s in sorted(gpu.slices.values(), key=lambda s: (s.gpu_instance_id, s.compute_instance_id))
            ),
        )
        gpu.memo["described"] = (key, info)
        return info

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception:
                log.debug("closing source %s failed", source.name, exc_info=True)

    def _guard(self, name: str, gpu: GpuDevice, step: Callable[[], None]) -> None:
        """Run one source on one GPU; an unexpected exception costs that step only, and is counted."""
        try:
            step()
        except Exception:
            self.nvml.errors[f"{name}:exception"] += 1
            key = f"{name}:{gpu.index}"
            if key not in self._failed_once:
                self._failed_once.add(key)
                log.exception("source %s failed on GPU %d; its figures are absent", name, gpu.index)
