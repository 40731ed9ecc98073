"""Report rows from the waste analysis: the same figures the dashboard shows, one row per group plus totals."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from ..analyse.figures import Figures, Unit
from ..analyse.fleet import DeviceRowsCache, load_fleet
from ..analyse.grouping import GroupRow, by_holder
from ..analyse.states import UNPARTITIONED, Thresholds
from ..analyse.waste import WasteAnalysis, analyse_waste
from ..analyse.window import Filters, Window, floor_day
from ..params import BadParameter
from ..pricing.resolve import Pricer

CURRENCY = "USD"
DEFAULT_WINDOW = "7d"
CSV_CHUNK_CHARS = 64 * 1024
"""The CSV goes out in pieces of about this many characters: small enough to stream, large enough that a
report of thousands of rows is not thousands of tiny writes."""
# A spreadsheet runs a cell that starts with one of these as a formula; labels come from instance tags.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
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
    "price_source_shares",
)


def retained_since(now: datetime, rollup_retention_days: int) -> datetime:
    """The oldest time the hourly and daily rollups still hold in full: the UTC midnight of the day the
    retention horizon falls in (the upkeep pass deletes a day only once all of it is past the horizon)."""
    try:
        return floor_day(now - timedelta(days=rollup_retention_days))
    except OverflowError:  # a retention longer than the calendar: everything is kept
        return datetime.min.replace(tzinfo=UTC)


def check_retention(window: Window, *, rollup_retention_days: int, param: str = "start") -> None:
    """BadParameter naming `param` when the window starts before the rollups the report reads are kept."""
    oldest = retained_since(window.now, rollup_retention_days)
    if window.start < oldest:
        raise BadParameter(
            param,
            f"starts at {window.start.isoformat()}, before the oldest data kept: the rollups go back to "
            f"{oldest.isoformat()} (GPUFLEET_ROLLUP_RETENTION_DAYS={rollup_retention_days})",
        )


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def figures_dict(f: Figures, prices: set[str], shares: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One row's figures: hours in GPU-hours, utilization in %, money in USD (priced GPU-hours only). A row of
    nothing but MIG capacity of unknown size (a slice the agent could not size, or the free capacity of a GPU
    whose layout it could not read) has null GPU-hours and money: unknown, not 0."""
    unknown = f.only_unknown

    def sized(value: float) -> float | None:
        return None if unknown else _round(value)

    return {
        "gpu_hours": sized(f.gpu_hours),
        "avg_util_pct": _round(f.avg_util),
        "util_unknown_share": _round(f.unknown_share),
        "active_h": sized(f.active_h),
        "idle_held_h": sized(f.idle_held_h),
        "idle_h": sized(f.idle_h),
        "unknown_h": sized(f.unknown_h),
        "offline_h": _round(f.offline_h),
        "cost": sized(f.cost),
        "idle_cost": sized(f.idle_cost),
        "idle_held_cost": sized(f.idle_held_cost),
        "unused_cost": sized(f.unused_cost),
        "unpriced_gpu_hours": sized(f.unpriced_gpu_hours),
        "unsized_slice_hours": _round(f.unsized_slice_h),
        "free_unknown_hours": _round(f.free_unknown_h),
        "currency": CURRENCY,
        "price_source": "; ".join(sorted(prices)),
        "price_source_shares": "; ".join(f"{k} {v:.0%}" for k, v in (shares or {}).items()),
        "price_sources": {k: round(v, 4) for k, v in (shares or {}).items()},
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
    def end(self) -> datetime:
        """End of the window, or now (to the second) when the window reaches the present."""
        return min(self.window.end, self.window.now.replace(microsecond=0))

    @property
    def price_sources(self) -> set[str]:
        return {p for r in self.rows for p in r.prices}

    @property
    def source_shares(self) -> dict[str, float]:
        """Each price source's share of the whole fleet's priced dollars, 0-1."""
        return self.analysis.source_shares

    def group_values(self, row: GroupRow) -> list[str]:
        """The row's value for each grouping, in the order asked for."""
        unit = row.sample
        return [_identity(n, unit, label) for n, (_k, label) in zip(self.group_by, row.parts, strict=True)]

    def as_json(self) -> dict[str, Any]:
        return {
            "start": self.window.start.isoformat(),
            "end": self.end.isoformat(),
            "group_by": self.group_by,
            "billed_until": None if self.analysis.billed_until is None else self.analysis.billed_until.isoformat(),
            "rows": [
                {"group": dict(zip(self.group_by, self.group_values(r), strict=True))}
                | figures_dict(r.figures, r.prices, r.source_shares)
                for r in self.rows
            ],
            "totals": figures_dict(self.analysis.totals, self.price_sources, self.source_shares),
        }

    def csv_chunks(self, chunk_chars: int = CSV_CHUNK_CHARS) -> Iterator[str]:
        """The report as CSV text, produced as it is written: a header, one row per group, then a totals row
        whose first group column is TOTAL. Pieces of about `chunk_chars` characters, each ending a line."""
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(["start", "end", *self.group_by, *FIGURE_COLUMNS])
        start = self.window.start.isoformat()
        end = self.end.isoformat()
        for r in self.rows:
            values = figures_dict(r.figures, r.prices, r.source_shares)
            labels = (_text_cell(v) for v in self.group_values(r))
            out.writerow([start, end, *labels, *(_cell(values[c]) for c in FIGURE_COLUMNS)])
            if buf.tell() >= chunk_chars:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        totals = figures_dict(self.analysis.totals, self.price_sources, self.source_shares)
        blanks = [""] * (len(self.group_by) - 1)
        out.writerow([start, end, "TOTAL", *blanks, *(_cell(totals[c]) for c in FIGURE_COLUMNS)])
        yield buf.getvalue()


def _identity(grouping: str, unit: Unit, label: str) -> str:
    """A row's value for one grouping. Instances, GPUs and slices go by the EC2 instance id, which is unique
    and what AWS bills by; the dashboard shows names, which two instances may share. Others: the label."""
    if grouping not in ("instance", "gpu", "slice"):
        return label
    instance_id = unit.instance.instance_id
    if grouping == "instance":
        return instance_id
    gpu = f"{instance_id} GPU {unit.gpu.gpu_index}"
    if grouping == "gpu":
        return gpu
    if unit.slice is not None:
        return f"{gpu} {unit.slice.profile} (GI {unit.slice.gpu_instance_id})"
    return f"{gpu} {UNPARTITIONED}" if unit.kind == UNPARTITIONED else gpu


def _cell(value: Any) -> str:
    """A CSV cell: numbers in plain decimal notation (no exponent, no thousands separator), None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.6f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text
    return _text_cell(str(value))


def _text_cell(value: str) -> str:
    """Text that a spreadsheet would take for a formula gets a leading apostrophe, which shows it as text."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def build_report(
    session: Session,
    *,
    window: Window,
    filters: Filters,
    group_by: list[str],
    pricer: Pricer,
    thresholds: Thresholds,
    now: datetime,
    cache: DeviceRowsCache | None = None,
) -> Report:
    fleet = load_fleet(
        session, filters=filters, pricer=pricer, thresholds=thresholds, now=now, since=window.start, cache=cache
    )
    analysis = analyse_waste(session, fleet, window, thresholds, by_holder=by_holder(group_by), holder_groups=group_by)
    return Report(analysis, group_by, analysis.group_by(group_by))
