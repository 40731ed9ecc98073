"""Who holds a device, as the pages show it: now, the processes of the device's newest sample (docs/agent.md,
"Holders", read from `device_holders_now`, app/store/holders.py); over a window, each process's part of the device
from the waste analysis split among holders (app/analyse/holders.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from ...analyse.holders import Part
from ...store.holders import HeldNow, holders_now

CONTAINER_ID_CHARS = 12
"""A container id as `docker ps` shows it."""


@dataclass(frozen=True)
class ProcessView:
    """A process that holds or held a device. Strings are the agent's, shown as text."""

    pid: int
    executable: str | None
    user: str | None
    """Unix user name; None where the host could not name the uid."""
    uid: int | None
    namespace: str | None
    pod: str | None
    job_id: str | None
    """Slurm job."""
    container: str | None
    """Container id, its first 12 characters."""

    @property
    def who(self) -> str:
        """The user, else the uid, else "pid N": what a table names the holder by first."""
        if self.user:
            return self.user
        return f"uid {self.uid}" if self.uid is not None else f"pid {self.pid}"

    @property
    def where(self) -> str | None:
        """The pod (namespace/name), the Slurm job or the container the process runs in, if any."""
        if self.pod:
            return f"{self.namespace}/{self.pod}" if self.namespace else self.pod
        if self.job_id:
            return f"job {self.job_id}"
        return f"container {self.container}" if self.container else None


def _short(container_id: str | None) -> str | None:
    return container_id[:CONTAINER_ID_CHARS] if container_id else None


@dataclass(frozen=True)
class HolderView(ProcessView):
    """One process holding a device now."""

    used_mib: int | None = None
    """Memory it holds on the device, MiB."""
    since: datetime | None = None
    """When it was first seen on the device."""

    @classmethod
    def of(cls, h: HeldNow) -> HolderView:
        return cls(
            h.pid,
            h.executable,
            h.user_name,
            h.uid,
            h.namespace,
            h.pod,
            h.job_id,
            _short(h.container_id),
            h.used_mib,
            h.since,
        )


@dataclass(frozen=True)
class HeldOverWindow(ProcessView):
    """One process's part of one device over the window: its share of the device's time (an interval with two
    processes gives each half), in GPU-hours as the device counts them (a 3g slice: 3/7 per hour)."""

    device_key: str = ""
    """The device's key on the instance page (`gpu-<index>`, `gpu-<index>-gi<id>`)."""
    device_label: str = ""
    gpu_hours: float = 0.0
    idle_held_h: float = 0.0
    """Of those, GPU-hours with the device under the idle threshold."""
    idle_held_usd: float | None = None
    """Their cost, USD; None for an unpriced device or a slice of unknown size."""
    avg_util_pct: float | None = None
    """The device's mean utilization while it held it, %."""
    avg_mem_mib: float | None = None
    """Mean memory it held on the device, MiB."""
    first_seen: datetime | None = None
    """When the process was first and last seen, on any device of the instance."""
    last_seen: datetime | None = None


def held_over_window(parts: Sequence[Part], devices: Mapping[int, tuple[str, str]]) -> list[HeldOverWindow]:
    """The holders' parts of `devices` (device id: key and label), device by device, most GPU-hours first."""
    out: list[HeldOverWindow] = []
    for part in parts:
        h, held = part.holder, part.held
        if h is None or held is None:
            continue
        device = part.unit.slice.pk if part.unit.slice is not None else part.unit.gpu.pk
        if device not in devices:
            continue
        key, label = devices[device]
        f = part.figures
        priced = part.unit.usd_per_hour is not None
        out.append(
            HeldOverWindow(
                h.pid,
                h.executable,
                h.user_name,
                h.uid,
                h.namespace,
                h.pod,
                h.job_id,
                _short(h.container_id),
                key,
                label,
                f.gpu_hours,
                f.idle_held_h,
                f.idle_held_cost if priced else None,
                f.avg_util,
                held.avg_mem_mib,
                h.first_seen,
                h.last_seen,
            )
        )
    order = {key: i for i, (key, _label) in enumerate(devices.values())}
    return sorted(out, key=lambda r: (order[r.device_key], -r.gpu_hours, r.pid))


def holders_by_device(session: Session, device_ids: Sequence[int]) -> dict[int, list[HolderView]]:
    """Each device's holders now, most memory first; devices with none are left out."""
    if not device_ids:
        return {}
    return {d: [HolderView.of(h) for h in held] for d, held in holders_now(session, list(device_ids)).items()}
