"""The five states a GPU or MIG slice is in, and the thresholds that decide between them.

Every figure of the analysis comes from the same split of covered seconds (see `docs/waste.md`):

- active: utilization at or above `idle_util_pct`;
- idle-held: under it, but a compute process runs or memory at or above `mem_held_mib` is allocated;
- idle: under it, no process, memory under the bound;
- unknown: the hardware gave no utilization figure (A100 MIG slices): neither idle nor active;
- offline: the device existed but no data came (instance stopped, agent down); never priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import Settings

ACTIVE = "active"
IDLE_HELD = "idle-held"
IDLE = "idle"
UNKNOWN = "unknown"
OFFLINE = "offline"
STATES = (ACTIVE, IDLE_HELD, IDLE, UNKNOWN, OFFLINE)
# Free compute slices of a MIG-mode GPU: idle capacity, shown apart from idle slices.
UNPARTITIONED = "unpartitioned"


@dataclass(frozen=True)
class Thresholds:
    idle_util_pct: int = 5
    """Utilization under this is no meaningful activity, %; one of the rollup histogram bounds."""
    mem_held_mib: int = 256
    """Memory at or above this counts as held, MiB (applied when samples are stored)."""
    idle_min_hours: float = 1.0
    """A passthrough GPU enters the idle list after this long idle, hours."""
    underused_util_pct: float = 10.0
    """A MIG slice averaging under this over the window is under-used, %."""
    offline_after_s: float = 300.0
    """An instance that sent nothing for this long is offline, s."""
    gone_after_h: float = 24.0
    """An instance offline this long (or offline after a spot interruption notice) is taken as terminated, h."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Thresholds:
        return cls(
            idle_util_pct=settings.idle_util_pct,
            mem_held_mib=settings.mem_held_mib,
            idle_min_hours=settings.idle_min_hours,
            underused_util_pct=settings.underused_util_pct,
            offline_after_s=settings.offline_after_s,
            gone_after_h=settings.gone_after_h,
        )


def sample_state(util: float | None, procs: int | None, mem_used_mib: int | None, t: Thresholds) -> str:
    """The state of one sample, by the same rules the rollups apply to seconds."""
    if util is None:
        return UNKNOWN
    if util >= t.idle_util_pct:
        return ACTIVE
    if (procs or 0) > 0 or (mem_used_mib or 0) >= t.mem_held_mib:
        return IDLE_HELD
    return IDLE
