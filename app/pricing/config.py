"""The price file: discounts and per-type prices in TOML (docs/waste.md, "Prices"). All prices are USD."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any


class PriceConfigError(Exception):
    """A price file that cannot be used. `str()` is one line: the file, then the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class TypePrice:
    """Overrides for one instance type; prices are for the whole instance, USD/h."""

    usd_per_hour: float | None = None  # on-demand price, replaces the catalog's
    spot_usd_per_hour: float | None = None  # what a spot instance of this type actually costs
    gpus: int | None = None  # GPU count, for types the catalog lacks


@dataclass(frozen=True)
class PriceConfig:
    """Everything the price file can say; the defaults mean catalog list prices only."""

    enterprise_discount_pct: float = 0.0  # applied to catalog on-demand prices only
    spot_discount_pct: float | None = None  # spot = on-demand x (1 - pct/100) when no spot price is given
    on_prem_usd_per_gpu_hour: float | None = None  # USD per GPU-hour for hosts off EC2
    instance_types: dict[str, TypePrice] = field(default_factory=dict)


_TOP_KEYS = ("enterprise_discount_pct", "spot_discount_pct", "on_prem_usd_per_gpu_hour", "instance_types")
_TYPE_KEYS = ("usd_per_hour", "spot_usd_per_hour", "gpus")


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, datetime | date | time):
        return "a date or time"
    return str(value)


def _type_key(name: str) -> str:
    return f"instance_types.{json.dumps(name)}"


class _Reader:
    """Checks one parsed file; every complaint names the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, problem: str) -> PriceConfigError:
        return PriceConfigError(self.path, problem)

    def number(self, key: str, value: object) -> float:
        # bool is an int in Python; TOML's true/false is never a price
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{key}: expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise self.fail(f"{key}: expected a finite number, got {value}")
        return float(value)

    def price(self, key: str, value: object) -> float:
        number = self.number(key, value)
        if number < 0:
            raise self.fail(f"{key}: a price cannot be negative, got {value}")
        return number

    def percent(self, key: str, value: object) -> float:
        number = self.number(key, value)
        if not 0 <= number <= 100:
            raise self.fail(f"{key}: a percentage must be between 0 and 100, got {value}")
        return number

    def count(self, key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{key}: expected a whole number, got {_describe(value)}")
        if value < 1:
            raise self.fail(f"{key}: must be at least 1, got {value}")
        return value

    def unknown(self, where: str, key: str, value: object, known: tuple[str, ...]) -> PriceConfigError:
        name = f"{where}.{json.dumps(key)}" if where else json.dumps(key)
        if key == "currency":
            return self.fail(f"unknown key {name}: every price is in USD, there is no currency setting")
        if where and isinstance(value, dict):
            # [instance_types.p4d.24xlarge] without quotes nests tables at each dot
            return self.fail(
                f'unknown key {name}: quote instance types that contain dots, as in [instance_types."p4d.24xlarge"]'
            )
        return self.fail(f"unknown key {name} (known: {', '.join(known)})")

    def type_price(self, name: str, value: object) -> TypePrice:
        where = _type_key(name)
        if not isinstance(value, dict):
            raise self.fail(f"{where}: expected a table of {', '.join(_TYPE_KEYS)}, got {_describe(value)}")
        for key, item in value.items():
            if key not in _TYPE_KEYS:
                raise self.unknown(where, key, item, _TYPE_KEYS)
        if not value:
            raise self.fail(f"{where}: sets none of {', '.join(_TYPE_KEYS)}")
        usd = value.get("usd_per_hour")
        spot = value.get("spot_usd_per_hour")
        gpus = value.get("gpus")
        return TypePrice(
            usd_per_hour=None if usd is None else self.price(f"{where}.usd_per_hour", usd),
            spot_usd_per_hour=None if spot is None else self.price(f"{where}.spot_usd_per_hour", spot),
            gpus=None if gpus is None else self.count(f"{where}.gpus", gpus),
        )

    def config(self, data: dict[str, Any]) -> PriceConfig:
        for key, item in data.items():
            if key not in _TOP_KEYS:
                raise self.unknown("", key, item, _TOP_KEYS)
        types = data.get("instance_types", {})
        if not isinstance(types, dict):
            raise self.fail(f"instance_types: expected a table of instance types, got {_describe(types)}")
        enterprise = data.get("enterprise_discount_pct")
        spot = data.get("spot_discount_pct")
        on_prem = data.get("on_prem_usd_per_gpu_hour")
        return PriceConfig(
            enterprise_discount_pct=0.0 if enterprise is None else self.percent("enterprise_discount_pct", enterprise),
            spot_discount_pct=None if spot is None else self.percent("spot_discount_pct", spot),
            on_prem_usd_per_gpu_hour=None if on_prem is None else self.price("on_prem_usd_per_gpu_hour", on_prem),
            instance_types={name: self.type_price(name, value) for name, value in types.items()},
        )


def load_price_config(path: Path | None) -> PriceConfig:
    """The price file at `path`, checked; None means no file (catalog list prices only)."""
    if path is None:
        return PriceConfig()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PriceConfigError(path, f"cannot read it: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PriceConfigError(path, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise PriceConfigError(path, f"not valid TOML: {first}") from None
    return _Reader(path).config(data)
