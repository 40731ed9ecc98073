"""The shipped facts: EC2 GPU instance types with their list prices, and the MIG profiles of each GPU model."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

CATALOG_FILE = "ec2-gpu-instances.csv"
MIG_FILE = "mig-profiles.csv"


@dataclass(frozen=True)
class InstanceType:
    """One EC2 GPU instance type. `on_demand_usd_per_hour` is the us-east-1 Linux list price, USD/h, or None."""

    name: str
    gpu_model: str
    nvml_name: str | None  # the name NVML reports on this family; None where not seen
    gpu_count: int
    gpu_memory_gib: float  # per GPU, nominal
    vcpu: int
    on_demand_usd_per_hour: float | None


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of one GPU model: `compute_slices` of 7, `memory_gb` nominal, `max_count` per GPU."""

    gpu_model: str
    name: str
    compute_slices: int
    memory_gb: float
    max_count: int


def _rows(package: str, filename: str) -> list[dict[str, str]]:
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _optional(text: str) -> str | None:
    return text.strip() or None


@lru_cache(maxsize=1)
def load_catalog() -> dict[str, InstanceType]:
    """Every instance type of the shipped catalog, by name, in the file's order. Shared: do not modify."""
    catalog: dict[str, InstanceType] = {}
    for row in _rows("app.pricing.data", CATALOG_FILE):
        price = _optional(row["on_demand_usd_per_hour_us_east_1"])
        entry = InstanceType(
            name=row["instance_type"].strip(),
            gpu_model=row["gpu_model"].strip(),
            nvml_name=_optional(row["nvml_name"]),
            gpu_count=int(row["gpu_count"]),
            gpu_memory_gib=float(row["gpu_memory_gib"]),
            vcpu=int(row["vcpu"]),
            on_demand_usd_per_hour=None if price is None else float(price),
        )
        catalog[entry.name] = entry
    return catalog


@lru_cache(maxsize=1)
def mig_profiles() -> dict[str, list[MigProfile]]:
    """MIG profiles by GPU model as the table names it (e.g. "A100-40GB"), in the file's order. Shared."""
    profiles: dict[str, list[MigProfile]] = {}
    # The agent ships this table; the server reads the same copy so the two never disagree.
    for row in _rows("agent.data", MIG_FILE):
        profile = MigProfile(
            gpu_model=row["gpu_model"].strip(),
            name=row["profile"].strip(),
            compute_slices=int(row["compute_slices_of_7"]),
            memory_gb=float(row["memory_gb"]),
            max_count=int(row["max_per_gpu"]),
        )
        profiles.setdefault(profile.gpu_model, []).append(profile)
    return profiles
