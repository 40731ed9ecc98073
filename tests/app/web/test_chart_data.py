"""View data as the charts take it: heatmap tooltips, one line per device and metric."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.analyse.series import DevicePoints
from app.analyse.timeline import BucketFigures
from app.web.chart_data import heat_rows, metric_lines
from app.web.views.common import FilterView, PagerView, WindowView
from app.web.views.heatmap import HeatmapView, HeatRow, HeatSpan, RowFigures, heat_spans
from app.web.views.instance import DeviceSeries

T = datetime(2026, 11, 24, 2, tzinfo=UTC)
FIGURES = RowFigures.of(BucketFigures())


def _view(buckets: int, *spans: HeatSpan) -> HeatmapView:
    return HeatmapView(
        window=WindowView("24h", T, T, T, False, 1.0),
        filters=FilterView([], [], [], []),
        no_agents=False,
        rows_by="instance",
        row_choices=[],
        step_s=3600,
        starts=[T + timedelta(hours=h) for h in range(buckets)],
        rows=[HeatRow("i-a", "a", None, FIGURES, list(spans))],
        pager=PagerView(1, 1, 1, 0, 1),
        rows_per_page=50,
    )


def test_buckets_of_one_state_make_one_span_with_their_figures_summed() -> None:
    idle = BucketFigures(idle_h=0.75, unpartitioned_h=0.25, offline_h=0.1, idle_cost=2.0)
    held = BucketFigures(active_h=0.2, idle_held_h=0.5, idle_held_cost=1.5)
    spans = heat_spans([BucketFigures(), idle, idle, held, BucketFigures(), idle])
    assert [(s.first, s.count, s.state) for s in spans] == [(1, 2, "idle"), (3, 1, "idle-held"), (5, 1, "idle")]
    first = spans[0]
    assert (first.idle_h, first.offline_h, first.waste_usd) == (2.0, 0.2, 4.0)
    # Ties go to the first state of the state bar.
    assert heat_spans([BucketFigures(active_h=1.0, idle_h=1.0)])[0].state == "active"


def test_a_rows_active_share_counts_only_hours_of_known_state() -> None:
    assert RowFigures.summed(10.0, 3.0, 1.0, 2.0, 4.0, 0.0, 0.0, 0.0).active_share == 0.5
    # A row whose utilization NVML never measured: its share is unknown, not 0 %.
    assert RowFigures.summed(10.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0).active_share is None


def test_a_span_always_names_its_state_and_its_hours() -> None:
    tiny = HeatSpan(0, 1, "idle", 0.0, 0.0, 0.01, 0.0, 0.0, 0.05)
    busy = HeatSpan(1, 3, "active", 0.8, 0.3, 0.0, 0.0, 0.01, 0.0)
    [row] = heat_rows(_view(6, tiny, busy))
    titles = [c.title if c else None for c in row.cells]
    assert titles[0] == "Tue 24 Nov 02:00 UTC: idle 0.0 GPU-h, $0.05 wasted"
    assert titles[1:4] == ["Tue 24 Nov 03:00-06:00 UTC (3 h): active 0.8, held 0.3 GPU-h"] * 3
    assert titles[4:] == [None, None]
    overnight = HeatSpan(1, 23, "idle", 0.0, 0.0, 23.0, 0.0, 0.0, 0.0)
    [row] = heat_rows(_view(24, overnight))
    assert row.cells[1] is not None
    assert row.cells[1].title == "Tue 24 Nov 03:00 to Wed 25 Nov 02:00 UTC (23 h): idle 23.0 GPU-h"


def test_slices_have_no_power_line() -> None:
    point = DevicePoints([T], [50.0], [1024.0], [300.0])
    series = [DeviceSeries("gpu-0", "GPU 0", True, point), DeviceSeries("gpu-0-gi1", "GPU 0 3g", False, point)]
    assert [s.name for s in metric_lines(series, "util")] == ["GPU 0", "GPU 0 3g"]
    [power] = metric_lines(series, "power_w")
    assert power.name == "GPU 0" and power.points == [(T, 300.0)]
