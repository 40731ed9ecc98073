"""Refused figures in words: grouped by what to grant, known keys worded, unknown keys kept as sent."""

from __future__ import annotations

from app.analyse.fleet import PermissionDenied
from app.web.privileges import FIGURES, GRANTS, grant_notes


def test_every_documented_key_has_words() -> None:
    assert set(FIGURES) == {
        "mem_used_mib",
        "procs",
        "procs_mem_mib",
        "sm_active",
        "gr_active",
        "util",
        "slice_memory",
        "slice_procs",
    }
    assert set(GRANTS) == {"mig-monitor", "cap-sys-admin", "device-access"}
    assert FIGURES["mem_used_mib"] == "memory used of the whole GPU"
    assert GRANTS["device-access"].startswith("read and write access to /dev/nvidiactl, /dev/nvidia0..N")


def test_figures_are_grouped_by_grant_in_the_order_sent() -> None:
    notes = grant_notes(
        [
            PermissionDenied("util", "nvmlGpmMigSampleGet", "cap-sys-admin"),
            PermissionDenied("mem_used_mib", "nvmlDeviceGetMemoryInfo", "mig-monitor"),
            PermissionDenied("slice_procs", "nvmlDeviceGetComputeRunningProcesses_v3", "mig-monitor"),
            PermissionDenied("fan_speed", "nvmlDeviceGetFanSpeed_v2", "root-of-all"),
        ]
    )
    assert [(n.grant, n.known) for n in notes] == [
        (GRANTS["cap-sys-admin"], True),
        (GRANTS["mig-monitor"], True),
        ("root-of-all", False),
    ]
    assert [(f.label, f.call, f.known) for f in notes[1].figures] == [
        ("memory used of the whole GPU", "nvmlDeviceGetMemoryInfo", True),
        ("compute processes of each MIG slice", "nvmlDeviceGetComputeRunningProcesses_v3", True),
    ]
    assert [(f.label, f.known) for f in notes[2].figures] == [("fan_speed", False)]
    assert grant_notes([]) == []
