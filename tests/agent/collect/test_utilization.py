from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from agent.collect.utilization import MIG_PARENT_REASON

from .conftest import Host


def test_the_interval_mean_comes_from_the_sample_buffer(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.set_load(0, 40.0)
    h.lib.set_load(1, 0.0)
    interval = h.interval()
    gpus = interval.gpus
    assert h.reading(interval, gpus[0].uuid)["util"] == 40.0
    assert h.reading(interval, gpus[0].uuid)["util_source"] == "nvml.samples"
    assert h.reading(interval, gpus[1].uuid)["util"] == 0.0


def test_the_average_covers_the_whole_interval_not_one_reading(host: Callable[[str], Host]) -> None:
    h = host("p5")
    gpu = h.interval().gpus[0].uuid
    h.lib.set_load(0, 20.0)
    h.clock.advance(5)
    h.lib.set_load(0, 60.0)
    h.clock.advance(5)
    interval = h.collector.collect()
    # The pin rewrites history in the fake, so the mean is the latest pin; what matters is the source.
    assert h.reading(interval, gpu)["util_source"] == "nvml.samples"
    assert h.lib.calls["nvmlDeviceGetUtilizationRates"] == 0


def test_an_idle_gpu_s_empty_buffer_falls_back_to_the_rate_without_an_error(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    interval = h.interval()
    idle = interval.gpus[7].uuid  # sample buffer runs dry (NotFound)
    assert h.reading(interval, idle)["util_source"] == "nvml.rate"
    assert h.reading(interval, idle)["util"] == 0.0
    assert h.nvml.take_errors() == {}


def test_a_mig_parent_has_no_utilization_and_says_why(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    interval = h.interval()
    parent = interval.gpus[0]
    assert "util" not in h.reading(interval, parent.uuid)
    assert parent.util_unavailable_reason == MIG_PARENT_REASON
    assert h.lib.calls["nvmlDeviceGetUtilizationRates"] <= 1  # only for the idle non-MIG GPU


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "gpu_lost"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "not_supported"),
    ],
)
def test_a_failing_gpu_loses_its_figure_and_the_others_keep_theirs(
    host: Callable[[str], Host], error: int, reason: str
) -> None:
    h = host("p5")
    h.interval()
    h.lib.fail("nvmlDeviceGetSamples", error, gpu=2)
    h.lib.fail("nvmlDeviceGetUtilizationRates", error, gpu=2)
    interval = h.interval()
    broken = interval.gpus[2]
    assert "util" not in h.reading(interval, broken.uuid)
    assert broken.util_unavailable_reason is not None and reason in broken.util_unavailable_reason
    others = [h.reading(interval, g.uuid) for g in interval.gpus if g is not broken]
    assert all(r["util_source"] == "nvml.samples" for r in others)
    assert h.nvml.take_errors()[f"nvmlDeviceGetSamples:{reason}"] == 1


def test_not_supported_is_asked_once_then_remembered(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    h.interval()
    asked = h.lib.calls["nvmlDeviceGetSamples"]
    interval = h.interval()
    assert h.lib.calls["nvmlDeviceGetSamples"] == asked + 7  # the seven other GPUs
    assert h.reading(interval, interval.gpus[1].uuid)["util_source"] == "nvml.rate"
