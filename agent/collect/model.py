"""What one collection interval produces: the hardware layout and one reading per GPU and per MIG slice."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from .holders import Holder

HolderRefs = Callable[[tuple[Holder, ...]], list[dict[str, int]]]
"""A sample's references to its holders in a batch's holders table (`batch.HolderTable.refs`): number and
memory; a holder the batch can describe no more is left out."""

HolderRefsJson = Callable[[tuple[Holder, ...]], str]
"""The same references as one JSON array (`batch.HolderTable.refs_json`); "" when none is kept."""


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """A MIG device: one compute instance inside one GPU instance."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    compute_slices: int | None
    """None when the slice's size could not be read (profile "unknown")."""
    memory_total_mib: int | None
    util_unavailable_reason: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return _strip(
            {
                "uuid": self.uuid,
                "gpu_instance_id": self.gpu_instance_id,
                "compute_instance_id": self.compute_instance_id,
                "profile": self.profile,
                "compute_slices": self.compute_slices,
                "memory_total_mib": self.memory_total_mib,
                "util_unavailable_reason": self.util_unavailable_reason,
            }
        )


@dataclass(frozen=True, slots=True)
class Denied:
    """A figure NVML refused at the agent's privilege: which, the refusing call, and what to grant
    (`privilege.GRANTS`)."""

    figure: str
    call: str
    grant: str

    def to_wire(self) -> dict[str, str]:
        return {"figure": self.figure, "call": self.call, "grant": self.grant}


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A physical GPU and, in MIG mode, its slices and the compute slices that belong to no GPU instance.

    `layout_complete` is False when a MIG device exists that could not be identified or sized: its free
    capacity (`unpartitioned_slices`) is then unknown. `permission_denied` lists what NVML refused."""

    uuid: str
    index: int
    name: str
    memory_total_mib: int | None
    mig_mode: bool
    unpartitioned_slices: int | None
    util_unavailable_reason: str | None
    slices: tuple[SliceInfo, ...] = ()
    layout_complete: bool = True
    permission_denied: tuple[Denied, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        wire = _strip(
            {
                "uuid": self.uuid,
                "index": self.index,
                "name": self.name,
                "memory_total_mib": self.memory_total_mib,
                "mig_mode": self.mig_mode,
                "unpartitioned_slices": self.unpartitioned_slices,
                "util_unavailable_reason": self.util_unavailable_reason,
            }
        )
        wire["slices"] = [s.to_wire() for s in self.slices]
        # Sent only when there is something to say, so a plain GPU's description stays as it was.
        if not self.layout_complete:
            wire["layout_complete"] = False
        if self.permission_denied:
            wire["permission_denied"] = [d.to_wire() for d in self.permission_denied]
        return wire


@dataclass(slots=True)
class Reading:
    """One device (GPU or slice) over one interval. None means not measured, never 0.

    util and sm_active/gr_active in %, memory in MiB, power in W (interval mean), temperature in degrees C,
    SM clock in MHz, ECC as a count since driver load. `holders` are the processes on the device, most memory
    first (a MIG-mode GPU has none of its own: they are its slices').
    """

    uuid: str
    util: float | None = None
    util_source: str = "none"
    sm_active: float | None = None
    gr_active: float | None = None
    mem_used_mib: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    sm_clock_mhz: int | None = None
    ecc_uncorrected: int | None = None
    procs: int | None = None
    procs_mem_mib: int | None = None
    holders: tuple[Holder, ...] = ()

    def to_wire(self, refs: HolderRefs | None = None) -> dict[str, Any]:
        """The sample; with `refs`, its holders as references into the batch's holders table."""
        wire: dict[str, Any] = {"uuid": self.uuid, "util_source": self.util_source}
        for name, value in zip(_READING_FIGURES, _figures(self), strict=True):
            if value is not None:
                wire[name] = round(value, 2) if isinstance(value, float) else value
        if refs is not None and self.holders:
            held = refs(self.holders)
            if held:
                wire["holders"] = held
        return wire

    def to_json(self, refs: HolderRefsJson | None = None) -> str:
        """`to_wire` as compact JSON, the text `json.dumps(..., separators=(",", ":"))` writes for it, made
        without the dictionary: a crowded host writes 64 samples every interval."""
        parts = [_sample_head(self.uuid, self.util_source)]
        for key, value in zip(_FIGURE_KEYS, _figures(self), strict=True):
            if value is None:
                continue
            kind = type(value)
            if kind is float:
                text = repr(round(value, 2))
                # repr spells the non-finite floats nan and inf; JSON as Python writes it, NaN and Infinity.
                parts.append(key + (text if text[-1] not in "nf" else json.dumps(value)))
            elif kind is int:
                parts.append(key + str(value))
            else:
                parts.append(key + json.dumps(value))
        if refs is not None and self.holders:
            held = refs(self.holders)
            if held:
                parts.append(',"holders":' + held)
        parts.append("}")
        return "".join(parts)


_READING_FIGURES = (
    "util",
    "sm_active",
    "gr_active",
    "mem_used_mib",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "ecc_uncorrected",
    "procs",
    "procs_mem_mib",
)
_figures = attrgetter(*_READING_FIGURES)
_FIGURE_KEYS = tuple(f',"{name}":' for name in _READING_FIGURES)
_HEADS: dict[tuple[str, str], str] = {}
_HEADS_KEPT = 4096


def _sample_head(uuid: str, util_source: str) -> str:
    """The start of a sample's JSON, up to its first figure: the same few devices and sources every interval."""
    head = _HEADS.get((uuid, util_source))
    if head is None:
        if len(_HEADS) >= _HEADS_KEPT:
            _HEADS.clear()
        head = _HEADS[uuid, util_source] = f'{{"uuid":{json.dumps(uuid)},"util_source":{json.dumps(util_source)}'
    return head


@dataclass(slots=True)
class Interval:
    """Everything collected for one interval: start (UTC), length in s, layout, and one reading per device."""

    start: datetime
    duration_s: float
    gpus: tuple[GpuInfo, ...]
    readings: list[Reading] = field(default_factory=list)

    def to_wire(self, refs: HolderRefs | None = None) -> dict[str, Any]:
        """The interval; with `refs`, each sample refers to its holders (without, they are left out)."""
        return {
            "start": self.start.isoformat().replace("+00:00", "Z"),
            "duration_s": round(self.duration_s, 3),
            "samples": [r.to_wire(refs) for r in self.readings],
        }

    def to_record(self, refs: HolderRefsJson | None = None) -> dict[str, Any]:
        """`to_wire` with the samples already in JSON (`Reading.to_json`), as the batch's journal keeps them."""
        samples = ",".join([r.to_json(refs) for r in self.readings])
        return {
            "start": self.start.isoformat().replace("+00:00", "Z"),
            "duration_s": round(self.duration_s, 3),
            "samples": f"[{samples}]",
        }


def _strip(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
