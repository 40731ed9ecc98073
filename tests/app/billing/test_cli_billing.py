"""`gpufleet billing import SOURCE`: one line per export and exit 0; one line naming the file and exit 2, with
nothing written, when the input is bad."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.billing.cur_writer import export_path, write_cur
from app.cli import main
from tests.app.billing.cur_lines import EXPECTED, NOV, month_lines


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (
            conn.execute(text("SELECT count(*) FROM billed_hours")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM billing_exports")).scalar_one(),
        )


def test_import_prints_a_line_per_export(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, tmp_path: Path
) -> None:
    write_cur(export_path(tmp_path, NOV), month_lines(hours=2))
    db = ["--database-url", database_url]
    usd = 2 * sum(e.usd_per_hour for e in EXPECTED.values())
    line = f"2026-11 payer 123456789012: 16 instance-hours, ${usd:,.2f}, newest hour 2026-11-03 06:00 UTC"

    code, out, err = run(capsys, "billing", "import", str(tmp_path), *db)
    assert (code, out, err) == (0, f"{line} (new)\n", "")
    assert counts(engine) == (16, 1)

    code, out, err = run(capsys, "billing", "import", str(tmp_path), *db)
    assert (code, out, err) == (0, f"{line} (unchanged)\n", "")


def test_a_bad_file_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, tmp_path: Path
) -> None:
    write_cur(export_path(tmp_path, NOV), month_lines(hours=2))
    bad = tmp_path / "gpufleet-cur" / "data" / "BILLING_PERIOD=2026-12" / "gpufleet-cur-00001.snappy.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_text("bill_payer_account_id,line_item_usage_start_date\n")

    code, out, err = run(capsys, "billing", "import", str(tmp_path), "--database-url", database_url)
    assert (code, out, err) == (2, "", f"gpufleet: {bad}: not a Parquet file\n")
    assert counts(engine) == (0, 0)


def test_a_missing_source_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, tmp_path: Path
) -> None:
    code, out, err = run(capsys, "billing", "import", str(tmp_path / "nowhere"), "--database-url", database_url)
    assert (code, out, err) == (2, "", f"gpufleet: {tmp_path / 'nowhere'}: no such file or folder\n")
    code, out, err = run(capsys, "billing", "import", str(tmp_path), "--database-url", database_url)
    assert (code, out, err) == (2, "", f"gpufleet: {tmp_path}: no Parquet files (*.parquet) found\n")
    assert counts(engine) == (0, 0)


def test_a_capacity_block_without_its_fee_is_said_on_stderr(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, tmp_path: Path
) -> None:
    lines = [line for line in month_lines(hours=1) if line.line_item_type != "Fee"]
    write_cur(export_path(tmp_path, NOV), lines)
    code, out, err = run(capsys, "billing", "import", str(tmp_path), "--database-url", database_url)
    assert code == 0 and out.endswith("(new)\n")
    assert err == (
        "gpufleet: 2026-11 payer 123456789012: Capacity Block cr-0b10c4000000000001: 1 instance-hours with no "
        "upfront fee in the files read to price them from; kept at their billed cost\n"
    )
