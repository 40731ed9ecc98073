"""Report rows from the waste analysis: the same figures the dashboard shows, one row per group plus totals."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ..analyse.fleet import load_fleet
from ..analyse.states import Thresholds
from ..analyse.waste import Figures, GroupRow, WasteAnalysis, analyse_waste, is_group_name
from ..analyse.window import Filters, Window, WindowError
from ..pricing.resolve import Pricer

CURRENCY = "USD"
DEFAULT_WINDOW = "7d"
FIGURE_COLUMNS = (
    "gpu_hours",
    "avg_util_pct",
    "util_unknown_share",
    "active_h",
    "idle_held_h",
    "idle_h",
    "unknown_h",
    "offline_h",
    "cost",
    "idle_cost",
    "idle_held_cost",
    "unused_cost",
    "currency",
    "price_source",
)


def parse_group_by(values: Sequence[str]) -> list[str]:
    """Group-by names from repeated and/or comma-separated values; WindowError naming `group_by` if unknown."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for name in names:
        if not is_group_name(name):
            raise WindowError(
                "group_by",
                f"unknown grouping {name!r}; use instance, instance_type, region, "
                "availability_zone, lifecycle, gpu, slice, gpu_model or tag:<key>",
            )
    if len(set(names)) != len(names):
        raise WindowError("group_by", "a grouping is named twice")
    return names or ["instance_type"]


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def figures_dict(f: Figures, prices: set[str]) -> dict[str, Any]:
    """One row's figures: hours in GPU-hours, utilization in %, money in USD (priced GPU-hours only)."""
    return {
        "gpu_hours": _round(f.gpu_hours),
        "avg_util_pct": _round(f.avg_util),
        "util_unknown_share": _round(f.unknown_share),
        "active_h": _round(f.active_h),
        "idle_held_h": _round(f.idle_held_h),
        "idle_h": _round(f.idle_h),
        "unknown_h": _round(f.unknown_h),
        "offline_h": _round(f.offline_h),
        "cost": _round(f.cost),
        "idle_cost": _round(f.idle_cost),
        "idle_held_cost": _round(f.idle_held_cost),
        "unused_cost": _round(f.unused_cost),
        "unpriced_gpu_hours": _round(f.unpriced_gpu_hours),
        "currency": CURRENCY,
        "price_source": "; ".join(sorted(prices)),
    }


@dataclass
class Report:
    analysis: WasteAnalysis
    group_by: list[str]
    rows: list[GroupRow]

    @property
    def window(self) -> Window:
        return self.analysis.window

    @property
    def price_sources(self) -> set[str]:
        return {p for r in self.rows for p in r.prices}

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.window.start.isoformat(),
            "end": min(self.window.end, self.window.now).isoformat(),
            "group_by": self.group_by,
            "rows": [
                {"group": {n: label for n, (_k, label) in zip(self.group_by, r.parts, strict=True)}}
                | figures_dict(r.figures, r.prices)
                for r in self.rows
            ],
            "totals": figures_dict(self.analysis.totals, self.price_sources),
        }

    def csv_lines(self) -> Iterator[str]:
        """The report as CSV text, a line at a time: header, one row per group, then a totals row."""
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        columns = ["start", "end", *self.group_by, *FIGURE_COLUMNS]
        out.writerow(columns)
        start = self.window.start.isoformat()
        end = min(self.window.end, self.window.now).isoformat()

        def emit() -> str:
            text = buf.getvalue()
            buf.seek(0)
            buf.truncate()
            return text

        yield emit()
        for r in self.rows:
            values = figures_dict(r.figures, r.prices)
            out.writerow([start, end, *(label for _k, label in r.parts), *(_cell(values[c]) for c in FIGURE_COLUMNS)])
            yield emit()
        totals = figures_dict(self.analysis.totals, self.price_sources)
        out.writerow(
            [start, end, *(["TOTAL"] + [""] * (len(self.group_by) - 1)), *(_cell(totals[c]) for c in FIGURE_COLUMNS)]
        )
        yield emit()


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def build_report(
    session: Session,
    *,
    window: Window,
    filters: Filters,
    group_by: list[str],
    pricer: Pricer,
    thresholds: Thresholds,
    now: datetime,
) -> Report:
    fleet = load_fleet(session, filters=filters, pricer=pricer, thresholds=thresholds, now=now, since=window.start)
    analysis = analyse_waste(session, fleet, window, thresholds)
    return Report(analysis, group_by, analysis.group_by(group_by))
