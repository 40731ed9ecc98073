from __future__ import annotations

import pytest

from agent.collect.profiles import Profile, from_device_name, from_size, models_of


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", Profile("1g.5gb", 1, 1)),
        ("NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb", Profile("1c.2g.10gb", 1, 2)),
        ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", Profile("7g.80gb", 7, 7)),
        ("NVIDIA H200 MIG 2c.3g.71gb", Profile("2c.3g.71gb", 2, 3)),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", Profile("1g.5gb", 1, 1)),
        ("MIG 3g.20gb", Profile("3g.20gb", 3, 3)),
        ("NVIDIA A100-SXM4-40GB", None),
        ("NVIDIA H100 80GB HBM3", None),
    ],
)
def test_profile_from_the_mig_device_name(name: str, expected: Profile | None) -> None:
    assert from_device_name(name) == expected


@pytest.mark.parametrize(
    ("gpu", "gpu_mib", "slices", "mib", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, 1, 4864, "1g.5gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 1, 9984, "1g.10gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 3, 19968, "3g.20gb"),  # older drivers' size
        ("NVIDIA A100-SXM4-80GB", 81920, 3, 40192, "3g.40gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 7, 81152, "7g.80gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 1, 20096, "1g.20gb"),
        ("NVIDIA H200", 143771, 2, 33280, "2g.35gb"),
        ("NVIDIA H200", 143771, 3, 71424, "3g.71gb"),
        ("NVIDIA B200", 183359, 2, 45568, "2g.45gb"),
        # The parent's memory refused (no MIG monitor right): the name still tells an A100-40GB from an 80GB.
        ("NVIDIA A100-SXM4-40GB", None, 1, 4864, "1g.5gb"),
        ("NVIDIA A100-SXM4-40GB", None, 3, 20096, "3g.20gb"),
        ("NVIDIA A100-SXM4-80GB", None, 1, 9728, "1g.10gb"),
        # No size in the name and none known: the slice's own memory picks the profile.
        ("NVIDIA A100-PCIE", None, 1, 4864, "1g.5gb"),
        ("NVIDIA A100-PCIE", None, 2, 19968, "2g.20gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 1, None, "1g"),
    ],
)
def test_profile_from_the_slice_size(
    gpu: str, gpu_mib: int | None, slices: int, mib: int | None, expected: str
) -> None:
    assert from_size(gpu, gpu_mib, slices, mib) == expected


def test_a_model_is_never_assumed() -> None:
    assert models_of("NVIDIA A100-SXM4-40GB", None) == ["A100-40GB"]
    assert models_of("NVIDIA A100-SXM4-80GB", None) == ["A100-80GB"]
    assert models_of("NVIDIA A100-PCIE", None) == ["A100-40GB", "A100-80GB"]
    assert models_of("NVIDIA H100 NVL", 95830) == []
    assert models_of("NVIDIA L40S", 46068) == []
