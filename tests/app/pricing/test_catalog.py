"""The shipped catalog and MIG profile table load whole, with the right types."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from app.pricing import InstanceType, MigProfile, load_catalog, mig_profiles


def _csv_rows(package: str, name: str) -> list[dict[str, str]]:
    with resources.files(package).joinpath(name).open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_catalog_has_every_row_typed() -> None:
    catalog = load_catalog()
    rows = _csv_rows("app.pricing.data", "ec2-gpu-instances.csv")
    assert len(catalog) == len(rows) == 46
    assert list(catalog) == [row["instance_type"] for row in rows]
    for entry in catalog.values():
        assert isinstance(entry, InstanceType)
        assert isinstance(entry.gpu_count, int) and entry.gpu_count >= 1
        assert isinstance(entry.vcpu, int) and entry.vcpu >= 4
        assert isinstance(entry.gpu_memory_gib, float) and entry.gpu_memory_gib > 0
        assert entry.nvml_name is None or entry.nvml_name.strip() == entry.nvml_name != ""
        assert entry.on_demand_usd_per_hour is None or (
            isinstance(entry.on_demand_usd_per_hour, float) and entry.on_demand_usd_per_hour > 0
        )


def test_catalog_known_rows() -> None:
    catalog = load_catalog()
    assert catalog["p4d.24xlarge"] == InstanceType(
        name="p4d.24xlarge",
        gpu_model="NVIDIA A100 40GB",
        nvml_name="NVIDIA A100-SXM4-40GB",
        gpu_count=8,
        gpu_memory_gib=40.0,
        vcpu=96,
        on_demand_usd_per_hour=21.957642,
    )
    assert catalog["p5e.48xlarge"].on_demand_usd_per_hour is None
    assert catalog["p5en.48xlarge"].nvml_name is None
    assert [name for name, entry in catalog.items() if entry.on_demand_usd_per_hour is None] == ["p5e.48xlarge"]


def test_catalog_is_cached_and_frozen() -> None:
    assert load_catalog() is load_catalog()
    with pytest.raises(AttributeError):
        load_catalog()["g5.xlarge"].gpu_count = 2  # type: ignore[misc]


def test_mig_profiles_by_model() -> None:
    profiles = mig_profiles()
    rows = _csv_rows("agent.data", "mig-profiles.csv")
    assert sorted(profiles) == ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]
    assert sum(len(p) for p in profiles.values()) == len(rows)
    assert profiles["A100-40GB"][0] == MigProfile(
        gpu_model="A100-40GB", name="1g.5gb", compute_slices=1, memory_gb=5.0, max_count=7
    )
    for model, items in profiles.items():
        for profile in items:
            assert profile.gpu_model == model
            assert isinstance(profile.compute_slices, int) and 1 <= profile.compute_slices <= 7
            assert isinstance(profile.max_count, int) and profile.max_count >= 1
            assert isinstance(profile.memory_gb, float)
        # the whole-GPU profile is always there, once per GPU
        assert [p.max_count for p in items if p.compute_slices == 7] == [1]
    assert mig_profiles() is mig_profiles()
