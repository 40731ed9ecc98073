"""Report rows, CSV pieces, cells, groupings and the retention check, on constructed data."""

from __future__ import annotations

import csv
import io
from collections.abc import Generator
from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session

from app.analyse.states import Thresholds
from app.analyse.window import Filters
from app.params import BadParameter, parse_window
from app.pricing.resolve import Pricer
from app.report.service import (
    Report,
    _cell,
    build_report,
    check_retention,
    retained_since,
)
from app.settings import Settings
from tests.factories import gpu, mig_slice
from tests.feeding import Feeder, busy, idle


def _report(session: Session, settings: Settings, feeder: Feeder, group_by: list[str]) -> Report:
    now = datetime.now(UTC)
    return build_report(
        session,
        window=parse_window("24h", None, None, now=now),
        filters=Filters(),
        group_by=group_by,
        pricer=Pricer(),
        thresholds=Thresholds.from_settings(settings),
        now=now,
    )


def test_csv_is_produced_a_piece_at_a_time(session: Session, settings: Settings, feeder: Feeder) -> None:
    feeder.feed([gpu(i) for i in range(8)], start=feeder.t0, hours=1, step_s=300, fn=idle, instance_id="i-8")
    report = _report(session, settings, feeder, ["gpu"])
    pieces = report.csv_chunks(chunk_chars=1)
    assert isinstance(pieces, Generator)
    chunks = list(pieces)
    # The header goes with the first row; then a piece per row and one for the totals.
    assert len(chunks) == 8 + 1
    assert all(c.endswith("\n") for c in chunks)
    whole = list(report.csv_chunks())
    assert len(whole) == 1 and whole[0] == "".join(chunks)
    table = list(csv.DictReader(io.StringIO(whole[0])))
    assert [t["gpu"] for t in table] == [*sorted(f"i-8 GPU {i}" for i in range(8)), "TOTAL"]


def test_instances_gpus_and_slices_go_by_instance_id(session: Session, settings: Settings, feeder: Feeder) -> None:
    """Two instances with the same name are two rows that can be told apart."""
    mig = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), mig_slice(2, "2g.10gb")], unpartitioned=2)
    feeder.feed([mig], start=feeder.t0, hours=1, step_s=300, fn=idle, instance_id="i-mig", hostname="box")
    feeder.feed([gpu(0)], start=feeder.t0, hours=1, step_s=300, fn=busy(50), instance_id="i-pass", hostname="box")

    def values(by: str) -> set[str]:
        body = _report(session, settings, feeder, [by]).as_json()
        return {row["group"][by] for row in body["rows"]}

    assert values("instance") == {"i-mig", "i-pass"}
    assert values("gpu") == {"i-mig GPU 0", "i-pass GPU 0"}
    assert values("slice") == {
        "i-mig GPU 0 3g.20gb (GI 1)",
        "i-mig GPU 0 2g.10gb (GI 2)",
        "i-mig GPU 0 unpartitioned",
        "i-pass GPU 0",
    }
    body = _report(session, settings, feeder, ["instance", "gpu_model"]).as_json()
    assert {tuple(r["group"].values()) for r in body["rows"]} == {
        ("i-mig", "NVIDIA A100 40GB"),
        ("i-pass", "NVIDIA A100 40GB"),
    }


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (None, ""),
        (2.0, "2"),
        (0.0, "0"),
        (-0.0, "0"),
        (1e-06, "0.000001"),
        (1234567.891, "1234567.891"),
        (3.5e12, "3500000000000"),
        ("USD", "USD"),
        ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("-1+2", "'-1+2"),
        ("@SUM", "'@SUM"),
        ("plain; text", "plain; text"),
    ],
)
def test_cells_are_plain_numbers_and_inert_text(value: object, cell: str) -> None:
    assert _cell(value) == cell


def test_retention_reaches_back_to_the_midnight_of_the_horizon() -> None:
    now = datetime(2026, 11, 21, 6, 40, tzinfo=UTC)
    assert retained_since(now, 400) == datetime(2025, 10, 17, tzinfo=UTC)
    inside = parse_window(None, "2025-10-17T00:00:00Z", "2025-10-18T00:00:00Z", now=now)
    check_retention(inside, rollup_retention_days=400)
    before = parse_window(None, "2025-10-16T23:00:00Z", "2025-10-18T00:00:00Z", now=now)
    with pytest.raises(BadParameter) as exc:
        check_retention(before, rollup_retention_days=400)
    assert exc.value.param == "start"
    assert "go back to 2025-10-17T00:00:00+00:00" in exc.value.message
    with pytest.raises(BadParameter) as exc:
        check_retention(parse_window("30d", None, None, now=now), rollup_retention_days=7, param="window")
    assert exc.value.param == "window"
    check_retention(parse_window("7d", None, None, now=now), rollup_retention_days=7)
    check_retention(inside, rollup_retention_days=10**6)
