"""Units priced hour by hour where the bill or the spot price history knows the price (app/billing/prices.py).

An instance's window is cut into its price pieces and the rest. Each piece is analysed as a window of its own, at
its price, and what the pieces leave of each device's usage (and of its expected time) is analysed at the
instance's own price; a unit's parts then add up. Every figure of hours is as without the pieces; only money
changes. A GPU whose MIG mode changed in the window has its usage split by mode, not by price: its instance keeps
its own price over the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..billing.prices import PricedInstance, PricePiece, price_pieces
from .figures import Unit
from .fleet import Fleet, GpuInfo, InstanceInfo
from .units import build_units
from .usage import DeviceUsage, usage_of_spans
from .window import DAILY, Window

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


def pieces_in_use(
    fleet: Fleet, pieces: Mapping[int, list[PricePiece]], split: Mapping[int, object]
) -> dict[int, list[PricePiece]]:
    """The pieces the analysis prices by: those of the fleet's instances, but for an instance with a GPU whose MIG
    mode changed in the window (`split`, by GPU pk), whose usage is split by mode, not by price."""
    by_mode = {fleet.gpus[pk].instance.pk for pk in split if pk in fleet.gpus}
    out: dict[int, list[PricePiece]] = {}
    for pk, ps in pieces.items():
        inst = fleet.instances.get(pk)
        if inst is None or pk in by_mode:
            continue
        # A piece wholly before the instance was first seen, or after its data stopped (unless paid while
        # offline), prices nothing: a spot pool's prices cover the whole window, the instance perhaps a day of it.
        kept = [p for p in ps if p.end > inst.first_seen and (p.paid_offline or p.start < inst.tracked_until)]
        if kept:
            out[pk] = kept
    return out


@dataclass(frozen=True)
class PriceDeltas:
    """The pieces as rollup reads (`Window.rollup_reads` of each piece) with what each changes of its instance's
    own price: per read its piece number, instance pk, whether it reads the daily rows, its bounds, its sign, the
    difference from the own price in USD per GPU-hour (the piece's price where the instance has none of its own),
    1 where the piece prices hours that are otherwise unpriced, the own price and the piece's source. Query arrays,
    in that order."""

    n: list[int] = field(default_factory=list)
    pk: list[int] = field(default_factory=list)
    daily: list[bool] = field(default_factory=list)
    a: list[datetime] = field(default_factory=list)
    b: list[datetime] = field(default_factory=list)
    sign: list[float] = field(default_factory=list)
    delta: list[float] = field(default_factory=list)
    np: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    """The instance's own price, USD per GPU-hour (0 where it has none)."""
    src: list[str] = field(default_factory=list)
    """The piece's source (app/billing/prices.py: BILLED or SPOT_HISTORY)."""

    def params(self) -> dict[str, list[Any]]:
        return {f"p{name}": getattr(self, name) for name in PRICE_DELTA_ARRAYS}


PRICE_DELTA_ARRAYS = ("n", "pk", "daily", "a", "b", "sign", "delta", "np", "own", "src")


def price_deltas(fleet: Fleet, pieces: Mapping[int, list[PricePiece]], window: Window) -> PriceDeltas:
    """What the pieces change of the instances' own prices, as reads of the rollups; pieces of instances whose GPU
    count is unknown (their price per GPU is unknown) change nothing."""
    out = PriceDeltas()
    count = 0
    for pk, ps in pieces.items():
        inst = fleet.instances[pk]
        own = inst.price.usd_per_gpu_hour
        for piece in ps:
            rate = per_gpu_hour(inst, piece.usd_per_hour)
            if rate is None:
                continue
            count += 1
            w = Window(start=piece.start, end=piece.end, now=window.now, label=window.label)
            for read in w.rollup_reads():
                out.n.append(count)
                out.pk.append(pk)
                out.daily.append(read.table == DAILY)
                out.a.append(read.start)
                out.b.append(read.end)
                out.sign.append(float(read.sign))
                out.delta.append(rate - (own or 0.0))
                out.np.append(1.0 if own is None else 0.0)
                out.own.append(own or 0.0)
                out.src.append(piece.source)
    return out


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
    """The fleet's units (app/analyse/waste.py, `build_units`), each priced piece by piece (`pieces` as
    `pieces_in_use` leaves them)."""
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
    gpus_of: dict[int, list[GpuInfo]] = {}
    for gpu in _gpus(fleet, pieces):
        due[gpu.pk] = _expected(gpu, window, paid=False)
        gpus_of.setdefault(gpu.instance.pk, []).append(gpu)
    parts: list[list[Unit]] = []
    for w, span, found in zip(windows, order, read, strict=True):
        members = dict(spans[span])
        sub = _subfleet(fleet, gpus_of, members)
        expected = {g.pk: _expected(g, w, paid=members[g.instance.pk].paid_offline) for g in sub.gpus.values()}
        for pk, seconds in expected.items():
            due[pk] = max(0.0, due[pk] - seconds)
        for device, used in found.items():
            whole = rest.get(device)
            if whole is not None:
                rest[device] = _minus(whole, used)
        rates = {pk: per_gpu_hour(sub.instances[pk], p.usd_per_hour) for pk, p in members.items()}
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


def per_gpu_hour(inst: InstanceInfo, usd_per_hour: float) -> float | None:
    """A whole instance's price (a piece's, USD/h) per GPU, USD per GPU-hour; None when its GPU count is unknown."""
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


def _subfleet(fleet: Fleet, gpus_of: Mapping[int, list[GpuInfo]], instances: Mapping[int, object]) -> Fleet:
    gpus = {g.pk: g for pk in instances for g in gpus_of.get(pk, ())}
    by_gpu = fleet.slices_by_gpu
    return Fleet(
        instances={pk: fleet.instances[pk] for pk in instances},
        gpus=gpus,
        slices={s.pk: s for pk in gpus for s in by_gpu.get(pk, ())},
        options=fleet.options,
        total_instances=fleet.total_instances,
        slices_by_gpu={pk: by_gpu[pk] for pk in gpus if pk in by_gpu},
    )
