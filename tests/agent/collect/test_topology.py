from __future__ import annotations

from collections.abc import Callable

import pynvml

from agent.collect.topology import UNKNOWN_PROFILE

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


def test_non_mig_gpus_report_no_slices(host: Callable[[str], Host]) -> None:
    for scenario in ("p5", "g5-idle", "g6e-busy"):
        gpus = host(scenario).interval().gpus
        assert all(not g.mig_mode and g.slices == () and g.unpartitioned_slices is None for g in gpus)


def test_a_host_without_gpus_gives_empty_intervals(host: Callable[[str], Host]) -> None:
    interval = host("no-gpu").interval()
    assert interval.gpus == () and interval.readings == []


def test_an_unprivileged_p4d_names_a100_40gb_profiles_and_loses_no_slice(host: Callable[[str], Host]) -> None:
    """Without the MIG monitor capability the parents' memory is refused: the profile must not be guessed from
    an assumed 80 GB A100 (1g.5gb was reported as 1g.10gb, 3g.20gb as 3g.40gb)."""
    h = host("p4d-mig-unprivileged")
    gpus = h.interval().gpus
    assert [g.memory_total_mib for g in gpus[:4]] == [None] * 4
    profiles = sorted({s.profile for g in gpus for s in g.slices})
    assert profiles == ["1c.2g.10gb", "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb"]
    assert sum(len(g.slices) for g in gpus) == 15
    assert [g.unpartitioned_slices for g in gpus[:4]] == [0, 1, 0, 2]


def test_the_profile_comes_from_the_device_name_before_its_size(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig-unprivileged")
    h.lib.fail("nvmlDeviceGetAttributes", pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpus = h.interval().gpus
    assert sorted(s.profile for s in gpus[1].slices) == ["1g.5gb", "2g.10gb", "3g.20gb"]
    assert [(s.compute_slices, s.memory_total_mib) for s in gpus[3].slices if s.gpu_instance_id == 3] == [(1, None)] * 2
    assert gpus[1].unpartitioned_slices == 1


def test_a_slice_that_cannot_be_described_is_reported_unknown_and_its_capacity_is_not_free(
    host: Callable[[str], Host],
) -> None:
    """A slice whose name and attributes cannot be read used to vanish, its compute slices counted free."""
    h = host("p4d-mig")
    for call in ("nvmlDeviceGetAttributes", "nvmlDeviceGetName"):
        h.lib.fail(call, pynvml.NVML_ERROR_UNKNOWN, gpu=2, slice_index=1)
    gpu = h.interval().gpus[2]
    assert len(gpu.slices) == 2
    unknown = [s for s in gpu.slices if s.profile == UNKNOWN_PROFILE]
    assert [(s.gpu_instance_id, s.compute_slices, s.memory_total_mib) for s in unknown] == [(2, None, None)]
    assert gpu.unpartitioned_slices is None, "free capacity is unknown, not 3 compute slices"
    assert gpu.layout_complete
    wire = gpu.to_wire()
    assert "unpartitioned_slices" not in wire and "compute_slices" not in wire["slices"][1]

    h.lib.clear_failures()
    healed = h.interval().gpus[2]
    assert sorted(s.profile for s in healed.slices) == ["3g.20gb", "4g.20gb"]
    assert healed.unpartitioned_slices == 0


def test_a_mig_device_that_cannot_be_identified_leaves_the_layout_incomplete(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.lib.fail("nvmlDeviceGetMigDeviceHandleByIndex", pynvml.NVML_ERROR_UNKNOWN, gpu=1, slice_index=2)
    gpu = h.interval().gpus[1]
    assert len(gpu.slices) == 2
    assert not gpu.layout_complete and gpu.unpartitioned_slices is None
    assert gpu.to_wire()["layout_complete"] is False


def test_a_hopper_gpu_switches_mig_mode_without_a_reset_and_its_new_slices_are_measured(
    host: Callable[[str], Host],
) -> None:
    h = host("p5")
    h.interval()
    h.lib.request_mig_mode(0, True)  # Hopper: no GPU reset, nothing pending (NVIDIA MIG user guide)
    empty = h.interval().gpus[0]
    assert (empty.mig_mode, empty.slices, empty.unpartitioned_slices) == (True, (), 7)
    assert h.collector.pending_mig_changes() == []
    h.lib.create_gpu_instance(0, "3g.40gb")
    h.interval()
    interval = h.interval()
    [s] = interval.gpus[0].slices
    assert (s.profile, s.compute_slices, interval.gpus[0].unpartitioned_slices) == ("3g.40gb", 3, 4)
    assert h.reading(interval, s.uuid)["util_source"] == "nvml.gpm"


def test_an_ampere_mig_request_stays_pending_until_a_reset(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.interval()
    h.lib.request_mig_mode(5, True)
    gpu = h.interval().gpus[5]
    assert not gpu.mig_mode
    assert [(g.index, g.mig_pending) for g in h.collector.pending_mig_changes()] == [(5, True)]
