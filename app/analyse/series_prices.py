"""Hour-by-hour prices for the charts over time (app/analyse/timeline.py, app/analyse/hour_of_week.py): the price
pieces of app/billing/prices.py as query arrays, and the offline time they pay for.

Each rollup row is priced at the price in force in its hour: that of the piece that covers it (the whole instance's
USD/h per GPU, as `priced.per_gpu_hour`), else the instance's own (`inst.price.usd_per_gpu_hour`, None = unpriced).
A daily row has one price only when its whole day has: inside one piece, or outside every piece. A day of an
instance cut by a piece boundary (a "mixed" instance-day) is read from its hourly rows instead of its daily row, so
pieces cost the hours of those days alone, and a fleet with no bill and no spot history reads nothing more.

A row finds its price without a join or a search: the price classes of each instance at each hour of the span go
into the query as one grid laid out by instance and hour (app/analyse/price_classes.py), which the row reads at its
instance's slot and its hour (a daily row at its day's first hour, which has the whole day's class unless the day is
mixed). The class says what the row's price changes of its instance's own (1: nothing, outside every piece;
alike pieces share a class). The queries sum the rows at their instances' own prices per class, then add each
class's change to those sums: a lookup per row and a few sums per class, never rows x pieces.

Paid-offline pieces (a Capacity Block or Capacity Reservation) price the instance's offline time in them as idle, as
the window analysis does (app/analyse/units.py): each GPU is expected there until the piece ends (or now), even
after its instance was taken for gone. The queries give what the GPUs covered in such pieces at their price
(`gpu_s` x price); `paid_spans` gives what their expected time there costs; the difference is the offline cost.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from ..billing.pieces_memo import PIECES, PiecesMemo, kept_pieces
from ..billing.prices import PricedInstance, PricePiece
from .fleet import Fleet
from .price_classes import HOUR_S, Grid, Run, section_params, slot_sql, slots
from .price_classes import class_sql as grid_class
from .window import ceil_day, floor_day

Span = tuple[int, datetime, datetime]
"""(row index, from, to): when a GPU should have sent data."""
PaidSpan = tuple[int, datetime, datetime, float]
"""(row index, from, to, USD per second): a GPU's expected time in paid capacity, at its price."""

CLASS_ARRAYS = (("cdelta", "float8"), ("cdnp", "float8"), ("cpay", "float8"))
"""Per price class: what it adds to the instance's own USD per GPU-hour and to its 1-if-unpriced, and USD per
GPU-hour of paid-offline capacity (0 outside it)."""
MIXED_ARRAYS = (("mpk", "int8"), ("mday", "timestamptz"))
"""The mixed instance-days: instance pk, UTC midnight."""
DAY_SQL = "interval '24 hours'"
"""A UTC day, whatever the session's time zone."""
MIXED_CTE = (
    "m AS (SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {t}[])" for name, t in MIXED_ARRAYS)
    + ") AS m(pk, day))"
)


def class_sql(pk: str, epoch: str) -> str:
    """The price class of a row of instance `pk` at `epoch` (seconds, float8): 1 or more."""
    return grid_class("sg", slot_sql("sslot", pk, "slo", "shi"), epoch, "sg")


def of_class(array: str, c: str) -> str:
    """`array` (a name of CLASS_ARRAYS) at price class `c`."""
    return f"(CAST(:{array} AS float8[]))[{c}]"


@dataclass
class SeriesPrices:
    """The pieces that change some hour's price as price classes (CLASS_ARRAYS, starting with class 1, which changes
    nothing) and, per instance pk, its runs of one class; the hours they are laid out over (`span`: first hour, epoch
    seconds, and how many); the mixed instance-days (MIXED_ARRAYS); and the paid-offline pieces by instance pk:
    (from, to, USD per GPU-hour)."""

    cdelta: list[float] = field(default_factory=lambda: [0.0])
    cdnp: list[float] = field(default_factory=lambda: [0.0])
    cpay: list[float] = field(default_factory=lambda: [0.0])
    classes: dict[tuple[float, float, float], int] = field(default_factory=lambda: {(0.0, 0.0, 0.0): 1})
    runs: dict[int, list[Run]] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)
    mpk: list[int] = field(default_factory=list)
    mday: list[datetime] = field(default_factory=list)
    paid: dict[int, list[tuple[datetime, datetime, float]]] = field(default_factory=dict)
    _params: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def priced(self) -> bool:
        """Whether any hour is priced otherwise than at its instance's own price (else the plain queries do)."""
        return bool(self.runs)

    def params(self) -> dict[str, Any]:
        """The query parameters of a priced query; none without pieces. Made once: several queries take them."""
        if not self.priced:
            return {}
        if self._params is None:
            self._params = self._make_params()
        return dict(self._params)

    def _make_params(self) -> dict[str, Any]:
        pks = sorted(self.runs)
        grid = Grid()
        start, n = self.span
        first = grid.section(self.runs, pks, start, HOUR_S, n)
        sslot, slo, shi = slots({pk: i for i, pk in enumerate(pks, start=1)})
        return (
            {name: getattr(self, name) for name, _t in (*CLASS_ARRAYS, *MIXED_ARRAYS)}
            | section_params("sg", first, n, start, HOUR_S)
            | {"sg": grid.to_bytes(), "sslot": sslot, "slo": slo, "shi": shi}
        )

    def signature(self) -> Hashable:
        """What the query parameters are made of (classes, runs, span, mixed days): equal signatures, equal
        parameters."""
        return (
            tuple(self.cdelta),
            tuple(self.cdnp),
            tuple(self.cpay),
            tuple((pk, tuple(runs)) for pk, runs in sorted(self.runs.items())),
            self.span,
            tuple(self.mpk),
            tuple(self.mday),
        )

    def within(self, start: datetime, end: datetime, daily: Sequence[tuple[datetime, datetime]]) -> SeriesPrices:
        """These prices for a query that reads only [start, end) of their span, with the daily reads `daily`: each run
        cut to it, the classes those runs use, the mixed days inside `daily`; no paid-offline pieces (`paid_spans`
        takes them from the whole). As `series_prices` over [start, end) gives them, without going over the pieces
        again."""
        lo, hi = int(start.timestamp()), int(end.timestamp())
        out = SeriesPrices()
        price = {c: (d, n, p) for (d, n, p), c in self.classes.items()}
        for pk, runs in self.runs.items():
            cut = [(max(a, lo), min(b, hi), out.class_of(price[c])) for a, b, c in runs if a < hi and b > lo]
            if cut:
                out.runs[pk] = cut
        days = [(a.timestamp(), b.timestamp()) for a, b in daily]
        for pk, day in zip(self.mpk, self.mday, strict=True):
            if any(a <= day.timestamp() < b for a, b in days):
                out.mpk.append(pk)
                out.mday.append(day)
        first, last = int(floor_day(start).timestamp()), int(ceil_day(end).timestamp())
        out.span = (first, (last - first) // HOUR_S)
        return out

    def class_of(self, price: tuple[float, float, float]) -> int:
        c = self.classes.get(price)
        if c is None:
            c = self.classes[price] = len(self.classes) + 1
            self.cdelta.append(price[0])
            self.cdnp.append(price[1])
            self.cpay.append(price[2])
        return c


def load_pieces(
    session: Session,
    fleet: Fleet,
    start: datetime,
    end: datetime,
    pks: Collection[int] | None = None,
    *,
    memo: PiecesMemo = PIECES,
) -> dict[int, list[PricePiece]]:
    """The price pieces of the fleet's instances (those of `pks` only, when given) over the whole UTC days around
    [start, end): every hour a rollup read of that span touches (a daily row, the hours taken from it)."""
    wanted = tuple(
        PricedInstance(i.pk, i.instance_id, i.lifecycle, i.instance_type, i.availability_zone)
        for i in fleet.instances.values()
        if pks is None or i.pk in pks
    )
    return kept_pieces(session, wanted, floor_day(start), ceil_day(end), memo=memo)


def series_prices(
    fleet: Fleet,
    pieces: Mapping[int, Sequence[PricePiece]],
    pks: Collection[int],
    *,
    start: datetime,
    end: datetime,
    daily: Sequence[tuple[datetime, datetime]] = (),
) -> SeriesPrices:
    """The pieces (time-ordered, apart, by instance pk) of the instances in `pks` over [start, end), the span a query
    reads, as query arrays: those whose price (per GPU-hour, or unpriced where the instance's GPU count is unknown,
    as in the window analysis) differs from the instance's own, and the paid-offline ones; and the instance-days
    inside the spans read from daily rows (`daily`, on UTC midnights) that a piece boundary cuts. Work in proportion
    to the pieces."""
    out = SeriesPrices()
    lo, hi = start.timestamp(), end.timestamp()
    days = [(a.timestamp(), b.timestamp()) for a, b in daily]
    mixed: set[tuple[int, float]] = set()
    for pk in sorted(pieces):
        inst = fleet.instances.get(pk)
        if inst is None or pk not in pks:
            continue
        own, gpus = inst.price.usd_per_gpu_hour, inst.price.gpus
        if not gpus and own is None:
            continue  # unpriced with or without its pieces
        # Runs of pieces at one price: where the bill gives way to spot history at the same price, nothing changes.
        runs: list[tuple[int, int, tuple[float, float, float]]] = []
        listed = pieces[pk]
        # Time-ordered and apart: the first piece ending after `lo`, then on until one starts at `hi`.
        for piece in listed[bisect_right(listed, lo, key=_end_s) :]:
            a, b = piece.start_s, piece.end_s
            if a >= hi:
                break
            if b <= a:
                continue
            rate = piece.usd_per_hour / gpus if gpus else None  # as priced.per_gpu_hour
            paid = piece.paid_offline and rate is not None
            if not paid and rate is not None and own is not None and abs(rate - own) < 1e-12:
                continue
            if paid and rate is not None:
                out.paid.setdefault(pk, []).append((piece.start, piece.end, rate))
            price = (
                (rate or 0.0) - (own or 0.0),
                float((rate is None) - (own is None)),
                rate if paid and rate else 0.0,
            )
            if runs and runs[-1][1] == a and runs[-1][2] == price:
                runs[-1] = (runs[-1][0], b, price)
            else:
                runs.append((a, b, price))
        if runs:
            out.runs[pk] = [(int(a), int(b), out.class_of(price)) for a, b, price in runs]
        for a, b, _price in runs:
            for t in (a, b):
                into = t % 86400
                if into and any(day_a < t < day_b for day_a, day_b in days):
                    mixed.add((pk, t - into))
    # Every hour the reads touch: the whole UTC days around [start, end).
    first, last = int(floor_day(start).timestamp()), int(ceil_day(end).timestamp())
    out.span = (first, (last - first) // HOUR_S)
    for pk, day in sorted(mixed):
        out.mpk.append(pk)
        out.mday.append(datetime.fromtimestamp(day, UTC))
    return out


def _end_s(piece: PricePiece) -> int:
    return piece.end_s


def paid_spans(
    fleet: Fleet, prices: SeriesPrices, rows: Mapping[int, int], *, start: datetime, end: datetime, now: datetime
) -> tuple[list[Span], list[PaidSpan]]:
    """For the GPUs of `rows` (GPU pk -> row index) whose instance has paid-offline pieces: the time they are
    expected in those pieces beyond their usual span (after their instance was taken for gone), which is offline
    too, and their whole expected time there at its price in USD per second."""
    more: list[Span] = []
    usd: list[PaidSpan] = []
    if not prices.paid:
        return more, usd
    for gpu in fleet.gpus.values():
        paid = prices.paid.get(gpu.instance.pk)
        r = rows.get(gpu.pk)
        if paid is None or r is None:
            continue
        first = max(start, gpu.first_seen)
        usual_end = min(end, now, gpu.instance.tracked_until)
        for a, b, rate in paid:
            lo, hi = max(a, first), min(b, end, now)
            if hi > lo:
                usd.append((r, lo, hi, rate / 3600))
                if hi > max(lo, usual_end):
                    more.append((r, max(lo, usual_end), hi))
    return more, usd


def spread(
    spans: Iterable[tuple[int, datetime, datetime, float]], t0: datetime, step: timedelta, n: int
) -> dict[int, list[float]]:
    """Per row, the seconds of its spans (row, from, to, weight) in each of the `n` buckets of `step` from `t0`,
    each second counted `weight` times. Each span adds its partial first and last buckets and marks its whole ones
    in a difference array, so the cost is spans + rows x buckets, never spans x buckets."""
    step_s = step.total_seconds()
    marks: dict[int, tuple[list[float], list[float]]] = {}
    for r, lo, hi, weight in spans:
        if hi <= lo:
            continue
        whole, part = marks.setdefault(r, ([0.0] * (n + 1), [0.0] * (n + 1)))
        a, b = (lo - t0).total_seconds(), (hi - t0).total_seconds()
        i, j = int(a // step_s), int(b // step_s)
        if i == j:
            part[i] += (b - a) * weight
            continue
        part[i] += ((i + 1) * step_s - a) * weight
        whole[i + 1] += weight
        whole[j] -= weight
        part[j] += (b - j * step_s) * weight
    out = {}
    for r, (whole, part) in marks.items():
        running = 0.0
        cells = []
        for k in range(n):
            running += whole[k]
            cells.append(part[k] + running * step_s)
        out[r] = cells
    return out
