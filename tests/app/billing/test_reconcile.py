"""The bill against the agents on constructed rows: unmonitored spend, billed and reported hours that disagree, the
window, the exports and the spot reads. Billed hours and rollups are written directly, as the import and the ingest
path would leave them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.billing.reconcile import (
    BillingExport,
    billed_until,
    billing_exports,
    reconcile,
    spot_reads,
)
from app.billing.tables import billed_hours, spot_price_reads
from app.billing.tables import billing_exports as exports_table
from app.models import Gpu, Instance
from app.store.instance_rollups import instance_rollups_daily, instance_rollups_hourly

H = timedelta(hours=1)
T0 = datetime(2026, 11, 2, 0, tzinfo=UTC)
"""A UTC midnight: billed spans from here cover whole days."""
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
PAYER = "123456789012"
NOV = date(2026, 11, 1)
IMPORTED = datetime(2026, 11, 24, 6, tzinfo=UTC)


def bill(
    session: Session,
    instance_id: str,
    start: datetime,
    hours: int,
    *,
    usd: float = 2.0,
    usage_h: float = 1.0,
    instance_type: str = "p4d.24xlarge",
    zone: str | None = "us-east-1a",
    account: str | None = "210987654321",
    purchase: str = "on-demand",
) -> None:
    """`hours` consecutive billed hours of an instance from `start`, each `usage_h` instance-hours for `usd`."""
    session.execute(
        insert(billed_hours),
        [
            {
                "instance_id": instance_id,
                "hour": start + n * H,
                "payer_account": PAYER,
                "billing_period": NOV,
                "usage_account": account,
                "instance_type": instance_type,
                "region": zone[:-1] if zone else None,
                "availability_zone": zone,
                "purchase": purchase,
                "usage_h": usage_h,
                "usd": usd,
            }
            for n in range(hours)
        ],
    )


def record_export(
    session: Session, newest_hour: datetime | None, *, period: date = NOV, hours: float = 3.0, usd: float = 6.0
) -> None:
    """The export row an import of the month leaves, imported at IMPORTED."""
    row = {"payer_account": PAYER, "billing_period": period, "files": [], "digest": period.isoformat(), "lines": 3,
           "instance_hours": hours, "usd": usd, "newest_hour": newest_hour, "imported_at": IMPORTED}  # fmt: skip
    session.execute(insert(exports_table), [row])


def agent(session: Session, instance_id: str, *, gpus: int = 1, name: str | None = None) -> int:
    """An instance some agent reported, with its GPUs; its pk."""
    seen = datetime(2026, 10, 1, tzinfo=UTC)
    inst = Instance(
        instance_id=instance_id,
        instance_type="p4d.24xlarge",
        tags={"Name": name} if name else {},
        first_seen=seen,
        last_seen=seen,
    )
    session.add(inst)
    session.flush()
    for g in range(gpus):
        uuid = f"GPU-{instance_id}-{g}"
        session.add(Gpu(uuid=uuid, instance_pk=inst.id, gpu_index=g, name="A100", first_seen=seen, updated_at=seen))
    session.flush()
    return inst.id


def reported(session: Session, pk: int, hours: Iterable[datetime], *, gpus: int = 1, share: float = 1.0) -> None:
    """Rollups for `share` of each hour of data from each of `gpus` GPUs, hourly and daily as the ingest writes."""
    rows = [{"hour": h, "instance_pk": pk, "secs_w": share * 3600 * gpus, "gpu_s": share * 3600 * gpus} for h in hours]
    session.execute(insert(instance_rollups_hourly), rows)
    days: dict[datetime, float] = defaultdict(float)
    for r in rows:
        days[r["hour"].replace(hour=0)] += r["gpu_s"]
    daily = pg_insert(instance_rollups_daily).values(
        [{"day": d, "instance_pk": pk, "secs_w": s, "gpu_s": s} for d, s in days.items()]
    )
    session.execute(
        daily.on_conflict_do_update(
            index_elements=["day", "instance_pk"],
            set_={c: getattr(instance_rollups_daily.c, c) + getattr(daily.excluded, c) for c in ("secs_w", "gpu_s")},
        )
    )


def hours_from(start: datetime, count: int) -> list[datetime]:
    return [start + n * H for n in range(count)]


def ids(rows: Sequence[object]) -> list[str]:
    return [r.instance_id for r in rows]  # type: ignore[attr-defined]


def test_an_unmonitored_instance_is_listed_with_its_dollars(session: Session) -> None:
    bill(session, "i-0noagent", T0, 5, usd=3.5, instance_type="g5.2xlarge", zone="us-west-2b", purchase="spot")
    bill(session, "i-0noagent", T0 + 5 * H, 2, usd=4.0, instance_type="g5.4xlarge", zone="us-west-2c")
    bill(session, "i-0small", T0, 1, usd=1.0)
    pk = agent(session, "i-0agent")
    bill(session, "i-0agent", T0, 3)
    reported(session, pk, hours_from(T0, 3))

    r = reconcile(session, start=T0, end=T0 + 24 * H, reported_since=LONG_AGO)

    assert ids(r.unmonitored) == ["i-0noagent", "i-0small"]  # biggest USD first; the monitored one is not there
    u = r.unmonitored[0]
    assert (u.billed_h, u.usd) == (7.0, pytest.approx(5 * 3.5 + 2 * 4.0))
    assert (u.first_hour, u.last_hour) == (T0, T0 + 6 * H)
    # Type, zone and account of its newest billed hour; the purchase with the most instance-hours.
    assert (u.instance_type, u.availability_zone, u.usage_account, u.purchase) == (
        "g5.4xlarge",
        "us-west-2c",
        "210987654321",
        "spot",
    )
    assert (r.billed_instances, r.billed_h, r.billed_usd) == (3, 11.0, pytest.approx(25.5 + 1.0 + 6.0))
    assert r.disagreements == []


def test_hours_within_ten_percent_agree_and_beyond_disagree(session: Session) -> None:
    close = agent(session, "i-0close", gpus=8)
    bill(session, "i-0close", T0, 50, usd=20.0)
    reported(session, close, hours_from(T0, 46), gpus=8)  # 4 of 50 hours missing: 8 %
    far = agent(session, "i-0far", gpus=4, name="trainer-7")
    bill(session, "i-0far", T0 + 10 * H, 50, usd=10.0, instance_type="p4de.24xlarge")
    reported(session, far, hours_from(T0 + 10 * H, 40), gpus=4, share=0.5)  # 20 of 50 hours: -60 %
    over = agent(session, "i-0over", gpus=2)
    bill(session, "i-0over", T0, 10)
    reported(session, over, hours_from(T0, 10), gpus=2)
    reported(session, over, hours_from(T0 + 10 * H, 5), gpus=2)  # after the newest billed hour: not compared

    r = reconcile(session, start=T0, end=T0 + 7 * 24 * H, reported_since=LONG_AGO)

    assert ids(r.disagreements) == ["i-0far"] and r.unmonitored == []
    d = r.disagreements[0]
    assert (d.name, d.instance_type) == ("trainer-7", "p4de.24xlarge")
    assert (d.first_hour, d.last_hour) == (T0 + 10 * H, T0 + 59 * H)
    assert (d.billed_h, d.reported_h) == (50.0, pytest.approx(20.0))
    assert d.difference_h == pytest.approx(-30.0) and d.difference_pct == pytest.approx(-60.0)
    assert d.usd == pytest.approx(500.0)


def test_reported_hours_outside_the_billed_span_do_not_count(session: Session) -> None:
    # Reported a day before the bill starts and 11 of the 12 billed hours: the day before is not compared.
    pk = agent(session, "i-0early")
    reported(session, pk, hours_from(T0 - 24 * H, 24))
    reported(session, pk, hours_from(T0, 11))
    bill(session, "i-0early", T0, 12)
    assert reconcile(session, start=T0 - 48 * H, end=T0 + 48 * H, reported_since=LONG_AGO).disagreements == []

    # More reported than billed: the bill is short (a month not yet complete, say).
    pk = agent(session, "i-0short")
    reported(session, pk, hours_from(T0, 30))
    bill(session, "i-0short", T0, 30, usage_h=0.5)
    [d] = reconcile(session, start=T0, end=T0 + 48 * H, reported_since=LONG_AGO).disagreements
    assert (d.billed_h, d.reported_h, d.difference_pct) == (15.0, pytest.approx(30.0), pytest.approx(100.0))


def test_a_gpu_counts_no_more_than_the_hour(session: Session) -> None:
    # Rollups above one hour per GPU (a GPU that moved to another instance): each hour counts once at most.
    pk = agent(session, "i-0moved", gpus=1)
    reported(session, pk, hours_from(T0 + 20 * H, 10), gpus=2)
    bill(session, "i-0moved", T0 + 20 * H, 10)
    assert reconcile(session, start=T0, end=T0 + 48 * H, reported_since=LONG_AGO).disagreements == []


def test_a_monitored_instance_without_gpus_reported_nothing(session: Session) -> None:
    agent(session, "i-0nogpu", gpus=0)
    bill(session, "i-0nogpu", T0, 4)
    [d] = reconcile(session, start=T0, end=T0 + 24 * H, reported_since=LONG_AGO).disagreements
    assert (d.billed_h, d.reported_h, d.difference_pct) == (4.0, 0.0, -100.0)


def test_only_the_window_counts(session: Session) -> None:
    bill(session, "i-0before", T0 - 30 * H, 6)
    bill(session, "i-0across", T0 - 2 * H, 6, usd=1.5)
    pk = agent(session, "i-0half")
    bill(session, "i-0half", T0 - 10 * H, 20)
    reported(session, pk, hours_from(T0, 10))  # only the hours in the window were reported

    r = reconcile(session, start=T0, end=T0 + 24 * H, reported_since=LONG_AGO)

    assert ids(r.unmonitored) == ["i-0across"]
    assert (r.unmonitored[0].billed_h, r.unmonitored[0].usd, r.unmonitored[0].first_hour) == (4.0, 6.0, T0)
    assert r.disagreements == [] and r.billed_instances == 2
    wider = reconcile(session, start=T0 - 48 * H, end=T0 + 24 * H, reported_since=LONG_AGO)
    assert ids(wider.unmonitored) == ["i-0before", "i-0across"]
    assert ids(wider.disagreements) == ["i-0half"]
    assert reconcile(session, start=T0 + 24 * H, end=T0 + 48 * H, reported_since=LONG_AGO).billed_instances == 0


def test_hours_the_rollups_no_longer_hold_are_not_compared(session: Session) -> None:
    pk = agent(session, "i-0old")
    bill(session, "i-0old", T0, 48, usd=1.0)
    reported(session, pk, hours_from(T0 + 24 * H, 24))  # the first day's rollups are gone
    bill(session, "i-0gone", T0, 30)  # all its hours count as unmonitored spend, retained or not

    r = reconcile(session, start=T0, end=T0 + 72 * H, reported_since=T0 + 24 * H)

    assert r.compared_since == T0 + 24 * H and r.disagreements == []
    assert r.unmonitored[0].billed_h == 30.0
    assert ids(reconcile(session, start=T0, end=T0 + 72 * H, reported_since=LONG_AGO).disagreements) == ["i-0old"]


def test_exports_spot_reads_and_billed_until(session: Session) -> None:
    assert billing_exports(session) == [] and billed_until([]) is None and spot_reads(session) == []
    imported = IMPORTED
    record_export(session, datetime(2026, 10, 31, 23, tzinfo=UTC), period=date(2026, 10, 1), hours=720, usd=1440)
    record_export(session, T0 + 2 * H)
    session.execute(
        insert(spot_price_reads),
        [
            {"instance_type": "p4d.24xlarge", "availability_zone": "us-east-1b", "read_until": imported,
             "read_at": imported, "failures": 0, "next_try": None, "last_error": None},
            {"instance_type": "g5.xlarge", "availability_zone": "us-east-1a", "read_until": None, "read_at": None,
             "failures": 3, "next_try": imported + H, "last_error": "UnauthorizedOperation: not allowed"},
        ],
    )  # fmt: skip

    exports = billing_exports(session)
    assert exports[0] == BillingExport(PAYER, NOV, 3.0, 6.0, T0 + 2 * H, imported)
    assert [e.billing_period for e in exports] == [NOV, date(2026, 10, 1)]
    assert billed_until(exports) == T0 + 3 * H
    reads = spot_reads(session)
    assert [(s.instance_type, s.failures, s.last_error) for s in reads] == [
        ("g5.xlarge", 3, "UnauthorizedOperation: not allowed"),
        ("p4d.24xlarge", 0, None),
    ]
