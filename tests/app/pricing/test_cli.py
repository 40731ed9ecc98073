"""`gpufleet prices`: the table of every type, and one line with exit code 2 for a bad price file."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.pricing import load_catalog


@pytest.fixture(autouse=True)
def _no_prices_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_PRICES_FILE", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def rows(lines: list[str]) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_catalog_prices(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = run(capsys, "prices")
    assert code == 0
    assert lines[0].split() == ["TYPE", "GPU", "MODEL", "GPUS", "USD/H", "USD/GPU-H", "SPOT", "USD/GPU-H", "SOURCE"]
    table = rows(lines)
    assert list(table) == list(load_catalog())
    assert table["p4d.24xlarge"][2:] == [
        "A100", "40GB", "8", "21.9576", "2.7447", "2.7447", "catalog", "on-demand",
    ]  # fmt: skip
    assert lines[1 + list(table).index("p5e.48xlarge")].endswith("-  no price: p5e.48xlarge has no list price")
    assert "no price file" in err and "spot_discount_pct not set" in err


def test_price_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        'spot_discount_pct = 50\n[instance_types."p5e.48xlarge"]\nusd_per_hour = 68.0\n'
        '[instance_types."p4d.24xlarge"]\nspot_usd_per_hour = 8.0\n'
        '[instance_types."g7.custom"]\nusd_per_hour = 3.0\ngpus = 2\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("GPUFLEET_PRICES_FILE", str(path))  # the default when --file is not given
    code, lines, err = run(capsys, "prices")
    assert code == 0
    table = rows(lines)
    assert list(table)[-1] == "g7.custom"  # config-only types follow the catalog
    assert table["g7.custom"] == ["g7.custom", "-", "2", "3.0000", "1.5000", "0.7500", "config", "g7.custom"]
    assert table["p5e.48xlarge"][4:] == ["68.0000", "8.5000", "4.2500", "config", "p5e.48xlarge"]
    assert lines[1 + list(table).index("p4d.24xlarge")].endswith("catalog on-demand; spot: config spot price")
    assert table["p4d.24xlarge"][7] == "1.0000"
    assert f"price file {path}" in err and "less 50%" in err


def test_bad_price_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text("enterprise_discount_pct = 120\n", encoding="utf-8")
    code, lines, err = run(capsys, "prices", "--file", str(path))
    assert code == 2 and lines == []
    assert err == (
        f"gpufleet: bad price file {path}: enterprise_discount_pct: a percentage must be between 0 and 100, got 120\n"
    )


def test_missing_price_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "prices", "--file", str(tmp_path / "nope.toml"))
    assert code == 2
    assert err.startswith(f"gpufleet: bad price file {tmp_path / 'nope.toml'}: cannot read it:")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_serve_refuses_a_bad_price_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text("spot_discount_pct = 140\n", encoding="utf-8")
    monkeypatch.setenv("GPUFLEET_PRICES_FILE", str(path))
    # Checked before any database is started or joined.
    code, _, err = run(capsys, "serve", "--data-dir", str(tmp_path / "data"))
    assert code == 2
    assert err.startswith(f"gpufleet: bad price file {path}: spot_discount_pct") and len(err.splitlines()) == 1
    assert not (tmp_path / "data").exists()
