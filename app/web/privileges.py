"""What an agent could not read at its privilege, in words for the instance page.

The agent names each figure NVML refused (NO_PERMISSION), the call that refused it and what to grant, by key
(`permission_denied` in docs/ingest-protocol.md). The keys are worded here and nowhere else. A key this server
does not know (from an agent newer than the server) is shown as sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..analyse.fleet import PermissionDenied

FIGURES = {
    "mem_used_mib": "memory used of the whole GPU",
    "procs": "compute processes of the whole GPU",
    "procs_mem_mib": "memory held by the GPU's compute processes",
    "sm_active": "SM activity",
    "gr_active": "graphics-engine activity",
    "util": "slice utilization (through GPM)",
    "slice_memory": "memory used of each MIG slice",
    "slice_procs": "compute processes of each MIG slice",
}
"""Figure keys, as the agent sends them, in words."""

GRANTS = {
    "mig-monitor": "the MIG monitor capability: the device node /dev/nvidia-caps/nvidia-cap2 must exist "
    "(nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/monitor, which the agent's systemd unit runs before "
    "it starts) and the agent must be allowed to read it",
    "cap-sys-admin": "CAP_SYS_ADMIN for the agent (gpufleet-agent install --profiling adds it), or the NVIDIA driver "
    "option NVreg_RestrictProfilingToAdminUsers=0",
    "device-access": "read and write access to /dev/nvidiactl, /dev/nvidia0..N and the MIG capability nodes under "
    "/dev/nvidia-caps",
}
"""Grant keys, as the agent sends them: what to give the agent, in words."""

SEE_ALSO = "see docs/agent.md, Privileges"


@dataclass(frozen=True)
class Refused:
    """One figure not read: its words (or its key, `known` False) and the NVML call that refused it."""

    label: str
    call: str
    known: bool


@dataclass
class GrantNote:
    """What to grant the agent, and the figures that grant would let it read."""

    grant: str
    """The grant in words, or the key as sent (`known` False)."""
    known: bool
    figures: list[Refused] = field(default_factory=list)


def grant_notes(refused: Iterable[PermissionDenied]) -> list[GrantNote]:
    """The refused figures grouped by what to grant, in the order the agent listed them."""
    notes: dict[str, GrantNote] = {}
    for item in refused:
        note = notes.get(item.grant)
        if note is None:
            text = GRANTS.get(item.grant)
            note = notes[item.grant] = GrantNote(text or item.grant, text is not None)
        label = FIGURES.get(item.figure)
        note.figures.append(Refused(label or item.figure, item.call, label is not None))
    return list(notes.values())
