"""View-model data as the charts take it (app/web/charts/): template filters, so that a page's JSON holds only
figures and its HTML draws them. Tooltips are worded here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from ..analyse.states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN, UNPARTITIONED
from .charts import HeatCell, HeatRow, Series, StripRow, series_class
from .views.heatmap import HeatmapView, HeatSpan
from .views.instance import DeviceSeries, DeviceStrip

METRIC_UNITS = {"util": "%", "mem_used_mib": "MiB", "power_w": "W"}


def metric_lines(series: Sequence[DeviceSeries], metric: str) -> list[Series]:
    """One line per device for `metric` (util, mem_used_mib or power_w); slices have no power line."""
    devices = [s for s in series if metric != "power_w" or s.is_gpu]
    return [
        Series(s.label, list(zip(s.points.ts, getattr(s.points, metric), strict=True)), series_class(i))
        for i, s in enumerate(devices)
    ]


def strip_rows(strips: Sequence[DeviceStrip]) -> list[StripRow]:
    return [StripRow(s.label, [(span.start, span.end, span.state) for span in s.spans]) for s in strips]


def _when(start: datetime, step_s: int) -> str:
    # Short: a heatmap page has hundreds of spans and the tooltips are most of its bytes.
    return f"{start:%a %d %b}" if step_s >= 86400 else f"{start:%a %d %b %H:%M}"


def _span_text(view: HeatmapView, span: HeatSpan) -> str:
    """When (the span's bucket, or its first and last), the GPU-hours of each state present, the waste."""
    step_s = view.step_s
    first = view.starts[span.first]
    if span.count == 1:
        when = f"{_when(first, step_s)} UTC"
    elif step_s >= 86400:
        last = view.starts[span.first + span.count - 1]
        when = f"{_when(first, step_s)} to {_when(last, step_s)} UTC ({span.count} days)"
    else:
        end = first + timedelta(seconds=span.count * step_s)
        until = f"-{end:%H:%M}" if end.date() == first.date() else f" to {_when(end, step_s)}"
        when = f"{_when(first, step_s)}{until} UTC ({span.count * step_s // 3600} h)"
    # Every state with a tenth of a GPU-hour or more, and the span's own state however small.
    parts = [
        f"{name} {hours:.1f}"
        for name, key, hours in (
            ("active", ACTIVE, span.active_h),
            ("held", IDLE_HELD, span.idle_held_h),
            ("idle", IDLE, span.idle_h),
            ("unknown", UNKNOWN, span.unknown_h),
            ("offline", OFFLINE, span.offline_h),
        )
        if hours >= 0.05 or key == span.state or (key == IDLE and span.state == UNPARTITIONED)
    ]
    text = f"{when}: {', '.join(parts)} GPU-h"
    if span.waste_usd >= 0.005:
        text += f", ${span.waste_usd:,.2f} wasted"
    return text


def heat_rows(view: HeatmapView) -> list[HeatRow]:
    """The heatmap's rows, bucket by bucket, each span's buckets sharing one cell and its tooltip (the chart draws
    them as one)."""
    rows = []
    for row in view.rows:
        cells: list[HeatCell | None] = [None] * len(view.starts)
        for span in row.spans:
            cells[span.first : span.first + span.count] = [HeatCell(span.state, _span_text(view, span))] * span.count
        rows.append(HeatRow(row.label, row.href, cells))
    return rows
