"""The server's billing jobs: off unless configured; a scheduled import stores the bill and its price stretches; a
lasting failure is logged once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from app.billing.cur_writer import export_path, write_cur
from app.billing.schedule import Reasons, billing_jobs, import_bill
from app.billing.tables import billed_hours, billed_prices
from app.settings import Settings
from tests.app.billing.cur_lines import NOV, month_lines


def test_no_job_runs_unless_configured(engine: Engine) -> None:
    assert billing_jobs(engine, Settings(database_url="postgresql://x/y")) == []


def test_a_scheduled_import_stores_the_bill_and_its_price_stretches(engine: Engine, tmp_path: Path) -> None:
    write_cur(export_path(tmp_path, NOV), month_lines(hours=2))
    import_bill(engine, str(tmp_path))
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(billed_hours)) > 0
        assert conn.scalar(select(func.count()).select_from(billed_prices)) > 0


def test_a_lasting_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    reasons = Reasons()
    with caplog.at_level(logging.INFO, logger="gpufleet.billing"):
        for _ in range(3):
            reasons.failed("billing import", "s3://bills/cur: AccessDenied")
        reasons.worked("billing import")
    assert [r.getMessage() for r in caplog.records] == [
        "billing import failed, will retry: s3://bills/cur: AccessDenied",
        "billing import works again",
    ]
