from __future__ import annotations

from collections.abc import Callable

import pynvml

from agent.collect.gpm import AMPERE_MIG_REASON

from .conftest import Host


def test_hopper_slices_get_utilization_from_gpm(host: Callable[[str], Host]) -> None:
    h = host("p5-mig")
    h.lib.set_load(2, 90.0, slice_index=0)
    h.lib.set_load(2, 30.0, slice_index=1)
    interval = h.interval()
    big, small = interval.gpus[2].slices
    assert (big.profile, small.profile) == ("4g.40gb", "3g.40gb")
    for s, expected in ((big, 90.0), (small, 30.0)):
        wire = h.reading(interval, s.uuid)
        assert wire["util_source"] == "nvml.gpm"
        assert wire["util"] == wire["gr_active"] == expected
        assert wire["sm_active"] is not None
        assert s.util_unavailable_reason is None


def test_every_hopper_slice_is_measured_from_the_first_interval(host: Callable[[str], Host]) -> None:
    h = host("p5-mig")
    interval = h.interval()
    slices = [s for g in interval.gpus for s in g.slices]
    assert len(slices) == 24
    assert all(h.reading(interval, s.uuid)["util_source"] == "nvml.gpm" for s in slices)
    assert h.nvml.take_errors() == {}


def test_whole_hopper_gpus_get_sm_activity_beside_the_buffer_utilization(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.set_load(0, 50.0)
    interval = h.interval()
    wire = h.reading(interval, interval.gpus[0].uuid)
    assert wire["util_source"] == "nvml.samples" and wire["util"] == 50.0
    assert wire["gr_active"] == 50.0 and 0 < float(wire["sm_active"]) <= 50.0  # type: ignore[arg-type]


def test_ampere_slices_report_no_utilization_never_zero(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    interval = h.interval()
    for s in interval.gpus[0].slices:
        wire = h.reading(interval, s.uuid)
        assert "util" not in wire and wire["util_source"] == "none"
        assert "mem_used_mib" in wire and "procs" in wire
        assert s.util_unavailable_reason == AMPERE_MIG_REASON
    assert h.lib.calls["nvmlGpmSampleGet"] == 0


def test_a_gpm_failure_on_one_gpu_leaves_the_others(host: Callable[[str], Host]) -> None:
    h = host("p5-mig")
    h.interval()
    h.lib.fail("nvmlGpmMigSampleGet", pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    interval = h.interval()
    assert all("util" not in h.reading(interval, s.uuid) for s in interval.gpus[1].slices)
    assert all(s.util_unavailable_reason == "unknown" for s in interval.gpus[1].slices)
    assert all(h.reading(interval, s.uuid)["util_source"] == "nvml.gpm" for s in interval.gpus[2].slices)
    assert h.nvml.take_errors()["nvmlGpmMigSampleGet:unknown"] == 3
    h.lib.clear_failures()
    h.interval()  # the failed instances take a fresh baseline
    recovered = h.interval()
    assert all(h.reading(recovered, s.uuid)["util_source"] == "nvml.gpm" for s in recovered.gpus[1].slices)


def test_gpm_samples_are_reused_not_leaked(host: Callable[[str], Host]) -> None:
    h = host("p5-mig")
    for _ in range(5):
        h.interval()
    allocated = h.lib.calls["nvmlGpmSampleAlloc"]
    for _ in range(5):
        h.interval()
    assert h.lib.calls["nvmlGpmSampleAlloc"] == allocated
    h.collector.close()
    assert h.lib.calls["nvmlGpmSampleFree"] == allocated
