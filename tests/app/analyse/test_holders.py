"""Waste split among the processes that held each device: known answers by user, process, container, namespace, pod
and Slurm job, alone and with other groupings, adding up to the same totals as every other grouping."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.figures import Figures
from app.analyse.holders import NO_HOLDER, HeldUsage, HolderInfo, split_units
from app.analyse.waste import WasteAnalysis
from app.billing.prices import remake_billed_prices
from app.db import session_scope
from tests.app.analyse.conftest import P4D_PER_GPU_HOUR, Analyst, Feeder
from tests.app.analyse.test_priced import bill
from tests.feeding import G5_PER_GPU_HOUR, holders_story


@pytest.fixture
def held_fleet(feeder: Feeder) -> dict[str, datetime]:
    return holders_story(feeder)


def _analysis(analyst: Analyst, fleet: dict[str, datetime]) -> WasteAnalysis:
    return analyst.waste(fleet["start"], fleet["end"], by_holder=True)


def _rows(a: WasteAnalysis, *names: str) -> dict[str, Figures]:
    return {r.label: r.figures for r in a.group_by(list(names))}


def test_by_user_known_answers(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    rows = _rows(_analysis(analyst, held_fleet), "user")
    assert set(rows) == {"ana", "root", "mchen", NO_HOLDER}
    ana = rows["ana"]
    # An hour alone and idle, then half of an hour at 60%.
    assert ana.gpu_hours == pytest.approx(1.5)
    assert ana.idle_held_h == pytest.approx(1.0)
    assert ana.active_h == pytest.approx(0.5)
    assert ana.avg_util == pytest.approx(20.0)
    assert ana.idle_held_cost == pytest.approx(P4D_PER_GPU_HOUR, rel=1e-6)
    assert ana.idle_h == 0.0
    root = rows["root"]
    assert (root.gpu_hours, root.active_h, root.idle_held_h) == pytest.approx((0.5, 0.5, 0.0))
    assert root.avg_util == pytest.approx(60.0)
    mchen = rows["mchen"]
    assert mchen.cost == pytest.approx(2 * G5_PER_GPU_HOUR, rel=1e-6)
    assert mchen.avg_util == pytest.approx(40.0)
    # Nobody held GPU 1: its idle time and money are nobody's.
    nobody = rows[NO_HOLDER]
    assert (nobody.gpu_hours, nobody.idle_h) == pytest.approx((2.0, 2.0))
    assert nobody.idle_cost == pytest.approx(2 * P4D_PER_GPU_HOUR, rel=1e-6)
    assert nobody.idle_held_h == 0.0


def test_every_holder_grouping_adds_up_to_the_totals(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    a = _analysis(analyst, held_fleet)
    by_instance = a.group_by(["instance"])
    for name in ("user", "process", "container", "namespace", "pod", "job"):
        rows = a.group_by([name])
        for field in ("gpu_hours", "cost", "idle_held_cost", "idle_cost", "active_h", "util_sum_h", "offline_h"):
            total = sum(getattr(r.figures, field) for r in rows)
            assert total == pytest.approx(getattr(a.totals, field), rel=1e-9, abs=1e-9), (name, field)
            assert total == pytest.approx(sum(getattr(r.figures, field) for r in by_instance), abs=1e-9)


def test_a_part_per_value_is_a_part_per_process_added_up(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    """A grouping by holder reads one part per device and value (per user, say), not per process: the same rows."""
    every = _analysis(analyst, held_fleet)
    for name in ("user", "process", "container", "namespace", "pod", "job"):
        grouped = analyst.waste(held_fleet["start"], held_fleet["end"], by_holder=True, holder_groups=[name, "gpu"])
        assert _figures(grouped, name, "gpu") == pytest.approx(_figures(every, name, "gpu")), name


@pytest.mark.parametrize("other", [None, "instance_type", "instance"])
def test_a_value_per_instance_is_a_part_per_process_added_up(
    analyst: Analyst, held_fleet: dict[str, datetime], other: str | None
) -> None:
    """One grouping by holder, alone or with groupings by something of the instance, reads what each value held per
    instance (the holder group rollups) and adds up to the same rows as the units split process by process."""
    every = _analysis(analyst, held_fleet)
    for name in ("user", "process", "container", "namespace", "pod", "job"):
        names = [name] if other is None else [other, name]
        fast = analyst.waste(held_fleet["start"], held_fleet["end"], by_holder=True, holder_groups=names)
        assert fast.values is not None and fast.parts is None
        assert _figures(fast, *names) == pytest.approx(_figures(every, *names)), names


def _figures(a: WasteAnalysis, *names: str) -> dict[str, float]:
    return {
        f"{r.label} {field}": getattr(r.figures, field)
        for r in a.group_by(list(names))
        for field in ("gpu_hours", "active_h", "idle_held_h", "idle_h", "util_sum_h", "cost", "idle_held_cost")
    }


def test_labels_of_each_holder_grouping(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    a = _analysis(analyst, held_fleet)
    assert set(_rows(a, "process")) == {"python3", "vllm", "python", NO_HOLDER}
    assert set(_rows(a, "container")) == {"c0ffeec0ffee", "(no container)", NO_HOLDER}
    assert set(_rows(a, "namespace")) == {"inference", "(no namespace)", NO_HOLDER}
    assert set(_rows(a, "pod")) == {"inference/vllm-0", "(no pod)", NO_HOLDER}
    jobs = _rows(a, "job")
    assert set(jobs) == {"48213", "(no job)", NO_HOLDER}
    assert jobs["48213"].gpu_hours == pytest.approx(2.0)
    assert jobs["(no job)"].gpu_hours == pytest.approx(2.0)  # ana's 1.5 and root's 0.5


def test_holder_grouping_combines_with_others(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    rows = _rows(_analysis(analyst, held_fleet), "namespace", "instance_type")
    assert set(rows) == {
        "inference / p4d.24xlarge",
        "(no namespace) / p4d.24xlarge",
        "(no namespace) / g5.xlarge",
        f"{NO_HOLDER} / p4d.24xlarge",
    }
    assert rows["(no namespace) / p4d.24xlarge"].gpu_hours == pytest.approx(1.5)
    by_gpu = _rows(_analysis(analyst, held_fleet), "gpu", "user")
    [(ana_gpu, ana)] = [(k, f) for k, f in by_gpu.items() if k.endswith(" / ana")]
    assert ana_gpu.endswith("GPU 0 / ana") and ana.idle_held_h == pytest.approx(1.0)
    assert sum(k.endswith(f"GPU 1 / {NO_HOLDER}") for k in by_gpu) == 1


def test_grouping_by_holder_needs_the_split(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    a = analyst.waste(held_fleet["start"], held_fleet["end"])
    with pytest.raises(ValueError, match=r"holder|held"):
        a.group_by(["user"])


def test_holders_claiming_more_than_the_unit_are_scaled_down(analyst: Analyst, held_fleet: dict[str, datetime]) -> None:
    """A GPU whose MIG mode changed in the window: its unit holds only its passthrough time, while its holders'
    seconds may cover more. Rows written before holder rollups had utilization count their idle-held seconds as
    known."""
    unit = next(u for u in _analysis(analyst, held_fleet).units if u.gpu.uuid == "GPU-g5")
    covered = unit.covered_s
    seen = held_fleet["start"]
    holder = HolderInfo(1, 1, 10, "python", 1, "old", None, None, None, None, None, None, seen, seen)
    held = {unit.gpu.pk: [HeldUsage(unit.gpu.pk, 1, 2 * covered, 0.0, 0.0, covered, 0.0, 0.0)]}
    [part] = split_units([unit], held, {1: holder})
    assert part.figures.gpu_hours == pytest.approx(unit.figures().gpu_hours)
    assert part.figures.idle_held_h == pytest.approx(unit.figures().gpu_hours / 2)
    assert part.figures.unknown_h == pytest.approx(unit.figures().gpu_hours / 2)
    assert part.figures.active_h == 0.0


def test_holders_pay_the_price_of_each_hour_they_held(
    analyst: Analyst, held_fleet: dict[str, datetime], sessions: sessionmaker[Session]
) -> None:
    """The p4d billed $16/h in the hour ana's notebook held GPU 0 idle, $32/h in the hour ana and bob's pod shared it:
    each holder pays the hours it held at their price, whatever grouping goes with it."""
    start = held_fleet["start"]
    with session_scope(sessions) as s:
        bill(s, "i-p4d", "p4d.24xlarge", {start: 16.0, start + timedelta(hours=1): 32.0}, None)
        remake_billed_prices(s)
    for names in (["user"], ["instance_type", "user"]):
        a = analyst.waste(start, held_fleet["end"], by_holder=True, holder_groups=names)
        assert a.values is not None
        rows = {r.label.split(" / ")[-1]: r for r in a.group_by(names) if "g5" not in r.label}
        ana, root, nobody = rows["ana"].figures, rows["root"].figures, rows[NO_HOLDER].figures
        assert ana.idle_held_cost == pytest.approx(16 / 8)
        assert ana.cost == pytest.approx(16 / 8 + 0.5 * 32 / 8)
        assert root.cost == pytest.approx(0.5 * 32 / 8)
        assert nobody.idle_cost == pytest.approx(16 / 8 + 32 / 8)  # GPU 1, idle both hours
        assert rows["ana"].source_shares == {"billed": 1.0}
        total = sum(r.figures.cost for r in a.group_by(names))
        assert total == pytest.approx(a.totals.cost) and a.totals.cost == pytest.approx(2 * (16 + 32) / 8 + 2 * 1.006)
