"""The heatmap: one row per instance, GPU or tag value, one column per hour (windows up to 7 days) or day, each
cell coloured by the state that held most of its GPU-hours. A row comes as spans: runs of buckets in one state,
their figures summed (a week of hourly cells is 8,400 cells at 50 rows, and a row's state seldom changes hourly).

At 2,000 GPUs a row per GPU would be a wall: rows come a page at a time, the most wasteful first, and a row per
instance or per tag value groups them. Only the page's GPUs are read bucket by bucket: an instance or a tag value
from the per-instance rollups (one row per instance and hour), a GPU from the device rollups (one row per device
and hour, up to 8 for a GPU in MIG mode), so GPU rows come fewer to a page (GPU_ROWS_PER_PAGE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlencode

from ...analyse.figures import Figures
from ...analyse.fleet import Fleet
from ...analyse.grouping import instance_key
from ...analyse.series_prices import load_pieces
from ...analyse.states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN, UNPARTITIONED
from ...analyse.timeline import BucketFigures, bucket_step, row_totals, timeline
from ...analyse.waste import analyse_waste
from ...analyse.window import PRESETS
from ...billing.prices import PricePiece
from ...params import PageQuery
from .common import Choice, FilterView, PagerView, WindowView, paginate
from .inputs import PageInputs

ROWS_PER_PAGE = 50
GPU_ROWS_PER_PAGE = 25
_STATES = (ACTIVE, IDLE_HELD, IDLE, UNPARTITIONED, UNKNOWN, OFFLINE)
ROW_CHOICES = {"instance": "Instance", "gpu": "GPU"}


@dataclass(frozen=True)
class HeatSpan:
    """Consecutive buckets of one row in the same state, their figures summed: GPU-hours and USD."""

    first: int
    """Index of the span's first bucket in `HeatmapView.starts`."""
    count: int
    """Buckets in the span."""
    state: str
    """The state with the most GPU-hours in each of its buckets."""
    active_h: float
    idle_held_h: float
    idle_h: float
    """Idle, unpartitioned MIG capacity included."""
    unknown_h: float
    offline_h: float
    waste_usd: float


@dataclass(frozen=True)
class RowFigures:
    """A row's figures over the whole window: GPU-equivalent hours and USD."""

    gpu_hours: float
    """Hours with data (every state but offline)."""
    active_h: float
    idle_held_h: float
    idle_h: float
    """Idle, unpartitioned MIG capacity included."""
    unknown_h: float
    offline_h: float
    cost: float
    waste: float
    """Cost while idle or idle-held, USD."""
    active_share: float | None
    """Of the hours whose state is known (not unknown, not offline), 0-1; None without any."""

    @classmethod
    def of(cls, f: BucketFigures | Figures) -> RowFigures:
        idle = f.idle_h + f.unpartitioned_h if isinstance(f, BucketFigures) else f.idle_h
        return cls.summed(f.gpu_hours, f.active_h, f.idle_held_h, idle, f.unknown_h, f.offline_h, f.cost, f.waste)

    @classmethod
    def summed(
        cls,
        gpu_hours: float,
        active_h: float,
        idle_held_h: float,
        idle_h: float,
        unknown_h: float,
        offline_h: float,
        cost: float,
        waste: float,
    ) -> RowFigures:
        known = gpu_hours - unknown_h
        share = active_h / known if known > 1e-9 else None
        return cls(gpu_hours, active_h, idle_held_h, idle_h, unknown_h, offline_h, cost, waste, share)


@dataclass(frozen=True)
class HeatRow:
    key: str
    label: str
    href: str | None
    """The row's own page (an instance's) or the heatmap filtered to it (a tag value)."""
    figures: RowFigures
    spans: list[HeatSpan]
    """In time order; buckets where the row had no capacity (not yet seen) are in none."""


@dataclass(frozen=True)
class HeatmapView:
    window: WindowView
    filters: FilterView
    no_agents: bool
    rows_by: str
    """instance, gpu or tag:<key>."""
    row_choices: list[Choice]
    step_s: int
    """Column length, s: 3600 (windows up to 7 days) or 86400."""
    starts: list[datetime]
    rows: list[HeatRow]
    pager: PagerView
    rows_per_page: int


def heat_spans(cells: Sequence[BucketFigures]) -> list[HeatSpan]:
    """A row's buckets as runs of one state. A bucket's state is the one with the most GPU-hours, ties going to
    the first in state-bar order (as max() over the state bar); a bucket with no hours has none and ends a run.

    This runs for every bucket of every row on the page (8,400 at 50 rows x 7 days), so it sums plain floats."""
    out: list[HeatSpan] = []
    state: str | None = None
    first = 0
    a = h = i = u = o = w = 0.0

    def close(end: int) -> None:
        if state is not None:
            out.append(HeatSpan(first, end - first, state, a, h, i, u, o, w))

    for k, f in enumerate(cells):
        hours = (f.active_h, f.idle_held_h, f.idle_h, f.unpartitioned_h, f.unknown_h, f.offline_h)
        top = max(hours)
        now = _STATES[hours.index(top)] if top > 0 else None
        if now != state:
            close(k)
            state, first = now, k
            a = h = i = u = o = w = 0.0
        a += f.active_h
        h += f.idle_held_h
        i += f.idle_h + f.unpartitioned_h
        u += f.unknown_h
        o += f.offline_h
        w += f.idle_cost + f.idle_held_cost
    close(len(cells))
    return out


def _tag_rows_url(q: PageQuery, tag: str) -> str:
    """The heatmap of one tag value's GPUs, in the same window and filters."""
    w = q.window
    params = [("rows", "gpu")]
    if w.label in PRESETS:
        params.append(("window", w.label))
    else:
        params += [("start", w.start.isoformat()), ("end", w.end.isoformat())]
    f = q.filters
    params += [("region", v) for v in f.regions] + [("instance_type", v) for v in f.instance_types]
    params += [("lifecycle", v) for v in f.lifecycles] + [("tag", f"{k}:{v}") for k, v in f.tags]
    params.append(("tag", tag))
    return f"/heatmap?{urlencode(params)}"


@dataclass(frozen=True)
class _Ranked:
    key: str
    label: str
    figures: RowFigures
    href: str | None
    gpus: list[int]


def _rank(rows: list[_Ranked]) -> list[_Ranked]:
    """Most wasteful first, as the window analysis orders its groups."""
    return sorted(rows, key=lambda r: (-r.figures.waste, -r.figures.cost, r.label))


def _gpu_rows(p: PageInputs, fleet: Fleet) -> list[_Ranked]:
    """A row per GPU, its figures from the window analysis: the GPU's own unit, or its slices and free capacity.

    Summed here rather than by the analysis's GPU grouping, which also keeps each row's units and price sources:
    only the eight figures of a heatmap row are needed, for 2,000 GPUs on every view."""
    analysis = analyse_waste(p.session, fleet, p.query.window, p.thresholds)
    sums: dict[int, list[float]] = {}
    for unit in analysis.units:
        f = unit.figures()
        acc = sums.get(unit.gpu.pk)
        if acc is None:
            acc = sums[unit.gpu.pk] = [0.0] * 8
        acc[0] += f.gpu_hours
        acc[1] += f.active_h
        acc[2] += f.idle_held_h
        acc[3] += f.idle_h
        acc[4] += f.unknown_h
        acc[5] += f.offline_h
        acc[6] += f.cost
        acc[7] += f.waste
    out = []
    for pk, (hours, active, held, idle, unknown, offline, cost, waste) in sums.items():
        gpu = fleet.gpus[pk]
        figures = RowFigures.summed(hours, active, held, idle, unknown, offline, cost, waste)
        href = f"/instances/{quote(gpu.instance.instance_id, safe='')}"
        out.append(_Ranked(str(pk), gpu.label, figures, href, [pk]))
    return out


def _instance_rows(p: PageInputs, fleet: Fleet, pieces: Mapping[int, list[PricePiece]]) -> list[_Ranked]:
    """A row per instance or tag value, its figures from the per-instance rollups (as its cells), each hour at its
    price (`pieces`, by instance pk): no window analysis device by device."""
    q = p.query
    key_of = instance_key(q.rows)
    assert key_of is not None
    index: dict[str, int] = {}
    labels: list[str] = []
    row_of_instance: dict[int, int] = {}
    for inst in fleet.instances.values():
        key, label = key_of(inst)
        if key not in index:
            index[key] = len(labels)
            labels.append(label)
        row_of_instance[inst.pk] = index[key]
    totals = row_totals(p.session, fleet, q.window, thresholds=p.thresholds, rows=row_of_instance, pieces=pieces)
    keys = list(index)
    gpus: dict[int, list[int]] = {}
    for gpu in fleet.gpus.values():
        gpus.setdefault(row_of_instance[gpu.instance.pk], []).append(gpu.pk)
    tag_key = q.rows[4:] if q.rows.startswith("tag:") else None
    out = []
    for r, figures in totals.items():
        key = keys[r]
        if tag_key is None:
            href: str | None = f"/instances/{quote(key, safe='')}"
        else:
            href = _tag_rows_url(q, f"{tag_key}:{key}") if key else None
        out.append(_Ranked(key, labels[r], RowFigures.of(figures), href, gpus.get(r, [])))
    return out


def build_heatmap(p: PageInputs) -> HeatmapView:
    q, window = p.query, p.query.window
    fleet = p.fleet()
    # Rows of instances or tag values: their totals and cells at each hour's price, the pieces read once. A page of
    # GPU rows reads the pieces of its own instances only.
    pieces = None if q.rows == "gpu" else load_pieces(p.session, fleet, window.start, window.end)
    ranked = _rank(_gpu_rows(p, fleet) if pieces is None else _instance_rows(p, fleet, pieces))
    per_page = GPU_ROWS_PER_PAGE if q.rows == "gpu" else ROWS_PER_PAGE
    shown, pager = paginate(ranked, q.page, per_page)
    row_of = {gpu_pk: row.key for row in shown for gpu_pk in row.gpus}
    step = bucket_step(window.span)
    tl = timeline(
        p.session, fleet, start=window.start, end=window.end, now=p.now, step=step, thresholds=p.thresholds,
        row_of=row_of, pieces=pieces,
    )  # fmt: skip
    rows = [
        HeatRow(row.key, row.label, row.href, row.figures, heat_spans(tl.rows[row.key]) if row.key in tl.rows else [])
        for row in shown
    ]
    choices = [Choice(v, label) for v, label in ROW_CHOICES.items()]
    choices += [Choice(f"tag:{k}", f"Tag {k}") for k in sorted({tag.split(":", 1)[0] for tag in fleet.options.tags})]
    return HeatmapView(
        window=WindowView.of(window),
        filters=FilterView.of(q.filters),
        no_agents=fleet.total_instances == 0,
        rows_by=q.rows,
        row_choices=choices,
        step_s=int(step.total_seconds()),
        starts=tl.starts,
        rows=rows,
        pager=pager,
        rows_per_page=per_page,
    )
