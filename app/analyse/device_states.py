"""Each device's state hour by hour, for the instance page's state strips.

An hour's state is the one that held most of its seconds, from the hourly rollups and the same split as the window
analysis (docs/waste.md, "States"); the seconds of the hour with no data count as offline. Consecutive hours of
one state are one span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from ..db import fetch_binary
from ..models import UTIL_BOUNDS
from .states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN
from .window import HOUR, floor_hour


@dataclass(frozen=True)
class StateSpan:
    start: datetime
    end: datetime
    state: str


def _sql(bound: int) -> str:
    if bound not in UTIL_BOUNDS:
        raise ValueError(f"idle threshold {bound} is not a rollup bound")
    return (
        f"SELECT device_id, hour, secs, util_known_s, util_lt{bound}_s, free_lt{bound}_s FROM rollups_hourly "
        "WHERE device_id = ANY(CAST(:ids AS int4[])) AND hour >= :a AND hour < :b"
    )


_ORDER = (ACTIVE, IDLE_HELD, IDLE, UNKNOWN, OFFLINE)


def _dominant(secs: float, known: float, below: float, free: float, length: float) -> str:
    """The state with the most seconds; ties go to the first of _ORDER."""
    shares = (known - below, below - free, free, secs - known, length - secs)
    return _ORDER[shares.index(max(shares))]


def hourly_states(
    session: Session,
    first_seen: Mapping[int, datetime],
    *,
    start: datetime,
    end: datetime,
    idle_util_pct: int,
) -> dict[int, list[StateSpan]]:
    """Spans of one state per device (keys of `first_seen`: device id -> when it was first seen), over whole hours
    of [start, end); hours before a device was first seen are left out."""
    ids: Sequence[int] = list(first_seen)
    if not ids or end <= start:
        return {}
    rows = fetch_binary(session, _sql(idle_util_pct), {"ids": list(ids), "a": start, "b": end})
    hours: dict[tuple[int, datetime], tuple[float, float, float, float]] = {
        (d, h): (float(s), float(k), float(b), float(f)) for d, h, s, k, b, f in rows
    }
    out: dict[int, list[StateSpan]] = {}
    for device in ids:
        spans: list[StateSpan] = []
        hour = max(start, floor_hour(first_seen[device]))
        while hour < end:
            length = min(HOUR, end - hour).total_seconds()
            found = hours.get((device, hour))
            state = OFFLINE if found is None else _dominant(*found, length)
            nxt = hour + timedelta(seconds=length)
            if spans and spans[-1].state == state and spans[-1].end == hour:
                spans[-1] = StateSpan(spans[-1].start, nxt, state)
            else:
                spans.append(StateSpan(hour, nxt, state))
            hour = nxt
        out[device] = spans
    return out
