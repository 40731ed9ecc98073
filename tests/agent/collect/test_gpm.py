from __future__ import annotations

from collections.abc import Callable

import pynvml

from agent.collect.gpm import AMPERE_MIG_REASON, FIRST_SAMPLE_REASON

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


def test_a_gpu_instance_made_again_under_the_same_id_is_not_diffed_against_the_old_one(
    host: Callable[[str], Host],
) -> None:
    """GPU-instance ids are reused. The new instance's counters start at zero, so a baseline of the old instance
    (same id) gives a wrong figure; baselines follow the instance's MIG device UUIDs instead."""
    h = host("p5-mig")
    gpu = 5  # four 1g.20gb instances, ids 9-12
    h.lib.set_load(gpu, 90.0, slice_index=1)
    h.interval()
    busy = h.interval()
    [old] = [s for s in busy.gpus[gpu].slices if s.gpu_instance_id == 10]
    assert h.reading(busy, old.uuid)["util"] == 90.0

    h.lib.destroy_gpu_instance(gpu, 10)
    assert h.lib.create_gpu_instance(gpu, "2g.20gb", gi_id=10) == 10
    [index] = [i for i, dev in h.lib._gpus[gpu].mig.items() if dev.gi.gi_id == 10]
    h.lib.set_load(gpu, 10.0, slice_index=index)
    remade = h.interval()
    [new] = [s for s in remade.gpus[gpu].slices if s.gpu_instance_id == 10]
    assert (new.profile, new.uuid != old.uuid) == ("2g.20gb", True)
    assert "util" not in h.reading(remade, new.uuid), "a figure from two different instances"
    assert new.util_unavailable_reason == FIRST_SAMPLE_REASON

    settled = h.interval()
    assert h.reading(settled, new.uuid)["util"] == 10.0
    live = {s.gpu_instance_id for s in settled.gpus[gpu].slices}
    assert len(h.collector.gpus[gpu].memo["gpm"]) == len(live) + 1, "baselines of gone instances are dropped"
