"""The samples of the synthetic fleet of bench/fleet.py: when each instance sends (spot gaps, instances gone),
what each device does in each hour (its workload), and the noisy per-interval figures, as sample rows that
`app.store.samples.write_samples` takes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench.fleet import (
    BATCH_INTERVALS,
    DAY,
    DAYNIGHT,
    HELD,
    HOUR,
    IDLE,
    INFERENCE,
    SRC_GPM,
    SRC_NONE,
    SRC_SAMPLES,
    TRAINING,
    Family,
    Fleet,
    InstanceSpec,
    frac,
    mix,
)

if TYPE_CHECKING:
    from app.store.samples import StageRow


# ----------------------------------------------------------------------------------------------------------------
# Time: offline gaps of spot instances, working hours

GAP_BLOCK = 12 * HOUR


def gaps(inst: InstanceSpec, t0: int, t1: int) -> list[tuple[int, int]]:
    """Spans in [t0, t1) where the instance sent nothing: spot gaps of 1-6 h, and everything after it is gone."""
    out: list[tuple[int, int]] = []
    if inst.lifecycle == "spot":
        for block in range(t0 // GAP_BLOCK - 1, t1 // GAP_BLOCK + 1):
            h = mix(inst.key, block, 7)
            if h % 100 >= 10:
                continue
            a = block * GAP_BLOCK + int(frac(h, 1) * GAP_BLOCK)
            b = a + HOUR + int(frac(h, 2) * 5 * HOUR)
            if a < t1 and b > t0:
                out.append((max(a, t0), min(b, t1)))
    if inst.gone_at is not None and inst.gone_at < t1:
        out.append((max(inst.gone_at, t0), t1))
    return out


def last_seen(inst: InstanceSpec, end: int, interval_s: int) -> int:
    """End of the instance's last interval before `end`."""
    t = end if inst.gone_at is None else min(end, inst.gone_at)
    off = gaps(inst, t - 2 * GAP_BLOCK, t)
    while any(a <= t - interval_s < b for a, b in off):
        t -= interval_s
    return t


def _working(t: int, offset_h: int) -> bool:
    local = t + offset_h * HOUR
    weekday = (local // DAY + 3) % 7  # 1970-01-01 was a Thursday
    return weekday < 5 and 9 <= local % DAY // HOUR < 19


# A device's hour: utilization level (0: nothing), memory used MiB, processes.
Hour = tuple[int, int, int]


def device_hour(pattern: str, key: int, hour: int, offset_h: int, memory_mib: int) -> Hour:
    t = hour * HOUR
    if pattern == IDLE:
        return 0, 0, 0
    if pattern == HELD:
        return 0, int(memory_mib * (0.2 + 0.6 * frac(key, hour // 24, 1))), 1
    if pattern == TRAINING:
        if mix(key, hour, 2) % 100 < 8:  # between jobs
            return 0, 0, 0
        return 85 + mix(key, hour, 3) % 13, int(memory_mib * (0.6 + 0.35 * frac(key, hour // 6, 4))), 1
    if pattern == DAYNIGHT:
        if not _working(t, offset_h):
            return 0, 0, 0
        return 40 + mix(key, hour, 5) % 55, int(memory_mib * (0.4 + 0.5 * frac(key, hour // 24, 6))), 1
    if pattern == INFERENCE:
        local_h = (t // HOUR + offset_h) % 24
        daytime = 1.0 - abs(local_h - 14) / 12.0
        level = 8 + int(45 * daytime) + mix(key, hour, 7) % 10
        return level, int(memory_mib * (0.3 + 0.4 * frac(key, 8))), 1 + (mix(key, 9) % 4 == 0)
    # JOBS
    if mix(key, hour, 10) % 100 < 45:
        return 40 + mix(key, hour, 11) % 56, int(memory_mib * (0.3 + 0.6 * frac(key, hour, 12))), 1
    return 0, 0, 0


# ----------------------------------------------------------------------------------------------------------------
# Per-interval figures: pools of noisy values per (family, kind, level), picked by the interval's place

POOL = 128
# (util, sm_active, power W, temp C, gr_active, SM clock MHz)
Figures = tuple[float | None, float | None, int | None, int | None, float | None, int | None]
_pools: dict[tuple[str, str, int], list[Figures]] = {}


def _util(rng: random.Random, level: int) -> float:
    if level == 0:
        return float(rng.choice((0, 0, 0, 0, 0, 0, 1, 2)))
    return round(min(100.0, max(0.0, rng.gauss(level, 5.0))), 1)


def pool(family: Family, kind: str, level: int) -> list[Figures]:
    """Noisy figures around a utilization level for a whole GPU ("gpu"), a MIG GPU ("parent") or a slice."""
    found = _pools.get((family.name, kind, level))
    if found is not None:
        return found
    rng = random.Random(f"{family.name}/{kind}/{level}")
    made: list[Figures] = []
    for _ in range(POOL):
        util = _util(rng, level)
        busy = util / 100.0
        gr = round(util * rng.uniform(0.85, 0.97), 1) if family.gpm else None
        sm = round(util * rng.uniform(0.55, 0.85), 1) if family.gpm else None
        if kind == "slice":
            made.append((util, sm, None, None, gr, None))
            continue
        power = round(family.idle_w + (family.max_w - family.idle_w) * busy * rng.uniform(0.85, 1.0))
        temp = round(31 + 45 * busy + rng.uniform(-2.0, 2.0))
        clock = family.busy_clock if util > 2 else family.idle_clock
        if kind == "parent":
            # NVML gives no whole-GPU utilization in MIG mode; on Hopper GPM gives it.
            made.append((gr, sm, power, temp, gr, clock) if family.gpm else (None, None, power, temp, None, clock))
        else:
            made.append((util, sm, power, temp, gr, clock))
    _pools[(family.name, kind, level)] = made
    return made


# The fields of a sample row after (ts, device id, interval length), for a device whose figures never change.
Tail = tuple[
    int | None,
    float | None,
    float | None,
    int | None,
    int | None,
    int | None,
    int,
    float | None,
    int | None,
    int | None,
    int | None,
]
# One device's hour, ready to emit rows: (device id, memory, processes, process memory, util source, ECC count,
# figures pool or None, pool offset, constant tail or None).
Plan = tuple[int, int, int, int, int, int | None, list[Figures] | None, int, Tail | None]


@dataclass
class SampleMaker:
    """Sample rows of a fleet whose devices have the given ids (UUID -> device id)."""

    fleet: Fleet
    device_ids: dict[str, int]
    _datetimes: dict[int, datetime] = field(default_factory=dict)

    def rows(self, t0: int, t1: int) -> list[StageRow]:
        """Every sample of intervals starting in [t0, t1), in the order agents' batches would store them."""
        out: list[StageRow] = []
        step = self.fleet.interval_s
        t = t0 + (self.fleet.start - t0) % step
        while t < t1:
            hour_end = min(t1, (t // HOUR + 1) * HOUR)
            self._hour(t, hour_end, out.append)
            t = hour_end + (self.fleet.start - hour_end) % step
        return out

    def _hour(self, t0: int, t1: int, append: Callable[[StageRow], None]) -> None:
        fleet = self.fleet
        step = fleet.interval_s
        hour = t0 // HOUR
        times = list(range(t0, t1, step))
        stamps = [datetime.fromtimestamp(t, UTC) for t in times]
        first_slot = (t0 - hour * HOUR) // step  # the interval's place in its hour picks the figures
        dur = float(step)
        plans: list[tuple[list[bool] | None, list[Plan]]] = []
        for inst in fleet.instances:
            if inst.gone_at is not None and inst.gone_at <= t0:
                continue
            off = gaps(inst, t0, t1)
            online = None
            if off:
                online = [not any(a <= t < b for a, b in off) for t in times]
                if not any(online):
                    continue
            plans.append((online, self._plans(inst, hour, t0)))
        n = len(times)
        for b0 in range(0, n, BATCH_INTERVALS):
            b1 = min(n, b0 + BATCH_INTERVALS)
            for online, devs in plans:
                for i in range(b0, b1):
                    if online is not None and not online[i]:
                        continue
                    ts = stamps[i]
                    slot = first_slot + i
                    for dev, mem, procs, pmem, src, ecc, figs, offset, tail in devs:
                        if tail is not None:
                            append((ts, dev, dur, *tail))
                        elif figs is not None:
                            u, sm, pw, tc, gr, clk = figs[(slot + offset) % POOL]
                            append((ts, dev, dur, mem, u, sm, pw, tc, procs, src, gr, ecc, pmem, clk))

    def _plans(self, inst: InstanceSpec, hour: int, t0: int) -> list[Plan]:
        ids = self.device_ids
        plans: list[Plan] = []
        for g in inst.gpus:
            fam = g.family
            if not g.mig:
                level, mem, procs = device_hour(g.pattern, g.key, hour, inst.utc_offset_h, fam.memory_mib)
                figs = pool(fam, "gpu", level)
                pmem = int(mem * 0.97) if procs else 0
                offset = mix(g.key, hour) % POOL
                plans.append((ids[g.uuid], mem, procs, pmem, SRC_SAMPLES, 0, figs, offset, None))
                continue
            total_level = 0
            total_mem = total_procs = total_pmem = 0
            slice_plans: list[Plan] = []
            for s in g.layout(t0):
                level, mem, procs = device_hour(s.pattern, s.key, hour, inst.utc_offset_h, s.memory_mib)
                pmem = int(mem * 0.97) if procs else 0
                total_level += level * s.compute_slices
                total_mem += mem
                total_procs += procs
                total_pmem += pmem
                if fam.gpm:
                    offset = mix(s.key, hour) % POOL
                    figs = pool(fam, "slice", level)
                    slice_plans.append((ids[s.uuid], mem, procs, pmem, SRC_GPM, None, figs, offset, None))
                else:
                    tail: Tail = (mem, None, None, None, None, procs, SRC_NONE, None, None, pmem, None)
                    slice_plans.append((ids[s.uuid], mem, procs, pmem, SRC_NONE, None, None, 0, tail))
            figs = pool(fam, "parent", round(total_level / 7))
            src = SRC_GPM if fam.gpm else SRC_NONE
            offset = mix(g.key, hour) % POOL
            plans.append((ids[g.uuid], total_mem, total_procs, total_pmem, src, 0, figs, offset, None))
            plans.extend(slice_plans)
        return plans
