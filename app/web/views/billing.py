"""The billing page: what the AWS bill says next to what the agents report (app/billing/reconcile.py), the imported
exports and the spot price history read so far. The same view model answers `GET /api/v1/billing` (JSON and CSV)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ...analyse.window import Window
from ...billing.reconcile import (
    HOUR,
    TOLERANCE,
    BillingExport,
    HoursDisagreement,
    SpotRead,
    UnmonitoredInstance,
    billed_until,
    billing_exports,
    reconcile,
    spot_reads,
)
from ...report.service import retained_since
from ...settings import Settings
from .common import WindowView
from .inputs import PageInputs

DEFAULT_WINDOW = "30d"
"""The bill arrives a day or so late and by the month: the page and the endpoint look at 30 days by default."""

CSV_COLUMNS = (
    "start",
    "end",
    "finding",
    "instance_id",
    "name",
    "instance_type",
    "availability_zone",
    "usage_account",
    "purchase",
    "first_hour",
    "last_hour",
    "billed_h",
    "reported_h",
    "difference_h",
    "difference_pct",
    "usd",
)
UNMONITORED = "unmonitored"
HOURS_DIFFER = "hours differ"
# A spreadsheet runs a cell that starts with one of these as a formula; ids and names come from the bill and agents.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class BillingView:
    window: WindowView
    imported: bool
    """Some CUR export has been imported (`gpufleet billing import`, docs/billing.md)."""
    newest_hour: datetime | None
    """Start of the newest billed hour of any export; None before the first import."""
    billed_until: datetime | None
    """End of that hour: the bill covers time up to here."""
    billed_instances: int
    """GPU instances billed in the window, monitored or not."""
    billed_h: float
    """Their instance-hours in the window, h."""
    billed_usd: float
    """Their cost in the window, USD."""
    unmonitored: list[UnmonitoredInstance]
    """Billed GPU instances no agent ever reported, the biggest USD first."""
    unmonitored_h: float
    """Their instance-hours in the window, h."""
    unmonitored_usd: float
    """Their cost in the window, USD."""
    tolerance_pct: float
    """Billed and reported instance-hours disagree when they differ by more than this share of the billed hours, %."""
    compared_since: datetime
    """Billed hours before this are not compared with reported ones: the window's start, or the oldest rollups kept."""
    disagreements: list[HoursDisagreement]
    """Monitored instances whose billed and reported instance-hours disagree, the biggest difference first."""
    exports: list[BillingExport]
    """Every imported export, the newest month first."""
    spot_prices_on: bool
    """GPUFLEET_SPOT_PRICES=on: the server reads the spot price history of the fleet's spot pools."""
    spot_reads: list[SpotRead]
    """The spot pools read so far, by instance type and zone."""


def billing_view(session: Session, window: Window, *, settings: Settings) -> BillingView:
    """The bill over `window` against the agents, the exports and the spot reads."""
    exports = billing_exports(session)
    until = billed_until(exports)
    r = reconcile(
        session,
        start=window.start,
        end=window.end,
        reported_since=retained_since(window.now, settings.rollup_retention_days),
    )
    return BillingView(
        window=WindowView.of(window),
        imported=bool(exports),
        newest_hour=None if until is None else until - HOUR,
        billed_until=until,
        billed_instances=r.billed_instances,
        billed_h=r.billed_h,
        billed_usd=r.billed_usd,
        unmonitored=r.unmonitored,
        unmonitored_h=sum(u.billed_h for u in r.unmonitored),
        unmonitored_usd=sum(u.usd for u in r.unmonitored),
        tolerance_pct=TOLERANCE * 100,
        compared_since=r.compared_since,
        disagreements=r.disagreements,
        exports=exports,
        spot_prices_on=settings.spot_prices == "on",
        spot_reads=spot_reads(session),
    )


def build_billing(p: PageInputs, settings: Settings) -> BillingView:
    return billing_view(p.session, p.query.window, settings=settings)


def _cell(value: Any) -> str:
    """A CSV cell: times ISO 8601, numbers plain decimals (6 places at most), None empty, text that a spreadsheet
    would run as a formula with a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        text = f"{value:.6f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _rows(view: BillingView) -> Iterator[list[Any]]:
    for u in view.unmonitored:
        yield [UNMONITORED, u.instance_id, None, u.instance_type, u.availability_zone, u.usage_account, u.purchase,
               u.first_hour, u.last_hour, u.billed_h, None, None, None, u.usd]  # fmt: skip
    for d in view.disagreements:
        yield [HOURS_DIFFER, d.instance_id, d.name, d.instance_type, None, None, None, d.first_hour, d.last_hour,
               d.billed_h, d.reported_h, d.difference_h, d.difference_pct, d.usd]  # fmt: skip


def csv_text(view: BillingView) -> str:
    """The instances the page lists, as CSV: a header, the unmonitored instances (finding `unmonitored`), then the
    monitored ones whose hours disagree (`hours differ`); each row starts with the window's start and end."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    window = [view.window.start, min(view.window.end, view.window.now.replace(microsecond=0))]
    for row in _rows(view):
        out.writerow([_cell(v) for v in [*window, *row]])
    return buf.getvalue()
