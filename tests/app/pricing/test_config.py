"""The price file: what it accepts, and one readable line naming the file and key for what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.pricing import PriceConfig, PriceConfigError, TypePrice, load_price_config

EXAMPLE = """
enterprise_discount_pct = 8
spot_discount_pct = 62
on_prem_usd_per_gpu_hour = 1.9

[instance_types."p5e.48xlarge"]
usd_per_hour = 68.0
[instance_types."p4d.24xlarge"]
spot_usd_per_hour = 9.5
[instance_types."g7.custom"]
usd_per_hour = 3
gpus = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_is_defaults() -> None:
    assert load_price_config(None) == PriceConfig()
    assert PriceConfig().enterprise_discount_pct == 0.0 and PriceConfig().spot_discount_pct is None


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    assert load_price_config(write(tmp_path, "# nothing set\n")) == PriceConfig()


def test_example_file(tmp_path: Path) -> None:
    config = load_price_config(write(tmp_path, EXAMPLE))
    assert config == PriceConfig(
        enterprise_discount_pct=8.0,
        spot_discount_pct=62.0,
        on_prem_usd_per_gpu_hour=1.9,
        instance_types={
            "p5e.48xlarge": TypePrice(usd_per_hour=68.0),
            "p4d.24xlarge": TypePrice(spot_usd_per_hour=9.5),
            "g7.custom": TypePrice(usd_per_hour=3.0, gpus=1),
        },
    )
    # TOML integers come back as floats where a float is meant
    assert isinstance(config.enterprise_discount_pct, float)
    assert isinstance(config.instance_types["g7.custom"].usd_per_hour, float)


def test_edges_are_accepted(tmp_path: Path) -> None:
    text = "enterprise_discount_pct = 0\nspot_discount_pct = 100\non_prem_usd_per_gpu_hour = 0.0\n"
    config = load_price_config(write(tmp_path, text))
    assert (config.enterprise_discount_pct, config.spot_discount_pct, config.on_prem_usd_per_gpu_hour) == (0, 100, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "enterprise_discount = 8\n",
            'unknown key "enterprise_discount" (known: enterprise_discount_pct, spot_discount_pct, '
            "on_prem_usd_per_gpu_hour, instance_types)",
        ),
        ('currency = "EUR"\n', 'unknown key "currency": every price is in USD, there is no currency setting'),
        (
            '[instance_types."p4d.24xlarge"]\nusd_per_hr = 20\n',
            'unknown key instance_types."p4d.24xlarge"."usd_per_hr" (known: usd_per_hour, spot_usd_per_hour, gpus)',
        ),
        (
            "[instance_types.p4d.24xlarge]\nusd_per_hour = 20\n",
            'unknown key instance_types."p4d"."24xlarge": quote instance types that contain dots, '
            'as in [instance_types."p4d.24xlarge"]',
        ),
        ('spot_discount_pct = "62"\n', 'spot_discount_pct: expected a number, got string "62"'),
        ("enterprise_discount_pct = true\n", "enterprise_discount_pct: expected a number, got true"),
        ("on_prem_usd_per_gpu_hour = [1]\n", "on_prem_usd_per_gpu_hour: expected a number, got an array"),
        ("on_prem_usd_per_gpu_hour = inf\n", "on_prem_usd_per_gpu_hour: expected a finite number, got inf"),
        ("spot_discount_pct = nan\n", "spot_discount_pct: expected a finite number, got nan"),
        ("on_prem_usd_per_gpu_hour = -1.9\n", "on_prem_usd_per_gpu_hour: a price cannot be negative, got -1.9"),
        (
            '[instance_types."p5e.48xlarge"]\nusd_per_hour = -68\n',
            'instance_types."p5e.48xlarge".usd_per_hour: a price cannot be negative, got -68',
        ),
        (
            '[instance_types."p4d.24xlarge"]\nspot_usd_per_hour = -1\n',
            'instance_types."p4d.24xlarge".spot_usd_per_hour: a price cannot be negative, got -1',
        ),
        (
            "enterprise_discount_pct = 101\n",
            "enterprise_discount_pct: a percentage must be between 0 and 100, got 101",
        ),
        ("spot_discount_pct = -5\n", "spot_discount_pct: a percentage must be between 0 and 100, got -5"),
        ('[instance_types."g7.custom"]\ngpus = 0\n', 'instance_types."g7.custom".gpus: must be at least 1, got 0'),
        (
            '[instance_types."g7.custom"]\ngpus = 1.5\n',
            'instance_types."g7.custom".gpus: expected a whole number, got 1.5',
        ),
        ("instance_types = 3\n", "instance_types: expected a table of instance types, got 3"),
        (
            'instance_types = { "g7.custom" = 3.0 }\n',
            'instance_types."g7.custom": expected a table of usd_per_hour, spot_usd_per_hour, gpus, got 3.0',
        ),
        (
            '[instance_types."g7.custom"]\n',
            'instance_types."g7.custom": sets none of usd_per_hour, spot_usd_per_hour, gpus',
        ),
        ("spot_discount_pct = \n", "not valid TOML: Invalid value (at line 1, column 21)"),
        ("a = 1\na = 2\n", "not valid TOML: Cannot overwrite a value (at line 2, column 6)"),
    ],
)
def test_bad_file_is_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PriceConfigError) as caught:
        load_price_config(path)
    assert caught.value.path == path
    assert caught.value.problem == message
    assert str(caught.value) == f"{path}: {message}"
    assert "\n" not in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(PriceConfigError) as caught:
        load_price_config(path)
    assert str(caught.value) == f"{path}: cannot read it: No such file or directory"


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(PriceConfigError, match="cannot read it: Is a directory"):
        load_price_config(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_bytes(b"spot_discount_pct = 62 # \xff\xfe\n")
    with pytest.raises(PriceConfigError) as caught:
        load_price_config(path)
    assert caught.value.problem == "not UTF-8 text"
