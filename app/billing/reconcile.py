"""The bill against the agents (docs/dashboard.md, "Billing"): GPU instances the bill charges for that no agent
reports, monitored instances whose billed and reported instance-hours disagree, the imported exports and the spot
price history read so far. Queries only, on the caller's session; the answers are plain dataclasses.

Reported instance-hours come from the per-instance rollups (app/store/instance_rollups.py): `gpu_s` is the seconds
of every GPU's own data in the hour, so `gpu_s / (GPUs of the instance x 3600)` is the share of the hour the agent
reported, at most 1 (a whole UTC day is read from the daily rollups, at most 24 hours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..analyse.window import ceil_day, floor_day
from .tables import PURCHASES

HOUR = timedelta(hours=1)
TOLERANCE = 0.10
"""Billed and reported instance-hours disagree when they differ by more than this share of the billed hours."""


@dataclass(frozen=True)
class UnmonitoredInstance:
    """A GPU instance the bill charges for in the window that no agent has ever reported."""

    instance_id: str
    instance_type: str
    """As billed in its newest hour in the window."""
    availability_zone: str | None
    usage_account: str | None
    """The AWS account that ran it (line_item_usage_account_id)."""
    purchase: str
    """How most of its instance-hours were bought: on-demand, spot, savings plan, ..."""
    billed_h: float
    """Instance-hours billed in the window, h."""
    usd: float
    """What they cost, USD."""
    first_hour: datetime
    """Start of its first billed hour in the window."""
    last_hour: datetime
    """Start of its newest billed hour in the window."""


@dataclass(frozen=True)
class HoursDisagreement:
    """A monitored instance whose billed and reported instance-hours differ by more than TOLERANCE, over the hours
    both could cover: from its first to its newest billed hour in the window."""

    instance_id: str
    name: str
    """The instance's Name tag, else its host name, else its id (as the agent reported them)."""
    instance_type: str
    """As billed in its newest hour in the window."""
    first_hour: datetime
    """Start of the first billed hour compared."""
    last_hour: datetime
    """Start of the newest billed hour compared: the hours compared are [first_hour, last_hour + 1 h)."""
    billed_h: float
    """Instance-hours billed over those hours, h."""
    reported_h: float
    """Instance-hours its agent reported data for over those hours, h."""
    difference_h: float
    """reported_h - billed_h: negative when the bill charges hours the agent did not report, h."""
    difference_pct: float | None
    """difference_h as a share of billed_h, %; None when nothing was billed."""
    usd: float
    """What the billed hours cost, USD."""


@dataclass(frozen=True)
class Reconciliation:
    """The bill over a window, against what the agents reported."""

    billed_instances: int
    """GPU instances billed in the window, monitored or not."""
    billed_h: float
    """Their instance-hours, h."""
    billed_usd: float
    """Their cost, USD."""
    unmonitored: list[UnmonitoredInstance]
    """Biggest USD first."""
    disagreements: list[HoursDisagreement]
    """Biggest difference in hours first."""
    compared_since: datetime
    """Hours before this are not compared: the rollups no longer hold them (or the window starts here)."""


@dataclass(frozen=True)
class BillingExport:
    """One imported CUR export: a payer account's month."""

    payer_account: str
    billing_period: date
    """First day of the billed month."""
    instance_hours: float
    """GPU instance-hours the export bills, h."""
    usd: float
    """Their effective cost, USD."""
    newest_hour: datetime | None
    """Start of the newest billed hour in the export; None when it bills none."""
    imported_at: datetime


@dataclass(frozen=True)
class SpotRead:
    """How far the spot price history of one pool (instance type, zone) has been read."""

    instance_type: str
    availability_zone: str
    read_until: datetime | None
    """The history is complete up to here; None before the first good read."""
    read_at: datetime | None
    """When it was last read."""
    failures: int
    """Failed reads in a row."""
    next_try: datetime | None
    """No read before this (back-off after failures)."""
    last_error: str | None
    """Why the last read failed, one line (from AWS or the network)."""


# One pass over the window's billed hours, grouped by instance and purchase, then each instance's newest billed hour
# (by the primary key) for its type, zone and account, and the agents' instance of the same id. The `c_` figures
# cover the hours compared; :since is after :start only when the rollups no longer hold the window's first hours.
_BILLED_SQL = """
WITH g AS (
    SELECT instance_id, purchase, min(hour) AS first_hour, max(hour) AS last_hour,
           sum(usage_h) AS usage_h, sum(usd) AS usd, {compared}
    FROM billed_hours WHERE hour >= :start AND hour < :end
    GROUP BY instance_id, purchase
), n AS (SELECT instance_id, max(last_hour) AS newest FROM g GROUP BY instance_id)
SELECT g.*, b.instance_type, b.availability_zone, b.usage_account,
       i.id AS pk, coalesce(i.tags ->> 'Name', i.hostname, i.instance_id) AS name
FROM g
JOIN n ON n.instance_id = g.instance_id
JOIN billed_hours b ON b.instance_id = n.instance_id AND b.hour = n.newest
LEFT JOIN instances i ON i.instance_id = g.instance_id
"""
_ALL_COMPARED = "min(hour) AS c_first, max(hour) AS c_last, sum(usage_h) AS c_usage_h, sum(usd) AS c_usd"
_SOME_COMPARED = (
    "min(hour) FILTER (WHERE hour >= :since) AS c_first, max(hour) FILTER (WHERE hour >= :since) AS c_last, "
    "coalesce(sum(usage_h) FILTER (WHERE hour >= :since), 0) AS c_usage_h, "
    "coalesce(sum(usd) FILTER (WHERE hour >= :since), 0) AS c_usd"
)

# Per compared instance: its GPUs, then the instance-hours its agent reported: whole UTC days [dlo, dhi) from the
# daily rollups (one day counts at most 24 hours), the hours around them from the hourly ones (each at most 1), read
# through the index on (instance_pk, hour). A month of a 300-instance fleet is about 9,000 daily rows and at most
# 46 hourly rows per instance.
_REPORTED_SQL = text(
    """
    WITH s AS (
        SELECT s.*, g.n FROM unnest(CAST(:pk AS int8[]), CAST(:lo AS timestamptz[]), CAST(:hi AS timestamptz[]),
                                    CAST(:dlo AS timestamptz[]), CAST(:dhi AS timestamptz[])) AS s(pk, lo, hi, dlo, dhi)
        CROSS JOIN LATERAL (SELECT count(*) AS n FROM gpus WHERE gpus.instance_pk = s.pk) g
    ), days AS (
        SELECT d.instance_pk, sum(least(d.gpu_s / (s.n * 3600.0), 24.0)) AS h
        FROM instance_rollups_daily d JOIN s ON s.pk = d.instance_pk AND d.day >= s.dlo AND d.day < s.dhi
        WHERE d.day >= :dmin AND d.day < :dmax AND s.n > 0
        GROUP BY d.instance_pk
    )
    SELECT s.pk, coalesce(days.h, 0) + coalesce((
        SELECT sum(least(r.gpu_s / (s.n * 3600.0), 1.0)) FROM instance_rollups_hourly r
        WHERE r.instance_pk = s.pk AND s.n > 0
          AND ((r.hour >= s.lo AND r.hour < s.dlo) OR (r.hour >= s.dhi AND r.hour < s.hi))
    ), 0) AS reported_h
    FROM s LEFT JOIN days ON days.instance_pk = s.pk
    """
)


@dataclass
class _Billed:
    """One instance's billed hours in the window, its purchase groups summed; its type, zone and account are those
    of its newest billed hour. The `c_` figures are those of the hours compared."""

    instance_id: str
    pk: int | None
    name: str
    instance_type: str
    availability_zone: str | None
    usage_account: str | None
    usage_h: float = 0.0
    usd: float = 0.0
    first_hour: datetime | None = None
    last_hour: datetime | None = None
    by_purchase: dict[str, float] = field(default_factory=dict)
    c_usage_h: float = 0.0
    c_usd: float = 0.0
    c_first: datetime | None = None
    c_last: datetime | None = None

    def add(self, row: Any) -> None:
        """Add one purchase group of the instance."""
        self.usage_h += row.usage_h
        self.usd += row.usd
        self.first_hour = row.first_hour if self.first_hour is None else min(self.first_hour, row.first_hour)
        self.last_hour = row.last_hour if self.last_hour is None else max(self.last_hour, row.last_hour)
        self.by_purchase[row.purchase] = row.usage_h
        self.c_usage_h += row.c_usage_h
        self.c_usd += row.c_usd
        if row.c_first is not None:
            self.c_first = row.c_first if self.c_first is None else min(self.c_first, row.c_first)
            self.c_last = row.c_last if self.c_last is None else max(self.c_last, row.c_last)

    @property
    def purchase(self) -> str:
        """The purchase with the most instance-hours; on a tie, the first in PURCHASES."""
        hours = self.by_purchase
        return min(hours, key=lambda p: (-hours[p], PURCHASES.index(p) if p in PURCHASES else len(PURCHASES), p))


def _billed(session: Session, start: datetime, end: datetime, since: datetime) -> list[_Billed]:
    compared = _ALL_COMPARED if since <= start else _SOME_COMPARED
    sql = text(_BILLED_SQL.format(compared=compared))
    out: dict[str, _Billed] = {}
    for row in session.execute(sql, {"start": start, "end": end, "since": since}):
        b = out.get(row.instance_id)
        if b is None:
            b = out[row.instance_id] = _Billed(
                row.instance_id, row.pk, row.name, row.instance_type, row.availability_zone, row.usage_account
            )
        b.add(row)
    return list(out.values())


def _unmonitored(b: _Billed) -> UnmonitoredInstance:
    assert b.first_hour is not None and b.last_hour is not None
    return UnmonitoredInstance(
        b.instance_id,
        b.instance_type,
        b.availability_zone,
        b.usage_account,
        b.purchase,
        b.usage_h,
        b.usd,
        b.first_hour,
        b.last_hour,
    )


def _whole_days(lo: datetime, hi: datetime) -> tuple[datetime, datetime]:
    """The whole UTC days inside [lo, hi) as [dlo, dhi); an empty range at `hi` when there are none."""
    dlo, dhi = ceil_day(lo), floor_day(hi)
    return (dlo, dhi) if dlo < dhi else (hi, hi)


def _reported(session: Session, spans: dict[int, tuple[datetime, datetime]]) -> dict[int, float]:
    """Instance pk -> instance-hours its agent reported over its span [lo, hi), h (0 for an instance without GPUs)."""
    if not spans:
        return {}
    pks = list(spans)
    days = [_whole_days(*spans[p]) for p in pks]
    params = {
        "pk": pks,
        "lo": [spans[p][0] for p in pks],
        "hi": [spans[p][1] for p in pks],
        "dlo": [d[0] for d in days],
        "dhi": [d[1] for d in days],
        "dmin": min(d[0] for d in days),
        "dmax": max(d[1] for d in days),
    }
    return {row.pk: float(row.reported_h) for row in session.execute(_REPORTED_SQL, params)}


def _disagreement(b: _Billed, reported_h: float, tolerance: float) -> HoursDisagreement | None:
    assert b.c_first is not None and b.c_last is not None
    diff = reported_h - b.c_usage_h
    if abs(diff) <= tolerance * b.c_usage_h:
        return None
    pct = diff / b.c_usage_h * 100 if b.c_usage_h > 0 else None
    return HoursDisagreement(
        b.instance_id, b.name, b.instance_type, b.c_first, b.c_last, b.c_usage_h, reported_h, diff, pct, b.c_usd
    )


def reconcile(
    session: Session, *, start: datetime, end: datetime, reported_since: datetime, tolerance: float = TOLERANCE
) -> Reconciliation:
    """The bill over [start, end) against the agents: two queries, each over indexed ranges (the billed hours of the
    window, then each compared instance's daily and hourly rollups). Hours before `reported_since` (the oldest
    rollups kept) count towards the unmonitored spend but are not compared."""
    since = max(start, reported_since)
    billed = _billed(session, start, end, since)
    monitored = [b for b in billed if b.pk is not None and b.c_first is not None]
    spans = {b.pk: (b.c_first, b.c_last + HOUR) for b in monitored if b.pk is not None and b.c_first and b.c_last}
    reported = _reported(session, spans)
    disagreements = [
        d
        for b in monitored
        if b.pk is not None and (d := _disagreement(b, reported.get(b.pk, 0.0), tolerance)) is not None
    ]
    unmonitored = [_unmonitored(b) for b in billed if b.pk is None]
    # Ranked to the cent and the hundredth of an hour: sums that differ only in their last bits tie, then go by id.
    return Reconciliation(
        billed_instances=len(billed),
        billed_h=sum(b.usage_h for b in billed),
        billed_usd=sum(b.usd for b in billed),
        unmonitored=sorted(unmonitored, key=lambda u: (-round(u.usd, 2), u.instance_id)),
        disagreements=sorted(disagreements, key=lambda d: (-round(abs(d.difference_h), 2), d.instance_id)),
        compared_since=since,
    )


def billing_exports(session: Session) -> list[BillingExport]:
    """Every imported export, the newest month first."""
    rows = session.execute(
        text(
            "SELECT payer_account, billing_period, instance_hours, usd, newest_hour, imported_at FROM billing_exports "
            "ORDER BY billing_period DESC, payer_account"
        )
    ).all()
    return [BillingExport(*row) for row in rows]


def spot_reads(session: Session) -> list[SpotRead]:
    """How far each spot pool's price history has been read, by instance type and zone."""
    rows = session.execute(
        text(
            "SELECT instance_type, availability_zone, read_until, read_at, failures, next_try, last_error "
            "FROM spot_price_reads ORDER BY instance_type, availability_zone"
        )
    ).all()
    return [SpotRead(*row) for row in rows]


def billed_until(exports: list[BillingExport]) -> datetime | None:
    """End of the newest billed hour of any export: the bill covers time up to here. None before any import."""
    newest = max((e.newest_hour for e in exports if e.newest_hour is not None), default=None)
    return None if newest is None else newest + HOUR


__all__ = [
    "TOLERANCE",
    "BillingExport",
    "HoursDisagreement",
    "Reconciliation",
    "SpotRead",
    "UnmonitoredInstance",
    "billed_until",
    "billing_exports",
    "reconcile",
    "spot_reads",
]
