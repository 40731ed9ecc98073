from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from agent.collect import Collector
from agent.collect.power import PowerSource

from .conftest import Host


def test_intervals_are_back_to_back(host: Callable[[str], Host]) -> None:
    h = host("p5")
    walls = iter(datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=10 * i) for i in range(10))
    h.collector.wall_clock = lambda: next(walls)
    first = h.interval(10.0)
    second = h.interval(12.5)
    assert first.start + timedelta(seconds=10) == second.start
    assert (first.duration_s, second.duration_s) == (10.0, 12.5)


def test_every_device_has_one_reading_per_interval(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    interval = h.interval()
    devices = [g.uuid for g in interval.gpus] + [s.uuid for g in interval.gpus for s in g.slices]
    assert sorted(r.uuid for r in interval.readings) == sorted(devices)


def test_a_crashing_source_costs_its_own_figures_only(
    host: Callable[[str], Host], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    h = host("p5")
    h.interval()

    def broken(self: PowerSource, gpu: object, readings: object, elapsed_s: float) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(PowerSource, "read", broken)
    interval = h.interval()
    h.interval()
    assert all("power_w" not in h.reading(interval, g.uuid) for g in interval.gpus)
    assert all(h.reading(interval, g.uuid)["util_source"] in ("nvml.samples", "nvml.rate") for g in interval.gpus)
    assert h.nvml.take_errors() == {"power:exception": 16}
    assert sum("source power failed" in r.message for r in caplog.records) == 8, "logged once per GPU"


def test_collect_before_start_is_a_programming_error(host: Callable[[str], Host]) -> None:
    h = host("p5")
    with pytest.raises(RuntimeError):
        Collector(h.nvml).collect()


def test_an_unchanged_gpu_is_described_by_the_same_object_and_a_changed_one_anew(
    host: Callable[[str], Host],
) -> None:
    h = host("p4d-mig")
    first = h.interval().gpus
    second = h.interval().gpus
    assert all(a is b for a, b in zip(first, second, strict=True)), "nothing changed: the same descriptions"
    gpu = next(g for g in first if g.slices)
    gi = gpu.slices[0].gpu_instance_id
    h.lib.destroy_gpu_instance(gpu.index, gi)
    third = h.interval().gpus
    changed = next(g for g in third if g.uuid == gpu.uuid)
    assert changed is not gpu
    assert gi not in {s.gpu_instance_id for s in changed.slices}
    assert changed.unpartitioned_slices is not None and changed.unpartitioned_slices > (gpu.unpartitioned_slices or 0)
    assert all(a is b for a, b in zip(first, third, strict=True) if a.uuid != gpu.uuid)
