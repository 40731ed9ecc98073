from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pynvml
import pytest

from agent.collect import Collector
from agent.collect.utilization import MIG_PARENT_REASON, POLL_S
from agent.fake_nvml import FakeNvml
from agent.fake_nvml.scenarios import scenario
from agent.nvml import Nvml

from .conftest import FakeClock, Host


def test_the_interval_mean_comes_from_the_sample_buffer(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.set_load(0, 40.0)
    h.lib.set_load(1, 0.0)
    interval = h.interval()
    gpus = interval.gpus
    assert h.reading(interval, gpus[0].uuid)["util"] == 40.0
    assert h.reading(interval, gpus[0].uuid)["util_source"] == "nvml.samples"
    assert h.reading(interval, gpus[1].uuid)["util"] == 0.0


def test_time_the_buffer_ran_dry_counts_as_idle(host: Callable[[str], Host]) -> None:
    """Busy at 50 % for the first half, then idle: the driver records nothing while idle, so the samples present
    all say 50 %. Their plain mean (what was reported) is 50 %; over the interval it is 25 %."""
    h = host("p5")
    h.interval()
    t0 = h.clock.t
    h.lib.set_load(0, 50.0, since=t0)
    h.lib.set_load(0, 0.0, since=t0 + 5.0)
    interval = h.interval()
    reading = h.reading(interval, interval.gpus[0].uuid)
    assert reading["util_source"] == "nvml.samples"
    assert reading["util"] == pytest.approx(25.0, abs=1.0)
    assert h.nvml.take_errors() == {}


def test_an_interval_longer_than_the_buffer_averages_all_of_it(host: Callable[[str], Host]) -> None:
    """A minute at 80 % for 10 s then 20 %: the buffer holds about 16 s, so reading it only at the end gave the
    last 16 s (20 %). Polled every few seconds, the whole minute counts: 30 %."""
    h = host("p5")
    h.interval()
    t0 = h.clock.t
    h.lib.set_load(1, 80.0, since=t0)
    h.lib.set_load(1, 20.0, since=t0 + 10.0)
    interval = h.interval(60.0, poll_s=POLL_S)
    assert h.reading(interval, interval.gpus[1].uuid)["util"] == pytest.approx(30.0, abs=0.5)
    assert h.nvml.take_errors() == {}


def test_a_wrapped_buffer_is_counted_and_only_the_time_it_holds_is_averaged(host: Callable[[str], Host]) -> None:
    """An agent stalled past the buffer's length (no poll for a minute) lost samples: the lost time is not called
    idle; the mean is over what the buffer still held, and the loss is reported."""
    h = host("p5")
    h.interval()
    t0 = h.clock.t
    h.lib.set_load(1, 80.0, since=t0)
    h.lib.set_load(1, 20.0, since=t0 + 10.0)
    interval = h.interval(60.0, poll_s=60.0)
    assert h.reading(interval, interval.gpus[1].uuid)["util"] == pytest.approx(20.0, abs=0.5)
    assert h.nvml.take_errors()["nvmlDeviceGetSamples:overrun"] >= 1


@pytest.mark.parametrize("seconds", [10.0, 60.0])
def test_hours_of_a_mostly_idle_gpu_match_the_truth(host: Callable[[str], Host], seconds: float) -> None:
    """g5-idle works in short bursts; with the buffer dry in between, the mean of the samples present overstated
    every interval that a burst began or ended in."""
    h = host("g5-idle")
    h.interval()
    start = h.clock.t
    busy_s = 0.0
    for _ in range(int(4 * 3600 / seconds)):
        interval = h.interval(seconds)
        reading = interval.readings[0]
        assert reading.util is not None
        busy_s += reading.util * interval.duration_s
    truth = h.lib.truth(start, h.clock.t)[interval.gpus[0].uuid].util
    assert 0.5 < truth < 10
    assert busy_s / (h.clock.t - start) == pytest.approx(truth, rel=0.05)


def test_the_sample_period_is_learnt_so_a_slower_buffer_is_not_read_as_idle() -> None:
    """Products sample between 6 times a second and once a second (nvml.h): a GPU busy at 60 % with one sample a
    second is 60 %, not a sixth of it."""
    clock = FakeClock()
    spec = dataclasses.replace(scenario("p5"), sample_period_us=1_000_000)
    lib = FakeNvml(spec, "p5", clock, 0)
    lib.set_load(2, 60.0)
    collector = Collector(Nvml.open(lib), clock=clock)
    collector.start()
    for _ in range(3):
        clock.advance(5.0)
        collector.poll()
    interval = collector.collect()
    [reading] = [r for r in interval.readings if r.uuid == interval.gpus[2].uuid]
    assert reading.util == pytest.approx(60.0, abs=0.5)


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
    assert h.lib.calls["nvmlDeviceGetUtilizationRates"] <= sum(not g.mig_mode for g in interval.gpus)


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
    for g in range(8):
        h.lib.set_load(g, 30.0)
    h.interval()
    h.lib.fail("nvmlDeviceGetSamples", error, gpu=2)
    h.lib.fail("nvmlDeviceGetUtilizationRates", error, gpu=2)
    interval = h.interval()
    broken = interval.gpus[2]
    assert "util" not in h.reading(interval, broken.uuid)
    assert broken.util_unavailable_reason is not None and reason in broken.util_unavailable_reason
    others = [h.reading(interval, g.uuid) for g in interval.gpus if g is not broken]
    assert all(r["util_source"] == "nvml.samples" for r in others)
    assert h.nvml.take_errors()[f"nvmlDeviceGetSamples:{reason}"] >= 1


def test_not_supported_is_asked_once_then_remembered(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    h.interval()
    asked = h.lib.calls["nvmlDeviceGetSamples"]
    interval = h.interval()
    assert h.lib.calls["nvmlDeviceGetSamples"] == asked + 7 * 2  # the seven other GPUs: one poll, one read
    assert h.reading(interval, interval.gpus[1].uuid)["util_source"] == "nvml.rate"


def test_the_first_samples_after_an_idle_start_count(host: Callable[[str], Host]) -> None:
    """A GPU idle when the agent starts has an empty buffer: whatever arrives next belongs to the interval."""
    h = host("p5")
    h.lib.set_load(6, 0.0)
    h.interval()
    t0 = h.clock.t
    h.lib.set_load(6, 60.0, since=t0 + 1.0)
    interval = h.interval()
    assert h.reading(interval, interval.gpus[6].uuid)["util"] == pytest.approx(54.0, abs=1.0)


def test_after_mig_mode_ends_the_buffer_s_old_samples_are_not_this_interval_s(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.interval()
    h.lib.request_mig_mode(0, False)
    h.lib.nvmlShutdown()  # the reset needs every NVML client gone, this collector's included
    h.lib.reset_gpu(0)
    h.lib.nvmlInit()
    h.lib.set_load(0, 30.0)
    first = h.interval()
    assert h.reading(first, first.gpus[0].uuid)["util_source"] == "nvml.rate"
    second = h.interval()
    assert h.reading(second, second.gpus[0].uuid)["util"] == pytest.approx(30.0, abs=0.5)
