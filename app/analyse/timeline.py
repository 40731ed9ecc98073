"""The fleet over time: GPU-hours per state and USD per time bucket, per row (the fleet, a GPU, an instance, a
tag value), by the rules of `build_units` (app/analyse/waste.py), in one query per call.

Rows made of whole instances (the fleet, an instance, a tag value) read the per-instance rollups
(app/analyse/instance_series.py), where each device was weighed as it was when its seconds arrived. Rows of single
GPUs read the device rollups, every GPU counting in the mode it is in now (in MIG mode, or with slices in the
fleet). Either way, summed over its buckets a timeline gives the figures of the window analysis, except that:

- the window analysis splits a GPU's hours at each MIG mode change inside the window;
- the floors at 0 (unpartitioned capacity, offline time, each state) apply per bucket and rollup row, not once
  per window: they differ only where the data contradicts itself (slices covering more than their GPU);
- slices of unknown size are left out altogether (their hours are counted apart in the window analysis).

Hourly buckets read hourly rollups. Daily buckets read the daily rollups for the days wholly inside the span
and the hours of the partial days at its edges; a span that reaches now reads today's daily row whole, as it
holds only what has arrived so far (as `Window.rollup_reads` does).

Every hour is priced at the price in force then (app/analyse/series_prices.py): the instance's price piece (the
imported bill, spot price history) where one covers the hour, else its own price. A day of an instance cut by a
piece boundary is read hour by hour, so a daily bucket is the sum of its hours at their prices. Offline time in a
paid-offline piece (Capacity Block or Reservation) costs its price and counts as idle, as in the window analysis,
which differs in pricing only where it keeps an instance whose GPU changed MIG mode at its own price throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from ..billing.prices import PricePiece
from ..db import fetch_binary
from .device_series import (
    DAILY,
    SUMS,
    TIMELINE_SQL,
    Read,
    Span,
    check_bound,
    device_arrays,
    grouped_sql,
    read_params,
    reads,
)
from .fleet import Fleet
from .instance_series import instance_params, instance_rows, timeline_sql, totals_sql
from .kept_reads import kept_fetch, params_key, split_reads
from .series_prices import PaidSpan, SeriesPrices, load_pieces, paid_spans, series_prices, spread
from .states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN, UNPARTITIONED, Thresholds
from .window import DAY, HOUR, RollupRead, Window, floor_day, floor_hour
from .window import HOURLY as ROLLUP_HOURLY

HOURLY_UP_TO = timedelta(days=7)
FILTER_INSTANCES_UP_TO = 100
"""Up to this many instances the per-instance rollups are read through their (instance_pk, hour) index."""


def bucket_step(span: timedelta) -> timedelta:
    """Bucket length for a span: hourly up to 7 days, daily beyond."""
    return HOUR if span <= HOURLY_UP_TO else DAY


@dataclass(slots=True)
class BucketFigures:
    """Additive figures of one bucket of one row. Hours are GPU-equivalent hours (a 3g slice counts 3/7 of an
    hour per hour); money is USD and counts priced units of known size only."""

    active_h: float = 0.0
    idle_held_h: float = 0.0
    idle_h: float = 0.0
    """Idle slices and GPUs; free MIG capacity is apart, in `unpartitioned_h`."""
    unpartitioned_h: float = 0.0
    unknown_h: float = 0.0
    offline_h: float = 0.0
    """Hours a GPU was expected to send data and none came, GPU-hours (a MIG GPU counts whole)."""
    cost: float = 0.0
    idle_cost: float = 0.0
    """Cost while idle, unpartitioned capacity included, USD."""
    idle_held_cost: float = 0.0
    unpriced_gpu_hours: float = 0.0
    """GPU-hours of units with no price: their money is left out of every USD figure, never counted as 0."""

    def add(self, other: BucketFigures) -> None:
        self.active_h += other.active_h
        self.idle_held_h += other.idle_held_h
        self.idle_h += other.idle_h
        self.unpartitioned_h += other.unpartitioned_h
        self.unknown_h += other.unknown_h
        self.offline_h += other.offline_h
        self.cost += other.cost
        self.idle_cost += other.idle_cost
        self.idle_held_cost += other.idle_held_cost
        self.unpriced_gpu_hours += other.unpriced_gpu_hours

    @property
    def gpu_hours(self) -> float:
        """GPU-hours with data (every state but offline)."""
        return self.active_h + self.idle_held_h + self.idle_h + self.unpartitioned_h + self.unknown_h

    @property
    def waste(self) -> float:
        """Cost while idle or idle-held, USD."""
        return self.idle_cost + self.idle_held_cost

    @property
    def all_hours(self) -> float:
        return self.gpu_hours + self.offline_h

    @property
    def state_hours(self) -> dict[str, float]:
        """GPU-hours per state, in the order of a state bar (as `Figures.state_hours`)."""
        return {
            ACTIVE: self.active_h,
            IDLE_HELD: self.idle_held_h,
            IDLE: self.idle_h,
            UNPARTITIONED: self.unpartitioned_h,
            UNKNOWN: self.unknown_h,
            OFFLINE: self.offline_h,
        }


@dataclass(frozen=True)
class Timeline:
    """Figures per row and bucket. Bucket i is [starts[i], starts[i] + step), cut to [start, end): a daily
    timeline whose span starts mid-day has a shorter first bucket."""

    starts: list[datetime]
    """Bucket starts, UTC, in order."""
    step: timedelta
    rows: dict[str, list[BucketFigures]]
    """Row key -> one BucketFigures per bucket (zeros where no data)."""
    start: datetime
    end: datetime

    def _picked(self, start: datetime | None, end: datetime | None) -> list[int]:
        # A bucket belongs to the span that holds its first instant.
        first = (max(s, self.start) for s in self.starts)
        return [i for i, s in enumerate(first) if (start is None or s >= start) and (end is None or s < end)]

    def total(
        self, row: str | None = None, *, start: datetime | None = None, end: datetime | None = None
    ) -> BucketFigures:
        """Sum over the buckets that begin in [start, end), of one row or (None) of every row. Split on bucket
        boundaries for exact figures: a bucket across `start` or `end` counts whole, on the side it begins on.
        KeyError for an unknown row."""
        picked = self._picked(start, end)
        out = BucketFigures()
        for figures in [self.rows[row]] if row is not None else self.rows.values():
            for i in picked:
                out.add(figures[i])
        return out

    def buckets(self, rows: Iterable[str] | None = None) -> list[BucketFigures]:
        """Per bucket, the sum over `rows` (None: every row)."""
        out = [BucketFigures() for _ in self.starts]
        for key in self.rows if rows is None else rows:
            for acc, figures in zip(out, self.rows[key], strict=True):
                acc.add(figures)
        return out


def _binds(plain: Mapping[str, Any], priced: SeriesPrices) -> Callable[[], dict[str, Any]]:
    """The query's parameters, made when asked: the price grid only when the query runs."""
    return lambda: dict(plain) | priced.params()


def _split(rs: Sequence[Read], today: datetime) -> tuple[list[Read], list[Read]]:
    """The timeline's reads cut at `today` (a UTC midnight): those before it, and those from it on. Only a daily or
    an hourly read can cross a midnight; a partial day's hours lie within one day."""
    before: list[Read] = []
    after: list[Read] = []
    for kind, a, b in rs:
        if b <= today:
            before.append((kind, a, b))
        elif a >= today:
            after.append((kind, a, b))
        else:
            before.append((kind, a, today))
            after.append((kind, today, b))
    return before, after


def _rollup_reads(rs: Sequence[Read]) -> list[RollupRead]:
    """The rollup rows the reads cover (a partial day's are hourly rows)."""
    return [RollupRead(DAILY if kind == DAILY else ROLLUP_HOURLY, a, b, 1) for kind, a, b in rs]


def _bucket_starts(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    t = floor_day(start) if step == DAY else start
    out = []
    while t < end:
        out.append(t)
        t += step
    return out


def timeline(
    session: Session,
    fleet: Fleet,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    step: timedelta,
    thresholds: Thresholds,
    row_of: Mapping[int, str] | None = None,
    pieces: Mapping[int, list[PricePiece]] | None = None,
) -> Timeline:
    """Figures per row and bucket of [start, end) (UTC hours; `step` HOUR or DAY), in one query, each hour at the
    price in force then.

    `row_of` maps GPU pks to row keys (a GPU's slices and its unpartitioned capacity go with it); GPUs not in
    it are left out, and every key in it gets a row. None: one row "" for the whole fleet. `pieces`: the price
    pieces by instance pk (`series_prices.load_pieces` over a span holding this one); None reads them. ValueError
    for an idle threshold with no rollup bound, a step other than an hour or a day, or a start off the hour.
    """
    bound = check_bound(thresholds)
    if step not in (HOUR, DAY):
        raise ValueError(f"bucket step must be an hour or a day, not {step}")
    if start != floor_hour(start):
        raise ValueError(f"start must be on a UTC hour: {start}")
    keys = [""] if row_of is None else list(dict.fromkeys(row_of.values()))
    index = {k: i for i, k in enumerate(keys)}
    row_index = None if row_of is None else {pk: index[k] for pk, k in row_of.items()}
    starts = _bucket_starts(start, end, step)
    found: list[list[BucketFigures | None]] = [[None] * len(starts) for _ in keys]
    covered_paid: dict[tuple[int, int], float] = {}
    rs = reads(start, end, now, step)
    kinds = tuple(r[0] for r in rs)
    daily = [(a, b) for kind, a, b in rs if kind == DAILY]
    whole = instance_rows(fleet, row_index)
    at = {t: i for i, t in enumerate(starts)}
    gpu_rows = {
        g.pk: r for g in fleet.gpus.values() if (r := 0 if row_index is None else row_index.get(g.pk)) is not None
    }
    pks = set(whole) if whole is not None else {fleet.gpus[pk].instance.pk for pk in gpu_rows}
    if pieces is None:
        pieces = load_pieces(session, fleet, start, end, pks) if pks and starts else {}
    lo, hi = (rs[0][1], rs[-1][2]) if rs else (start, start)
    prices = series_prices(fleet, pieces, pks, start=lo, end=hi, daily=daily)
    if whole is not None:
        # Rows of whole instances: the per-instance rollups.
        params, spans = instance_params(fleet, whole, start=start, end=end, now=now)
        rows = []
        if params["pk"] and starts:
            filtered = len(params["pk"]) <= FILTER_INSTANCES_UP_TO
            before, after = _split(rs, floor_day(now))
            for part in (before, after):
                if not part:
                    continue
                daily_part = [(a, b) for kind, a, b in part if kind == DAILY]
                priced = prices.within(min(r[1] for r in part), max(r[2] for r in part), daily_part)
                sql = timeline_sql(bound, tuple(r[0] for r in part), filtered, priced.priced)
                plain = params | read_params(part)
                if part is after:
                    rows += fetch_binary(session, sql, plain | priced.params())
                else:  # the days before today: kept while their rows stay as they are
                    ids = params["pk"] if filtered else None
                    key = (params_key(plain), priced.signature())
                    binds = _binds(plain, priced)
                    rows += kept_fetch(session, sql, key, binds, rows="instance", reads=_rollup_reads(part), ids=ids)
    else:
        params, spans = device_arrays(fleet, start=start, end=end, now=now, row_of=row_index)
        if params["ids"] and starts:
            sql = grouped_sql(bound, kinds, tuple(SUMS), TIMELINE_SQL, prices.priced)
            rows = fetch_binary(session, sql, params | read_params(rs) | prices.params())
        else:
            rows = []
    for r, b, *values, paid_usd in rows:
        found[r][at[b]] = BucketFigures(*values)
        if paid_usd:
            covered_paid[r, at[b]] = paid_usd
    more, paid = paid_spans(fleet, prices, gpu_rows, start=start, end=end, now=now)
    cells = _with_offline(found, [*spans, *more], starts[0] if starts else start, step, paid, covered_paid)
    return Timeline(starts=starts, step=step, rows=dict(zip(keys, cells, strict=True)), start=start, end=end)


def window_totals(
    session: Session,
    fleet: Fleet,
    window: Window,
    *,
    thresholds: Thresholds,
    pieces: Mapping[int, list[PricePiece]] | None = None,
) -> BucketFigures:
    """The timeline's figures of the whole fleet summed over `window`, for comparing with a previous window."""
    rows = {pk: 0 for pk in fleet.instances}
    return row_totals(session, fleet, window, thresholds=thresholds, rows=rows, pieces=pieces).get(0, BucketFigures())


def row_totals(
    session: Session,
    fleet: Fleet,
    window: Window,
    *,
    thresholds: Thresholds,
    rows: Mapping[int, int],
    pieces: Mapping[int, list[PricePiece]] | None = None,
) -> dict[int, BucketFigures]:
    """The timeline's figures summed over `window` per row of whole instances (`rows`: instance pk -> row index),
    read as the window analysis reads it: whole days from the daily per-instance rollups, the hours around them
    added or taken away, a few rows per instance, each hour at the price in force then (the days a price piece
    cuts read hour by hour). `pieces` as for `timeline`. Rows whose instances have no GPU in the window are
    absent. ValueError for an idle threshold with no rollup bound."""
    bound = check_bound(thresholds)
    params, spans = instance_params(fleet, rows, start=window.start, end=window.end, now=window.now)
    window_reads = window.rollup_reads()
    if pieces is None:
        pieces = load_pieces(session, fleet, window.start, window.end, rows.keys()) if spans else {}
    daily = [(read.start, read.end) for read in window_reads if read.table == DAILY]
    lo = min((read.start for read in window_reads), default=window.start)
    hi = max((read.end for read in window_reads), default=window.start)
    prices = series_prices(fleet, pieces, rows.keys(), start=lo, end=hi, daily=daily)
    gpu_rows = {g.pk: r for g in fleet.gpus.values() if (r := rows.get(g.instance.pk)) is not None}
    more, paid = paid_spans(fleet, prices, gpu_rows, start=window.start, end=window.end, now=window.now)
    expected_s: dict[int, float] = {}
    for r, a, b in [*spans, *more]:
        expected_s[r] = expected_s.get(r, 0.0) + (b - a).total_seconds()
    paid_usd: dict[int, float] = {}
    for r, a, b, usd_per_s in paid:
        paid_usd[r] = paid_usd.get(r, 0.0) + (b - a).total_seconds() * usd_per_s
    found: dict[int, BucketFigures] = {}
    before, after = split_reads(window_reads, floor_day(window.now)) if params["pk"] else ([], [])
    for part in (before, after):
        if not part:
            continue
        daily_part = [(read.start, read.end) for read in part if read.table == DAILY]
        priced = prices.within(min(r.start for r in part), max(r.end for r in part), daily_part)
        plain: dict[str, Any] = dict(params)
        for n, read in enumerate(part):
            plain[f"t{n}a"], plain[f"t{n}b"] = read.start, read.end
        sql = totals_sql(bound, tuple((read.table, read.sign) for read in part), priced.priced)
        if part is after:
            got = fetch_binary(session, sql, plain | priced.params())
        else:  # the days before today: kept while their rows stay as they are
            key = (params_key(plain), priced.signature())
            got = kept_fetch(session, sql, key, _binds(plain, priced), rows="instance", reads=part)
        for r, *values, covered_usd in got:
            figures = BucketFigures(*values)
            if r in found:
                found[r].add(figures)
            else:
                found[r] = figures
            paid_usd[r] = paid_usd.get(r, 0.0) - covered_usd
    out = {}
    for r, seconds in expected_s.items():
        figures = found.get(r) or BucketFigures()
        figures.offline_h = max(0.0, figures.offline_h + seconds / 3600)
        offline_usd = max(0.0, paid_usd.get(r, 0.0))
        figures.cost += offline_usd
        figures.idle_cost += offline_usd
        out[r] = figures
    return out


def _with_offline(
    found: list[list[BucketFigures | None]],
    spans: Iterable[Span],
    t0: datetime,
    step: timedelta,
    paid: Iterable[PaidSpan] = (),
    covered_paid: Mapping[tuple[int, int], float] | None = None,
) -> list[list[BucketFigures]]:
    """Every bucket's figures (zeros where none were found) with its offline hours: the seconds each GPU was
    expected to report in it less those it covered (`offline_h` holds minus those), floored at 0; and the cost of
    offline time in paid capacity: its GPUs' expected time there at its price (`paid`) less their covered time
    there (`covered_paid`, USD by (row, bucket)), floored at 0, added to cost and idle cost. The cost is spans +
    rows x buckets, never GPUs x buckets (`series_prices.spread`)."""
    n = len(found[0]) if found else 0
    expected = spread(((r, lo, hi, 1.0) for r, lo, hi in spans), t0, step, n)
    paid_usd = spread(paid, t0, step, n)
    covered_paid = covered_paid or {}
    zeros = [0.0] * n
    out = []
    for r, row in enumerate(found):
        seconds = expected.get(r, zeros)
        usd = paid_usd.get(r)
        cells = []
        for k, f in enumerate(row):
            expected_h = seconds[k] / 3600
            if f is None:
                f = BucketFigures(offline_h=expected_h)
            else:
                f.offline_h = max(0.0, f.offline_h + expected_h)
            if usd is not None:
                offline_usd = max(0.0, usd[k] - covered_paid.get((r, k), 0.0))
                f.cost += offline_usd
                f.idle_cost += offline_usd
            cells.append(f)
        out.append(cells)
    return out
