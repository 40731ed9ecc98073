"""Units priced hour by hour where the bill or the spot price history knows the price (app/billing/prices.py).

An instance's window is cut into its price pieces and the rest. Each piece is analysed as a window of its own, at
its price, and what the pieces leave of each device's usage (and of its expected time) is analysed at the
instance's own price; a unit's parts then add up. Every figure of hours is as without the pieces; only money
changes. A GPU whose MIG mode changed in the window has its usage split by mode, not by price: its instance keeps
its own price over the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..billing.prices import PricedInstance, PricePiece, price_pieces
from .figures import Unit
from .fleet import Fleet, GpuInfo, InstanceInfo
from .units import build_units
from .usage import DeviceUsage, usage_of_spans
from .window import Window

_NOISE = 1e-6  # seconds: what subtracting sums of floats leaves of nothing


def billed_until(session: Session) -> datetime | None:
    """End of the newest hour of any imported bill; None before any import."""
    newest = session.execute(text("SELECT max(newest_hour) FROM billing_exports")).scalar()
    return None if newest is None else newest + timedelta(hours=1)


def instance_pieces(session: Session, fleet: Fleet, window: Window) -> dict[int, list[PricePiece]]:
    """The price pieces of the fleet's instances in the window, by instance pk."""
    wanted = [
        PricedInstance(i.pk, i.instance_id, i.lifecycle, i.instance_type, i.availability_zone)
        for i in fleet.instances.values()
    ]
    return price_pieces(session, wanted, window.start, window.end)


def priced_units(
    session: Session,
    fleet: Fleet,
    usage: Mapping[int, DeviceUsage],
    window: Window,
    split: dict[int, tuple[DeviceUsage, DeviceUsage]],
    pieces: Mapping[int, list[PricePiece]],
    *,
    idle_util_pct: int,
) -> list[Unit]:
    """The fleet's units (app/analyse/waste.py, `build_units`), each priced piece by piece."""
    by_mode = {fleet.gpus[pk].instance.pk for pk in split if pk in fleet.gpus}
    pieces = {pk: ps for pk, ps in pieces.items() if pk in fleet.instances and pk not in by_mode and ps}
    if not pieces:
        return build_units(fleet, usage, window, split)
    devices = _devices(fleet, pieces)
    spans: dict[tuple[datetime, datetime], list[tuple[int, PricePiece]]] = {}
    for pk, ps in pieces.items():
        for piece in ps:
            spans.setdefault((piece.start, piece.end), []).append((pk, piece))
    order = list(spans)
    windows = [Window(start=a, end=b, now=window.now, label=window.label) for a, b in order]
    wanted = [[d for pk, _p in spans[span] for d in devices[pk]] for span in order]
    read = usage_of_spans(
        session, [(w.rollup_reads(), ids) for w, ids in zip(windows, wanted, strict=True)], idle_util_pct=idle_util_pct
    )

    rest = dict(usage)
    due: dict[int, float] = {}
    for gpu in _gpus(fleet, pieces):
        due[gpu.pk] = _expected(gpu, window, paid=False)
    parts: list[list[Unit]] = []
    for w, span, found in zip(windows, order, read, strict=True):
        members = dict(spans[span])
        sub = _subfleet(fleet, members)
        expected = {g.pk: _expected(g, w, paid=members[g.instance.pk].paid_offline) for g in sub.gpus.values()}
        for pk, seconds in expected.items():
            due[pk] = max(0.0, due[pk] - seconds)
        for device, used in found.items():
            whole = rest.get(device)
            if whole is not None:
                rest[device] = _minus(whole, used)
        rates = {pk: _per_gpu_hour(sub.instances[pk], p.usd_per_hour) for pk, p in members.items()}
        paid = {pk for pk, p in members.items() if p.paid_offline}
        units = build_units(sub, found, w, rates=rates, expected=expected, paid_offline=paid)
        for u in units:
            cost = u.figures().cost
            u.sources = {members[u.instance.pk].source: cost} if cost else {}
        parts.append(units)

    units = build_units(fleet, rest, window, split, expected=due)
    by_key = {(u.kind, u.key): u for u in units}
    for part in parts:
        for u in part:
            mine = by_key.get((u.kind, u.key))
            if mine is None:
                by_key[u.kind, u.key] = u
                units.append(u)
            else:
                mine.merge(u)
    return units


def _per_gpu_hour(inst: InstanceInfo, usd_per_hour: float) -> float | None:
    gpus = inst.price.gpus
    return usd_per_hour / gpus if gpus else None


def _expected(gpu: GpuInfo, window: Window, *, paid: bool) -> float:
    """Seconds of `window` in which the GPU should have sent data; in paid capacity, until the window ends (or now)
    even after its instance was taken for gone, since the capacity is paid all the same."""
    start = max(window.start, gpu.first_seen)
    end = min(window.end, window.now) if paid else min(window.end, window.now, gpu.instance.tracked_until)
    return max(0.0, (end - start).total_seconds())


def _minus(whole: DeviceUsage, part: DeviceUsage) -> DeviceUsage:
    values = [a - b for a, b in zip(whole[1:], part[1:], strict=True)]
    return DeviceUsage(whole.device_id, *[0.0 if abs(v) < _NOISE else v for v in values])


def _devices(fleet: Fleet, pieces: Mapping[int, object]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {pk: [] for pk in pieces}
    for gpu in fleet.gpus.values():
        if gpu.instance.pk in out:
            out[gpu.instance.pk].append(gpu.pk)
    for sl in fleet.slices.values():
        if sl.gpu.instance.pk in out:
            out[sl.gpu.instance.pk].append(sl.pk)
    return out


def _gpus(fleet: Fleet, pieces: Mapping[int, object]) -> Iterable[GpuInfo]:
    return (g for g in fleet.gpus.values() if g.instance.pk in pieces)


def _subfleet(fleet: Fleet, instances: Mapping[int, object]) -> Fleet:
    gpus = {pk: g for pk, g in fleet.gpus.items() if g.instance.pk in instances}
    return Fleet(
        instances={pk: fleet.instances[pk] for pk in instances},
        gpus=gpus,
        slices={pk: s for pk, s in fleet.slices.items() if s.gpu.pk in gpus},
        options=fleet.options,
        total_instances=fleet.total_instances,
        slices_by_gpu={pk: s for pk, s in fleet.slices_by_gpu.items() if pk in gpus},
    )
