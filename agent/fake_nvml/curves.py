"""How simulated work behaves over time: load shapes and the utilization curve of one compute unit.

Everything here is a pure function of clock time, a key and the scenario's epoch, so a test that drives a fake
clock gets the same answers on every run, and `integral` gives the exact mean over any span.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
import zlib
from dataclasses import dataclass

_U64 = (1 << 64) - 1

# Utilization wobble around a job's level: two sinusoids with relative amplitudes A1 and A2, so a level of at
# most 90 % never leaves 0-100 and the integral over time stays in closed form.
_A1 = 0.07
_A2 = 0.03

IDLE, STEADY, JOBS, OFFICE = 0, 1, 2, 3
HOUR = 3600.0


def mix(x: int) -> int:
    """A 64-bit integer hash (splitmix64 finaliser): the fake's only source of randomness."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def rand(key: int, n: int) -> float:
    """The n-th uniform number in [0, 1) of the stream `key`."""
    return mix(key ^ mix(n & _U64)) / 2.0**64


def key_of(*parts: object) -> int:
    return mix(zlib.crc32("/".join(map(str, parts)).encode()))


def uuid_of(key: int) -> str:
    return str(uuid.UUID(int=(mix(key) << 64) | mix(key ^ 0x5555), version=4))


@dataclass(frozen=True, slots=True)
class Load:
    """How a compute unit's utilization behaves: idle, steady at `level` %, jobs that start and stop, or work in
    office hours. With `until_s`, all work (and the unit's processes) ends that many seconds after the epoch."""

    kind: int
    level: float = 0.0
    lo: float = 0.0
    hi: float = 0.0
    p_on: float = 0.0
    seg_s: float = 300.0
    utc_offset_h: int = 0  # office hours: the team's time zone
    until_s: float | None = None


NO_LOAD = Load(IDLE)


def steady(level: float) -> Load:
    return Load(STEADY, level=level)


def jobs(lo: float, hi: float, p_on: float, seg_s: float = 300.0) -> Load:
    """Segments of `seg_s` seconds, each busy with probability `p_on` at a level drawn from [lo, hi]."""
    return Load(JOBS, lo=lo, hi=hi, p_on=p_on, seg_s=seg_s)


def office(lo: float, hi: float, utc_offset_h: int) -> Load:
    """Busy at a level drawn from [lo, hi] for each hour of the working day (weekdays, starting at 8, 9 or 10 and
    ending at 18, 19 or 20 local time, the same for every unit), idle otherwise; the unit's processes run only
    while it works. Reads the clock as UTC epoch seconds."""
    return Load(OFFICE, lo=lo, hi=hi, seg_s=HOUR, utc_offset_h=utc_offset_h)


def ending(load: Load, until_s: float) -> Load:
    """`load` until `until_s` seconds after the epoch (negative: before it); idle, with no process, after."""
    return dataclasses.replace(load, until_s=until_s)


def working_hour(local_hour: int) -> bool:
    """Whether a local hour (counted from 1970-01-01 00:00, a Thursday) is in office hours: weekdays, from 8, 9 or
    10 to 18, 19 or 20 o'clock, varying by day."""
    day, hour = divmod(local_hour, 24)
    if (day + 3) % 7 >= 5:
        return False
    return 8 + mix(2 * day) % 3 <= hour < 18 + mix(2 * day + 1) % 3


class Curve:
    """Utilization of one compute unit (a whole GPU or a MIG compute instance) over clock time, in percent."""

    __slots__ = (
        "_seg",
        "_seg_level",
        "f_dram",
        "f_mem",
        "f_occ",
        "f_sm",
        "f_tensor",
        "hi",
        "key",
        "kind",
        "level",
        "lo",
        "p1",
        "p2",
        "p_on",
        "seg_off",
        "seg_s",
        "steps",
        "until",
        "w1",
        "w2",
    )

    def __init__(self, load: Load, key: int, epoch: float) -> None:
        self.kind = load.kind
        self.level = load.level
        self.lo = load.lo
        self.hi = load.hi
        self.p_on = load.p_on
        self.seg_s = load.seg_s
        self.key = key
        self.until = None if load.until_s is None else epoch + load.until_s
        # Office hours count whole local hours; other work starts and stops at its own phase.
        self.seg_off = load.utc_offset_h * HOUR if load.kind == OFFICE else rand(key, 1) * load.seg_s
        self.w1 = 2 * math.pi / (60.0 + 120.0 * rand(key, 2))
        self.p1 = 2 * math.pi * rand(key, 3)
        self.w2 = 2 * math.pi / (7.0 + 11.0 * rand(key, 4))
        self.p2 = 2 * math.pi * rand(key, 5)
        # How the other activity figures relate to utilization, per unit so that slices differ.
        self.f_sm = 0.85 + 0.13 * rand(key, 6)
        self.f_occ = 0.30 + 0.35 * rand(key, 7)
        self.f_tensor = 0.10 + 0.60 * rand(key, 8)
        self.f_dram = 0.15 + 0.45 * rand(key, 9)
        self.f_mem = 0.20 + 0.45 * rand(key, 10)
        # Pinned levels set by tests: (from clock time, percent), oldest first; before the first, the curve.
        self.steps: list[tuple[float, float]] = []
        self._seg: int | None = None
        self._seg_level = 0.0

    def _level_of(self, seg: int) -> float:
        if self.kind == OFFICE:
            if not working_hour(seg):
                return 0.0
        elif rand(self.key ^ 0xA5A5A5A5, 2 * seg) >= self.p_on:
            return 0.0
        return self.lo + (self.hi - self.lo) * rand(self.key ^ 0xA5A5A5A5, 2 * seg + 1)

    def working(self, t: float) -> bool:
        """Whether the unit's processes exist at clock time `t`: not after `until`, nor outside office hours."""
        if self.until is not None and t >= self.until:
            return False
        return self.kind != OFFICE or working_hour(math.floor((t + self.seg_off) / self.seg_s))

    def pin(self, level: float | None, since: float | None = None) -> None:
        """Hold utilization at `level` % from clock time `since` on (None: for all time); `level` None with no
        `since` lets the curve move again."""
        if since is None:
            self.steps = [] if level is None else [(-math.inf, level)]
            return
        if level is None:
            raise ValueError("a pinned level from a given time needs a level")
        self.steps = [step for step in self.steps if step[0] < since] + [(since, level)]

    def at(self, t: float) -> float:
        """Utilization at clock time `t` (s), percent."""
        for since, level in reversed(self.steps):
            if t >= since:
                return level
        if self.kind == IDLE or (self.until is not None and t >= self.until):
            return 0.0
        if self.kind == STEADY:
            level = self.level
        else:
            seg = math.floor((t + self.seg_off) / self.seg_s)
            if seg != self._seg:
                self._seg, self._seg_level = seg, self._level_of(seg)
            level = self._seg_level
            if level == 0.0:
                return 0.0
        return level * (1.0 + _A1 * math.sin(self.w1 * t + self.p1) + _A2 * math.sin(self.w2 * t + self.p2))

    def _wobble(self, level: float, a: float, b: float) -> float:
        w1, w2, p1, p2 = self.w1, self.w2, self.p1, self.p2
        swing = _A1 * (math.cos(w1 * a + p1) - math.cos(w1 * b + p1)) / w1
        swing += _A2 * (math.cos(w2 * a + p2) - math.cos(w2 * b + p2)) / w2
        return level * ((b - a) + swing)

    def integral(self, t1: float, t2: float) -> float:
        """Integral of utilization over [t1, t2], percent-seconds."""
        if not self.steps:
            return self._free_integral(t1, t2)
        total = self._free_integral(t1, min(t2, self.steps[0][0]))
        for k, (since, level) in enumerate(self.steps):
            end = self.steps[k + 1][0] if k + 1 < len(self.steps) else math.inf
            total += level * max(0.0, min(t2, end) - max(t1, since))
        return total

    def _free_integral(self, t1: float, t2: float) -> float:
        if self.until is not None:
            t2 = min(t2, self.until)
        if t2 <= t1 or self.kind == IDLE:
            return 0.0
        if self.kind == STEADY:
            return self._wobble(self.level, t1, t2)
        total, a = 0.0, t1
        seg = math.floor((a + self.seg_off) / self.seg_s)
        while a < t2:
            end = min(t2, (seg + 1) * self.seg_s - self.seg_off)
            level = self._level_of(seg)
            if level and end > a:
                total += self._wobble(level, a, end)
            a = max(a, end)
            seg += 1
        return total
