"""Who holds a device now, as the pages show it: the processes of the device's newest sample (docs/agent.md,
"Holders"), read from `device_holders_now` (app/store/holders.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from ...store.holders import HeldNow, holders_now

CONTAINER_ID_CHARS = 12
"""A container id as `docker ps` shows it."""


@dataclass(frozen=True)
class HolderView:
    """One process holding a device now. Strings are the agent's, shown as text."""

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
    used_mib: int | None
    """Memory it holds on the device, MiB."""
    since: datetime
    """When it was first seen on the device."""

    @classmethod
    def of(cls, h: HeldNow) -> HolderView:
        container = h.container_id[:CONTAINER_ID_CHARS] if h.container_id else None
        return cls(
            h.pid, h.executable, h.user_name, h.uid, h.namespace, h.pod, h.job_id, container, h.used_mib, h.since
        )

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


def holders_by_device(session: Session, device_ids: Sequence[int]) -> dict[int, list[HolderView]]:
    """Each device's holders now, most memory first; devices with none are left out."""
    if not device_ids:
        return {}
    return {d: [HolderView.of(h) for h in held] for d, held in holders_now(session, list(device_ids)).items()}
