from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.collect.topology import profile_name

from .conftest import Host


def test_p4d_layout_with_mixed_profiles_free_slices_and_a_hole(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    gpus = h.interval().gpus
    assert len(gpus) == 8
    assert [g.mig_mode for g in gpus] == [True] * 4 + [False] * 4
    assert [g.unpartitioned_slices for g in gpus] == [0, 1, 0, 2, None, None, None, None]
    assert [s.profile for s in gpus[0].slices] == ["1g.5gb"] * 7
    assert sorted(s.profile for s in gpus[1].slices) == ["1g.5gb", "2g.10gb", "3g.20gb"]
    assert sorted(s.profile for s in gpus[2].slices) == ["3g.20gb", "4g.20gb"]
    shared = [s for s in gpus[3].slices if s.gpu_instance_id == 3]
    assert [(s.compute_instance_id, s.profile, s.compute_slices) for s in shared] == [
        (0, "1c.2g.10gb", 1),
        (1, "1c.2g.10gb", 1),
    ]
    assert all(s.uuid.startswith("MIG-") for g in gpus for s in g.slices)
    assert h.nvml.take_errors() == {}, "an empty MIG index is not an error"


def test_h100_profiles(host: Callable[[str], Host]) -> None:
    gpus = host("p5-mig").interval().gpus
    profiles = {s.profile for g in gpus for s in g.slices}
    assert profiles == {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.20gb"}
    assert all(s.memory_total_mib and s.memory_total_mib > 9000 for g in gpus for s in g.slices)


def test_slices_are_described_once_and_re_enumerated_every_interval(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.interval()
    described = h.lib.calls["nvmlDeviceGetAttributes"]
    enumerated = h.lib.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    h.interval()
    assert h.lib.calls["nvmlDeviceGetAttributes"] == described
    assert h.lib.calls["nvmlDeviceGetMigDeviceHandleByIndex"] > enumerated


@pytest.mark.parametrize(
    ("gpu", "gpu_mib", "slices", "mib", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, 1, 4864, "1g.5gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 1, 9728, "1g.10gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, 3, 40192, "3g.40gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 7, 80896, "7g.80gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 1, 19968, "1g.20gb"),
        ("NVIDIA H200", 143771, 2, 35840, "2g.35gb"),
        ("NVIDIA B200", 183359, 2, 45568, "2g.45gb"),
    ],
)
def test_profile_names(gpu: str, gpu_mib: int, slices: int, mib: int, expected: str) -> None:
    assert profile_name(gpu, gpu_mib, slices, mib) == expected


def test_non_mig_gpus_report_no_slices(host: Callable[[str], Host]) -> None:
    for scenario in ("p5", "g5-idle", "g6e-busy"):
        gpus = host(scenario).interval().gpus
        assert all(not g.mig_mode and g.slices == () and g.unpartitioned_slices is None for g in gpus)


def test_a_host_without_gpus_gives_empty_intervals(host: Callable[[str], Host]) -> None:
    interval = host("no-gpu").interval()
    assert interval.gpus == () and interval.readings == []
