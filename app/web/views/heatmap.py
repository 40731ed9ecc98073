"""The heatmap: one row per instance, GPU or tag value, one column per hour (windows up to 7 days) or day, each
cell coloured by the state that held most of its GPU-hours.

At 2,000 GPUs a row per GPU would be a wall: rows come a page at a time (ROWS_PER_PAGE), the most wasteful first,
and a row per instance or per tag value groups them. Only the page's GPUs are read bucket by bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlencode

from ...analyse.grouping import GroupRow
from ...analyse.states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN, UNPARTITIONED
from ...analyse.timeline import BucketFigures, bucket_step, timeline
from ...analyse.waste import analyse_waste
from ...analyse.window import PRESETS
from ...params import PageQuery
from .common import Choice, FiguresView, FilterView, PagerView, WindowView, paginate
from .inputs import PageInputs

ROWS_PER_PAGE = 50
_STATES = (ACTIVE, IDLE_HELD, IDLE, UNPARTITIONED, UNKNOWN, OFFLINE)
ROW_CHOICES = {"instance": "Instance", "gpu": "GPU"}


@dataclass(frozen=True)
class HeatCell:
    """One row's figures in one bucket, GPU-hours and USD."""

    state: str | None
    """The state with the most GPU-hours; None where the row had no capacity (not yet seen)."""
    active_h: float
    idle_held_h: float
    idle_h: float
    """Idle, unpartitioned MIG capacity included."""
    unknown_h: float
    offline_h: float
    waste_usd: float


@dataclass(frozen=True)
class HeatRow:
    key: str
    label: str
    href: str | None
    """The row's own page (an instance's) or the heatmap filtered to it (a tag value)."""
    figures: FiguresView
    """Over the whole window."""
    cells: list[HeatCell]


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


def _cell(f: BucketFigures) -> HeatCell:
    idle = f.idle_h + f.unpartitioned_h
    # The state with the most GPU-hours; ties go to the first in STATES order (as max() over the state bar).
    hours = (f.active_h, f.idle_held_h, f.idle_h, f.unpartitioned_h, f.unknown_h, f.offline_h)
    top = max(hours)
    state = _STATES[hours.index(top)] if top > 0 else None
    return HeatCell(state, f.active_h, f.idle_held_h, idle, f.unknown_h, f.offline_h, f.idle_cost + f.idle_held_cost)


def _grouping(rows_by: str) -> str:
    return rows_by  # instance, gpu and tag:<key> are groupings of the window analysis too


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


def build_heatmap(p: PageInputs) -> HeatmapView:
    q, t, session = p.query, p.thresholds, p.session
    window = q.window
    fleet = p.fleet()
    analysis = analyse_waste(session, fleet, window, t)
    groups: list[GroupRow] = analysis.group(_grouping(q.rows))
    shown, pager = paginate(groups, q.page, ROWS_PER_PAGE)
    row_of = {gpu_pk: row.key for row in shown for gpu_pk in row.gpus}
    step = bucket_step(window.span)
    tl = timeline(session, fleet, start=window.start, end=window.end, now=p.now, step=step, thresholds=t, row_of=row_of)
    tag_key = q.rows[4:] if q.rows.startswith("tag:") else None
    rows = []
    for row in shown:
        if q.rows == "instance":
            href: str | None = f"/instances/{quote(row.key, safe='')}"
        elif q.rows == "gpu":
            href = f"/instances/{quote(row.sample.instance.instance_id, safe='')}"
        else:
            href = _tag_rows_url(q, f"{tag_key}:{row.key}") if row.key else None
        cells = [_cell(f) for f in tl.rows.get(row.key, [BucketFigures() for _ in tl.starts])]
        rows.append(HeatRow(row.key, row.label, href, FiguresView.of(row.figures), cells))
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
        rows_per_page=ROWS_PER_PAGE,
    )
