"""View-model data as the charts take it (app/web/charts/): template filters, so that a page's JSON holds only
figures and its HTML draws them. Tooltips are worded here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ..analyse.states import ACTIVE, IDLE, IDLE_HELD, OFFLINE, UNKNOWN, UNPARTITIONED
from .charts import HeatCell, HeatRow, Series, StripRow, series_class
from .views.heatmap import HeatmapView
from .views.instance import DeviceSeries, DeviceStrip

METRIC_UNITS = {"util": "%", "mem_used_mib": "MiB", "power_w": "W"}


def metric_lines(series: Sequence[DeviceSeries], metric: str) -> list[Series]:
    """One line per device for `metric` (util, mem_used_mib or power_w); slices have no power line."""
    devices = [s for s in series if metric != "power_w" or s.is_gpu]
    return [
        Series(s.label, [(p.ts, getattr(p, metric)) for p in s.points], series_class(i)) for i, s in enumerate(devices)
    ]


def strip_rows(strips: Sequence[DeviceStrip]) -> list[StripRow]:
    return [StripRow(s.label, [(span.start, span.end, span.state) for span in s.spans]) for s in strips]


def _when(start: datetime, step_s: int) -> str:
    # Short: a heatmap page has thousands of cells and the tooltips are most of its bytes.
    return f"{start:%a %d %b}" if step_s >= 86400 else f"{start:%a %d %b %H:%M}"


def heat_rows(view: HeatmapView) -> list[HeatRow]:
    """The heatmap's rows with a tooltip per cell: time, state, the GPU-hours of each state present, waste."""
    rows = []
    for row in view.rows:
        cells: list[HeatCell | None] = []
        for start, c in zip(view.starts, row.cells, strict=True):
            if c.state is None:
                cells.append(None)
                continue
            # Every state with a tenth of a GPU-hour or more, and the cell's own state however small.
            parts = [
                f"{name} {hours:.1f}"
                for name, key, hours in (
                    ("active", ACTIVE, c.active_h),
                    ("held", IDLE_HELD, c.idle_held_h),
                    ("idle", IDLE, c.idle_h),
                    ("unknown", UNKNOWN, c.unknown_h),
                    ("offline", OFFLINE, c.offline_h),
                )
                if hours >= 0.05 or key == c.state or (key == IDLE and c.state == UNPARTITIONED)
            ]
            text = f"{_when(start, view.step_s)} UTC: {', '.join(parts)} GPU-h"
            if c.waste_usd >= 0.005:
                text += f", ${c.waste_usd:,.2f} wasted"
            cells.append(HeatCell(c.state, text))
        rows.append(HeatRow(row.label, row.href, cells))
    return rows
