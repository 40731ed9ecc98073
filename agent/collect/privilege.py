"""What to grant when NVML answers NO_PERMISSION, and what this process holds.

NVIDIA's MIG user guide ("Device Nodes and Capabilities"): root and CAP_SYS_ADMIN hold every nvidia capability
implicitly; any other caller needs the capability's device node. The agent's unit runs as root without
capabilities, so:
- a MIG-mode GPU's own memory and process list (aggregates over its slices) need the MIG monitor capability,
  /dev/nvidia-caps/nvidia-cap2 (mode 0444, made by `nvidia-modprobe -f
  /proc/driver/nvidia/capabilities/mig/monitor`), which the unit creates before it starts;
- GPM reads GPU performance counters, which the driver keeps for admins unless it was loaded with
  NVreg_RestrictProfilingToAdminUsers=0 (NVIDIA's ERR_NVGPUCTRPERM page); nvmlGpmSampleGet answered
  NO_PERMISSION without admin rights in NVIDIA/DCGM#214. That GPM follows the driver option is not documented;
- anything else needs the device nodes themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIG_MONITOR = "mig-monitor"
SYS_ADMIN = "cap-sys-admin"
DEVICE_ACCESS = "device-access"

GRANTS = {
    MIG_MONITOR: "the MIG monitor capability: /dev/nvidia-caps/nvidia-cap2 must exist (nvidia-modprobe -f "
    "/proc/driver/nvidia/capabilities/mig/monitor; the agent's unit runs it before start) and be readable",
    SYS_ADMIN: "CAP_SYS_ADMIN (gpufleet-agent install --profiling), or the driver option "
    "NVreg_RestrictProfilingToAdminUsers=0",
    DEVICE_ACCESS: "read-write access to /dev/nvidiactl, /dev/nvidia0..N and the MIG nodes under /dev/nvidia-caps",
}

FIGURES = {
    "mem_used_mib": "memory used of the whole GPU",
    "procs": "compute processes of the whole GPU",
    "sm_active": "SM activity",
    "gr_active": "graphics-engine activity",
    "util": "slice utilization",
    "slice_memory": "memory used of a slice",
    "slice_procs": "compute processes of a slice",
}

MONITOR_NODE = "/dev/nvidia-caps/nvidia-cap2"
DRIVER_PARAMS = "/proc/driver/nvidia/params"
_CAP_SYS_ADMIN = 21  # linux/capability.h


@dataclass(frozen=True, slots=True)
class Held:
    """This process's standing with the driver: uid, CAP_SYS_ADMIN in its effective set, whether the MIG
    monitor node exists and is readable, and the driver's RmProfilingAdminOnly (None where unreadable)."""

    uid: int
    cap_sys_admin: bool
    mig_monitor_node: bool
    profiling_admin_only: bool | None

    def to_wire(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "cap_sys_admin": self.cap_sys_admin,
            "mig_monitor_node": self.mig_monitor_node,
            "profiling_admin_only": self.profiling_admin_only,
        }


def held() -> Held:
    """Read from /proc and /dev; nothing here needs NVML."""
    return Held(os.getuid(), _has_cap(_CAP_SYS_ADMIN), os.access(MONITOR_NODE, os.R_OK), _profiling_admin_only())


def _has_cap(bit: int) -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return False


def _profiling_admin_only() -> bool | None:
    try:
        with open(DRIVER_PARAMS, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "RmProfilingAdminOnly":
                    return value.strip() != "0"
    except OSError:
        pass
    return None
