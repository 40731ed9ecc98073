"""What each device is doing right now: its newest sample, if one arrived within the offline bound."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from .fleet import Fleet
from .states import OFFLINE, UNPARTITIONED, Thresholds, sample_state


@dataclass(frozen=True)
class Latest:
    """A device's newest sample."""

    device_id: int
    ts: datetime
    util: float | None
    mem_used_mib: int | None
    procs: int | None
    power_w: int | None
    temp_c: int | None
    util_source: int
    """Where util came from: a code of app.sources."""
    state: str


# device_status holds each device's newest sample, kept by the ingest path: one row per device, no scan.
_LATEST_SQL = (
    "SELECT device_id, ts, util, mem_used_mib, procs, power_w, temp_c, util_source "
    "FROM device_status WHERE ts >= :since{filter}"
)


def latest_samples(
    session: Session, *, now: datetime, thresholds: Thresholds, device_ids: Sequence[int] | None = None
) -> dict[int, Latest]:
    """Newest sample per device within `offline_after_s` of now; a device missing here is offline."""
    params: dict[str, object] = {"since": now - timedelta(seconds=thresholds.offline_after_s)}
    sql = _LATEST_SQL.format(filter="")
    if device_ids is not None:
        if not device_ids:
            return {}
        params["ids"] = list(device_ids)
        sql = _LATEST_SQL.format(filter=" AND device_id = ANY(CAST(:ids AS int4[]))")
    out: dict[int, Latest] = {}
    for device_id, ts, util, mem, procs, power, temp, source in session.execute(text(sql), params).all():
        out[device_id] = Latest(
            device_id, ts, util, mem, procs, power, temp, source, sample_state(util, procs, mem, thresholds)
        )
    return out


@dataclass(frozen=True)
class NowCounts:
    """Devices per current state, in GPU equivalents (a 3g slice counts 3/7)."""

    gpus: Counter[str]
    """Passthrough GPUs per state."""
    slices: Counter[str]
    """MIG slices per state (count of slices)."""
    gpu_equivalents: dict[str, float]
    """Passthrough GPUs, slices by their fraction and unpartitioned capacity, per state."""


def current_state(fleet: Fleet, latest: dict[int, Latest]) -> dict[int, str]:
    """State now of every GPU and slice of the fleet (offline when its newest sample is too old)."""
    states: dict[int, str] = {}
    for pk in fleet.gpus:
        states[pk] = latest[pk].state if pk in latest else OFFLINE
    for pk, sl in fleet.slices.items():
        if sl.retired_at is None:
            states[pk] = latest[pk].state if pk in latest else OFFLINE
    return states


def count_now(fleet: Fleet, states: dict[int, str]) -> NowCounts:
    gpus: Counter[str] = Counter()
    slices: Counter[str] = Counter()
    equivalents: dict[str, float] = {}
    for pk, gpu in fleet.gpus.items():
        live = [s for s in fleet.slices_by_gpu.get(pk, []) if s.retired_at is None]
        if not gpu.mig_mode:
            gpus[states[pk]] += 1
            equivalents[states[pk]] = equivalents.get(states[pk], 0.0) + 1
            continue
        gpu_offline = states[pk] == OFFLINE
        for sl in live:
            state = OFFLINE if gpu_offline else states[sl.pk]
            slices[state] += 1
            equivalents[state] = equivalents.get(state, 0.0) + sl.fraction
        free = gpu.unpartitioned_slices
        if free is None:
            free = max(0, 7 - sum(s.compute_slices for s in live))
        if free:
            key = OFFLINE if gpu_offline else UNPARTITIONED
            equivalents[key] = equivalents.get(key, 0.0) + free / 7
    return NowCounts(gpus=gpus, slices=slices, gpu_equivalents=equivalents)
