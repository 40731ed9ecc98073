"""View data as the charts take it: heatmap tooltips, one line per device and metric."""

from __future__ import annotations

from datetime import UTC, datetime

from app.web.chart_data import heat_rows, metric_lines
from app.web.views.common import FiguresView, FilterView, PagerView, WindowView
from app.web.views.heatmap import HeatCell, HeatmapView, HeatRow
from app.web.views.instance import DeviceSeries, SeriesPoint

T = datetime(2026, 11, 24, 2, tzinfo=UTC)
FIGURES = FiguresView(0, 0, 0, 0, 0, 0, 0, None, None, 0, 0, 0, 0, 0, 0, 0, 0, False)


def _view(*cells: HeatCell) -> HeatmapView:
    return HeatmapView(
        window=WindowView("24h", T, T, T, False, 1.0),
        filters=FilterView([], [], [], []),
        no_agents=False,
        rows_by="instance",
        row_choices=[],
        step_s=3600,
        starts=[T] * len(cells),
        rows=[HeatRow("i-a", "a", None, FIGURES, list(cells))],
        pager=PagerView(1, 1, 1, 0, 1),
        rows_per_page=50,
    )


def test_a_cell_always_names_its_state() -> None:
    tiny = HeatCell("idle", 0.0, 0.0, 0.01, 0.0, 0.0, 0.05)
    busy = HeatCell("active", 0.8, 0.3, 0.0, 0.0, 0.01, 0.0)
    empty = HeatCell(None, 0, 0, 0, 0, 0, 0)
    [row] = heat_rows(_view(tiny, busy, empty))
    titles = [c.title if c else None for c in row.cells]
    assert titles[0] == "Tue 24 Nov 02:00 UTC: idle 0.0 GPU-h, $0.05 wasted"
    assert titles[1] == "Tue 24 Nov 02:00 UTC: active 0.8, held 0.3 GPU-h"
    assert titles[2] is None


def test_slices_have_no_power_line() -> None:
    point = SeriesPoint(T, 50.0, 1024.0, 300.0)
    series = [DeviceSeries("gpu-0", "GPU 0", True, [point]), DeviceSeries("gpu-0-gi1", "GPU 0 3g", False, [point])]
    assert [s.name for s in metric_lines(series, "util")] == ["GPU 0", "GPU 0 3g"]
    [power] = metric_lines(series, "power_w")
    assert power.name == "GPU 0" and power.points == [(T, 300.0)]
