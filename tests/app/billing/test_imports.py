"""Importing CUR 2.0 exports: what is stored per instance-hour, idempotent re-imports, a newer delivery replacing the
month, nothing written when a file is bad, and an export read from S3."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.billing.cur import CurError
from app.billing.cur_writer import (
    capacity_block_fee_line,
    capacity_reservation_arn,
    export_path,
    instance_hour_lines,
    write_cur,
)
from app.billing.imports import ExportResult, import_source
from app.billing.sources import Listed, SourceError, newest_deliveries
from app.db import session_scope
from tests.app.billing.cur_lines import BLOCK, EXPECTED, H0, NOV, PAYER, month_lines
from tests.aws_server import AwsServer

OCT = date(2026, 10, 1)


def run(sessions: sessionmaker[Session], source: Path | str) -> list[ExportResult]:
    with session_scope(sessions) as session:
        return import_source(session, str(source))


def stored(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every stored hour by instance: (hour, purchase, usage_h, usd, reservation_id, reservation_kind)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT instance_id, hour, purchase, usage_h, usd, reservation_id, reservation_kind, payer_account, "
                "billing_period, instance_type FROM billed_hours ORDER BY instance_id, hour"
            )
        ).all()
    out: dict[str, list[tuple[object, ...]]] = {}
    for r in rows:
        assert (r.payer_account, r.billing_period) == (PAYER, NOV)
        out.setdefault(r.instance_id, []).append((r.hour, r.purchase, r.usage_h, r.usd, r.reservation_id,
                                                  r.reservation_kind))  # fmt: skip
    return out


def export_row(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT *, xmin::text AS xmin FROM billing_exports")).one()._mapping)


def test_import_stores_every_gpu_instance_hour_at_its_effective_cost(
    sessions: sessionmaker[Session], engine: Engine, tmp_path: Path
) -> None:
    path = write_cur(export_path(tmp_path, NOV), month_lines(hours=3))
    [result] = run(sessions, tmp_path)

    usd = 3 * sum(e.usd_per_hour for e in EXPECTED.values())
    assert (result.payer_account, result.billing_period, result.status) == (PAYER, NOV, "new")
    assert (result.lines, result.instance_hours, result.newest_hour) == (
        3 * len(EXPECTED),
        24.0,
        H0 + timedelta(hours=2),
    )
    assert result.usd == pytest.approx(usd) and result.warnings == ()
    hours = stored(engine)
    assert set(hours) == set(EXPECTED)  # the CPU instance, EBS, S3 and tax lines are not kept
    for iid, e in EXPECTED.items():
        assert hours[iid] == [
            (H0 + timedelta(hours=n), e.purchase, 1.0, e.usd_per_hour, e.reservation_id, e.reservation_kind)
            for n in range(3)
        ], iid
    row = export_row(engine)
    assert row["files"] == [{"source": str(path), "sha256": row["files"][0]["sha256"], "bytes": path.stat().st_size}]
    assert (row["lines"], row["instance_hours"], row["newest_hour"]) == (24, 24.0, H0 + timedelta(hours=2))
    assert row["usd"] == pytest.approx(usd) and len(row["digest"]) == 64


def test_an_unchanged_export_is_not_written_again(
    sessions: sessionmaker[Session], engine: Engine, tmp_path: Path
) -> None:
    write_cur(export_path(tmp_path, NOV), month_lines(hours=2))
    [first] = run(sessions, tmp_path)
    before = export_row(engine)
    with engine.connect() as conn:
        hours_before = conn.execute(text("SELECT instance_id, hour, xmin::text FROM billed_hours ORDER BY 1, 2")).all()

    [again] = run(sessions, tmp_path)
    assert again.status == "unchanged"
    assert (again.lines, again.instance_hours, again.usd, again.newest_hour) == (
        first.lines, first.instance_hours, first.usd, first.newest_hour
    )  # fmt: skip
    assert export_row(engine) == before  # imported_at and the row version alike
    with engine.connect() as conn:
        assert conn.execute(text("SELECT instance_id, hour, xmin::text FROM billed_hours ORDER BY 1, 2")).all() == (
            hours_before
        )


def test_a_newer_delivery_of_the_month_replaces_the_one_before(
    sessions: sessionmaker[Session], engine: Engine, tmp_path: Path
) -> None:
    old = write_cur(export_path(tmp_path, NOV, delivery="2026-11-04T05:00:00.000Z-aaaa"), month_lines(hours=2))
    run(sessions, tmp_path)
    imported_before = export_row(engine)["imported_at"]
    # Data Exports in "create new" mode: a new folder per delivery, the old one left in place.
    new = write_cur(
        export_path(tmp_path, NOV, delivery="2026-11-05T05:00:00.000Z-bbbb"),
        month_lines(hours=3, skip=("i-0spot",)),
    )
    os.utime(old, (new.stat().st_mtime - 3600, new.stat().st_mtime - 3600))

    [result] = run(sessions, tmp_path)
    assert result.status == "replaced"
    hours = stored(engine)
    assert "i-0spot" not in hours  # the newer delivery lacks it: its lines are gone
    assert {iid: len(h) for iid, h in hours.items()} == {iid: 3 for iid in EXPECTED if iid != "i-0spot"}
    row = export_row(engine)
    assert [f["source"] for f in row["files"]] == [str(new)]
    assert row["imported_at"] > imported_before and row["lines"] == 3 * (len(EXPECTED) - 1)


@pytest.mark.parametrize("existing", [False, True], ids=["empty", "over-an-import"])
def test_one_bad_file_and_nothing_is_imported(
    sessions: sessionmaker[Session], engine: Engine, tmp_path: Path, existing: bool
) -> None:
    if existing:
        write_cur(export_path(tmp_path, NOV), month_lines(hours=1))
        run(sessions, tmp_path)
    before = stored(engine), export_row(engine) if existing else None
    write_cur(export_path(tmp_path, NOV), month_lines(hours=2))  # a good new delivery of November...
    bad = export_path(tmp_path, OCT)
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PAR1 but cut short")  # ...and a damaged October

    with pytest.raises(CurError, match=f"^{bad}: truncated or damaged Parquet file"):
        run(sessions, tmp_path)
    assert (stored(engine), export_row(engine) if existing else None) == before
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM billing_exports")).scalar() == (1 if existing else 0)


def test_two_exports_of_the_same_month_are_refused(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    write_cur(export_path(tmp_path, NOV, export="hourly"), month_lines(hours=1))
    write_cur(export_path(tmp_path, NOV, export="hourly-copy"), month_lines(hours=1))
    with pytest.raises(SourceError, match="2026-11 of payer 123456789012 is billed by two exports"):
        run(sessions, tmp_path)


def test_import_from_s3(sessions: sessionmaker[Session], engine: Engine, tmp_path: Path, aws: AwsServer) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="billing")
    local = write_cur(export_path(tmp_path, NOV), month_lines(hours=2))
    key = "cur/" + local.relative_to(tmp_path).as_posix()
    s3.upload_file(str(local), "billing", key)
    s3.put_object(Bucket="billing", Key="cur/gpufleet-cur/metadata/BILLING_PERIOD=2026-11/m.json", Body=b"{}")

    [result] = run(sessions, "s3://billing/cur")
    assert (result.status, result.lines) == ("new", 2 * len(EXPECTED))
    assert set(stored(engine)) == set(EXPECTED)
    assert [f["source"] for f in export_row(engine)["files"]] == [f"s3://billing/{key}"]
    assert run(sessions, "s3://billing/cur/")[0].status == "unchanged"

    with pytest.raises(SourceError, match=r"^s3://nothing/cur: NoSuchBucket: "):
        run(sessions, "s3://nothing/cur")
    with pytest.raises(SourceError, match=r"^s3://billing/other: no Parquet files \(\*\.parquet\) found$"):
        run(sessions, "s3://billing/other")


def test_only_the_newest_delivery_of_each_month_is_read() -> None:
    def listed(key: str, modified: float) -> Listed:
        return Listed(f"/x/{key}", key, modified)

    files = [
        listed("e/data/BILLING_PERIOD=2026-11/2026-11-04T05:00:00.000Z-a/e-00001.snappy.parquet", 100.0),
        listed("e/data/BILLING_PERIOD=2026-11/2026-11-04T05:00:00.000Z-a/e-00002.snappy.parquet", 100.0),
        listed("e/data/BILLING_PERIOD=2026-11/2026-11-05T05:00:00.000Z-b/e-00001.snappy.parquet", 100.0),
        listed("e/data/BILLING_PERIOD=2026-10/e-00001.snappy.parquet", 50.0),  # overwritten in place
        listed("e/data/BILLING_PERIOD=2026-10/2026-10-02T05:00:00.000Z-c/e-00001.snappy.parquet", 10.0),
        listed("loose/cur.parquet", 1.0),  # outside any billing period folder: read
    ]
    assert [f.key for f in newest_deliveries(files)] == [
        "e/data/BILLING_PERIOD=2026-10/e-00001.snappy.parquet",
        "e/data/BILLING_PERIOD=2026-11/2026-11-05T05:00:00.000Z-b/e-00001.snappy.parquet",
        "loose/cur.parquet",
    ]


def test_a_capacity_block_bought_in_one_month_and_run_in_the_next_costs_its_fee_once(
    sessions: sessionmaker[Session], engine: Engine, tmp_path: Path
) -> None:
    arn = capacity_reservation_arn(BLOCK)
    last = datetime(2026, 10, 31, 23, tzinfo=UTC)
    write_cur(
        export_path(tmp_path, OCT),
        [
            capacity_block_fee_line(arn, "p5.48xlarge", last - timedelta(days=3), usd=300.0),
            *instance_hour_lines("i-0a", "p5.48xlarge", last, purchase="capacity block", usd=0.0, reservation_arn=arn),
        ],
    )
    [october] = run(sessions, tmp_path)
    assert (october.status, october.usd) == ("new", 300.0)  # all of the block the bill has shown so far

    nov = [
        line
        for n in range(2)
        for line in instance_hour_lines(
            "i-0a", "p5.48xlarge", H0 + timedelta(hours=n), purchase="capacity block", usd=0.0, reservation_arn=arn
        )
    ]
    write_cur(export_path(tmp_path, NOV), nov)
    results = run(sessions, tmp_path)
    # October's files are the same, but its price is not: the fee is now spread over 3 hours, not 1.
    assert [(r.billing_period, r.status, r.usd) for r in results] == [(OCT, "replaced", 100.0), (NOV, "new", 200.0)]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT sum(usd) FROM billed_hours")).scalar() == 300.0
    assert [r.status for r in run(sessions, tmp_path)] == ["unchanged", "unchanged"]
