"""What each device is doing right now: its newest sample, if one arrived within the offline bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from .fleet import Fleet, free_slices
from .states import OFFLINE, UNKNOWN, UNPARTITIONED, Thresholds, sample_state


# Slotted, not frozen: thousands are made per page view, and a frozen dataclass's __init__ costs several times more.
@dataclass(slots=True)
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


def current_state(fleet: Fleet, latest: dict[int, Latest]) -> dict[int, str]:
    """State now of every GPU and slice of the fleet (offline when its newest sample is too old)."""
    states: dict[int, str] = {}
    for pk in fleet.gpus:
        states[pk] = latest[pk].state if pk in latest else OFFLINE
    for pk, sl in fleet.slices.items():
        if sl.retired_at is None:
            states[pk] = latest[pk].state if pk in latest else OFFLINE
    return states


def gpu_equivalents_now(fleet: Fleet, states: dict[int, str]) -> dict[str, float]:
    """GPUs per current state: passthrough GPUs count 1, slices their fraction, free MIG capacity its share
    (as unpartitioned); everything on a GPU whose own data stopped counts as offline. On a GPU whose layout is
    not known in full, what its sized slices leave (slices of unknown size, and free capacity) counts as
    unknown: neither free nor any slice's state."""
    out: dict[str, float] = {}
    for pk, gpu in fleet.gpus.items():
        if not gpu.mig_mode:
            out[states[pk]] = out.get(states[pk], 0.0) + 1
            continue
        gpu_offline = states[pk] == OFFLINE
        live = fleet.live_slices(pk)
        sized = 0.0
        for sl in live:
            share = sl.fraction
            if share is None:
                continue
            sized += share
            state = OFFLINE if gpu_offline else states[sl.pk]
            out[state] = out.get(state, 0.0) + share
        free = free_slices(gpu, live)
        if free is None:
            rest = max(0.0, 1.0 - sized)
            if rest > 0:
                key = OFFLINE if gpu_offline else UNKNOWN
                out[key] = out.get(key, 0.0) + rest
        elif free:
            key = OFFLINE if gpu_offline else UNPARTITIONED
            out[key] = out.get(key, 0.0) + free / 7
    return out
