"""Units priced hour by hour where the bill or the spot price history knows the price (app/billing/prices.py).

Units are first built at their instances' own prices (agent, price file, catalog), then each is repriced by what
the pieces change: its hours in a piece cost the piece's price instead (app/analyse/device_money.py sums them per
device in one query), and the offline time of a GPU in paid capacity (a Capacity Block or Reservation) is paid for.
Hours are the same as without the pieces; only money changes. A GPU whose MIG mode changed in the window has its
hours and its money split by mode hour by hour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..billing.prices import BILLED, SPOT_HISTORY, PricePiece
from .device_money import ZERO, DeviceMoney, hourly_money, plus
from .figures import GPU, SLICE, Figures, Unit
from .fleet import Fleet, InstanceInfo
from .price_classes import PriceClasses
from .states import UNPARTITIONED
from .units import build_units, expected_s
from .usage import DeviceUsage, mig_mode_at
from .window import Window


def billed_until(session: Session) -> datetime | None:
    """End of the newest hour of any imported bill; None before any import."""
    newest = session.execute(text("SELECT max(newest_hour) FROM billing_exports")).scalar()
    return None if newest is None else newest + timedelta(hours=1)


def pieces_in_use(fleet: Fleet, pieces: Mapping[int, list[PricePiece]]) -> dict[int, list[PricePiece]]:
    """The pieces the analysis prices by: those of the fleet's instances that can price some of its data."""
    out: dict[int, list[PricePiece]] = {}
    for pk, ps in pieces.items():
        inst = fleet.instances.get(pk)
        if inst is None:
            continue
        # A piece wholly before the instance was first seen, or after its data stopped (unless paid while
        # offline), prices nothing: a spot pool's prices cover the whole window, the instance perhaps a day of it.
        kept = [p for p in ps if p.end > inst.first_seen and (p.paid_offline or p.start < inst.tracked_until)]
        if kept:
            out[pk] = kept
    return out


def priced_units(
    session: Session,
    fleet: Fleet,
    usage: Mapping[int, DeviceUsage],
    window: Window,
    split: dict[int, tuple[DeviceUsage, DeviceUsage]],
    pieces: Mapping[int, list[PricePiece]],
    classes: PriceClasses,
    *,
    idle_util_pct: int,
    mode_at: Mapping[int, list[tuple[datetime, bool]]],
    money: Mapping[int, DeviceMoney],
) -> list[Unit]:
    """The fleet's units (app/analyse/waste.py, `build_units`) at their instances' own prices, then repriced by
    what the pieces (as `pieces_in_use` leaves them, over the whole days the window's rollup reads touch; `classes`:
    the same as `price_classes` makes them) change: each hour in a piece at the piece's price, and the offline time
    in paid capacity paid for. A GPU of `split`, whose MIG mode changed in the window (`mode_at`: its changes, as
    app/analyse/usage.py `hourly_split` takes them), has its money split by mode hour by hour, as its hours are.
    `money`: the devices' money over the window, as app/analyse/device_money.py `usage_and_money` reads it."""
    paid = _paid_offline(fleet, pieces, window)
    due = {pk: expected_s(fleet.gpus[pk], window) + extra_s for pk, (extra_s, _usd) in paid.items()}
    units = build_units(fleet, usage, window, split, expected=due)
    if not pieces:
        return units
    devices = priced_devices(fleet, pieces)
    by_mode: dict[int, tuple[DeviceMoney, DeviceMoney]] = {}
    switched = {pk: devices[pk] for pk in split if pk in devices}
    hours = hourly_money(session, switched, classes, window.start, window.end, idle_util_pct=idle_util_pct)
    for pk, by_hour in hours.items():
        mig, passthrough = ZERO, ZERO
        for hour, m in by_hour:
            if mig_mode_at(mode_at[pk], hour):
                mig = plus(mig, m)
            else:
                passthrough = plus(passthrough, m)
        by_mode[pk] = (mig, passthrough)
    slice_money: dict[int, list[DeviceMoney]] = {}
    for u in units:
        if u.kind == SLICE and u.slice is not None and u.weight is not None:
            found = money.get(u.slice.pk)
            if found is not None:
                slice_money.setdefault(u.gpu.pk, []).append(_scaled(found, u.weight))
    offline_to: dict[int, Unit] = {}
    for u in units:
        if u.instance.pk in pieces and u.kind in (GPU, UNPARTITIONED):
            offline_to.setdefault(u.gpu.pk, u)  # build_units puts a GPU's offline time on its first unit
    for u in units:
        if u.instance.pk not in pieces or u.weight is None:
            continue
        if u.kind == UNPARTITIONED:
            if u.figures().unpartitioned_h <= 0:
                m = ZERO
            else:
                whole = by_mode.get(u.gpu.pk, (ZERO, ZERO))[0] if u.gpu.pk in split else money.get(u.gpu.pk, ZERO)
                m = _minus_money(whole, slice_money.get(u.gpu.pk, ()))
        elif u.kind == GPU and u.gpu.pk in split:
            m = by_mode.get(u.gpu.pk, (ZERO, ZERO))[1]
        else:
            m = _scaled(money.get(u.slice.pk if u.slice is not None else u.gpu.pk, ZERO), u.weight)
        paid_usd = 0.0
        if offline_to.get(u.gpu.pk) is u and u.gpu.pk in paid:
            gpu_money = money.get(u.gpu.pk, ZERO)
            paid_usd = max(0.0, paid[u.gpu.pk][1] - gpu_money.paid_usd)
        _reprice(u, m, paid_usd)
    return units


def _reprice(u: Unit, m: DeviceMoney, paid_usd: float) -> None:
    """Move a unit's money from its own price to the pieces' in the hours `m` (the unit's share) gives."""
    f = u.figures()
    own = u.usd_per_gpu_hour or 0.0
    piece_usd = m.billed_usd + m.spot_usd
    d_cost = piece_usd - own * m.piece_s / 3600
    change = Figures(cost=d_cost + paid_usd)
    if u.kind == UNPARTITIONED:
        # All of it idle with no utilization (units._free_figures); the paid offline time is idle, not unpartitioned.
        change.idle_cost = d_cost + paid_usd
        change.unused_cost = change.unpartitioned_cost = d_cost
    else:
        change.idle_cost = m.free_usd - own * m.piece_free_s / 3600 + paid_usd
        change.idle_held_cost = (m.below_usd - m.free_usd) - own * (m.piece_below_s - m.piece_free_s) / 3600
        change.unused_cost = m.unused_usd - own * m.piece_unused_s / 3600
    if u.usd_per_gpu_hour is None:
        change.unpriced_gpu_hours = -min(f.unpriced_gpu_hours, m.piece_s / 3600)
    own_usd = f.cost + change.cost - piece_usd - paid_usd
    sources = {BILLED: m.billed_usd + paid_usd, SPOT_HISTORY: m.spot_usd}
    kind = u.instance.price.kind
    if kind is not None:
        sources[kind] = sources.get(kind, 0.0) + own_usd
    u.reprice(change, sources, own * (f.gpu_hours - m.piece_s / 3600) + piece_usd)


def _scaled(m: DeviceMoney, weight: float) -> DeviceMoney:
    """A device's money as a unit of `weight` GPUs sees it; seconds become GPU-seconds."""
    return DeviceMoney(*[v * weight for v in m])


def _minus_money(whole: DeviceMoney, parts: Iterable[DeviceMoney]) -> DeviceMoney:
    """What slices leave of their GPU's money: its unpartitioned capacity's."""
    out = list(whole)
    for part in parts:
        for i, v in enumerate(part):
            out[i] -= v
    return DeviceMoney(*out)


def _paid_offline(
    fleet: Fleet, pieces: Mapping[int, list[PricePiece]], window: Window
) -> dict[int, tuple[float, float]]:
    """Per GPU (pk) of an instance with paid-offline pieces in the window: the seconds it is expected there after its
    instance was taken for gone (offline too), and what all its expected time there costs, USD."""
    out: dict[int, tuple[float, float]] = {}
    for gpu in fleet.gpus.values():
        inst = gpu.instance
        paid = [p for p in pieces.get(inst.pk, ()) if p.paid_offline]
        if not paid:
            continue
        first = max(window.start, gpu.first_seen)
        usual_end = min(window.end, window.now, inst.tracked_until)
        extra = usd = 0.0
        for p in paid:
            rate = per_gpu_hour(inst, p.usd_per_hour)
            lo, hi = max(p.start, first), min(p.end, window.end, window.now)
            if rate is None or hi <= lo:
                continue
            usd += (hi - lo).total_seconds() * rate / 3600
            extra += max(0.0, (hi - max(lo, usual_end)).total_seconds())
        out[gpu.pk] = (extra, usd)
    return out


def per_gpu_hour(inst: InstanceInfo, usd_per_hour: float) -> float | None:
    """A whole instance's price (a piece's, USD/h) per GPU, USD per GPU-hour; None when its GPU count is unknown."""
    gpus = inst.price.gpus
    return usd_per_hour / gpus if gpus else None


def priced_devices(fleet: Fleet, pieces: Mapping[int, object]) -> dict[int, int]:
    """The GPUs and slices of the instances with pieces: device id -> instance pk."""
    out = {gpu.pk: gpu.instance.pk for gpu in fleet.gpus.values() if gpu.instance.pk in pieces}
    out.update((sl.pk, sl.gpu.instance.pk) for sl in fleet.slices.values() if sl.gpu.instance.pk in pieces)
    return out
