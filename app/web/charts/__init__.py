"""Server-rendered SVG charts: time series, state bars, strips and heatmaps, column charts, MIG layouts.

Every function takes plain data and returns `Markup` ready to drop into a template: all text in it is
escaped, nothing needs JavaScript, there is no inline style or script (the Content-Security-Policy forbids
both), and hover text comes from SVG `<title>` elements. Sizes are viewBox units; charts scale to their
container. Colours come from `static/app.css` (the classes `state-<state>` and `series-<n>`, which set the
CSS `color` that shapes paint with) and `static/charts.css` (hatch patterns, heat shades, columns).
"""

from __future__ import annotations

from .heatmap import DAYS, HEAT_LEVELS, HeatCell, HeatRow, hour_of_week_svg, state_heatmap_svg
from .lines import Series, device_lines_svg, series_class, timeseries_svg
from .mig import MigSlot, mig_layout_svg
from .stacked import bars_svg, stacked_states_svg
from .states import (
    ACTIVE,
    IDLE,
    IDLE_HELD,
    OFFLINE,
    STATE_HELP,
    STATE_LABELS,
    STATES,
    UNKNOWN,
    UNPARTITIONED,
    state_bar_svg,
    state_class,
    state_label,
)
from .strip import StripRow, state_strip_svg

__all__ = [
    "ACTIVE",
    "DAYS",
    "HEAT_LEVELS",
    "IDLE",
    "IDLE_HELD",
    "OFFLINE",
    "STATES",
    "STATE_HELP",
    "STATE_LABELS",
    "UNKNOWN",
    "UNPARTITIONED",
    "HeatCell",
    "HeatRow",
    "MigSlot",
    "Series",
    "StripRow",
    "bars_svg",
    "device_lines_svg",
    "hour_of_week_svg",
    "mig_layout_svg",
    "series_class",
    "stacked_states_svg",
    "state_bar_svg",
    "state_class",
    "state_heatmap_svg",
    "state_label",
    "state_strip_svg",
    "timeseries_svg",
]
