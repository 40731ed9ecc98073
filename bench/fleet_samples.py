"""The samples of the synthetic fleet of bench/fleet.py: when each instance sends (spot gaps, instances gone),
what each device does in each hour (its workload), the noisy per-interval figures and the processes holding each
device, as sample rows that `app.store.samples.write_samples` takes and holders and references that
`app.store.holders.store_holders` takes.
"""

from __future__ import annotations

import random
import uuid
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, NamedTuple

from bench.fleet import (
    BATCH_INTERVALS,
    DAY,
    DAYNIGHT,
    HELD,
    HOUR,
    IDLE,
    INFERENCE,
    JOBS,
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
# Holders: the processes on each device, which live for a stretch of hours

MAX_HOLDERS = 3
"""Holders a sample row refers to at most: its `procs`, capped."""
PID_MAX = 4_194_304
"""Linux's largest pid_max: pids are drawn below it."""
STRETCH_HOURS = (3, 4, 6, 8, 12, 24)
"""How long a job's processes live before they restart (new pids and start times), hours; one per scope."""
USERS = (
    "alice", "bob", "carol", "dmitri", "elena", "farid", "grace", "hiro", "ines", "jonas",
    "kavya", "lars", "mei", "nikolai", "olga", "pedro", "qiang", "rosa", "sven", "tariq",
    "uma", "viktor", "wen", "xavier", "yara", "zeno", "amara", "bastian", "chloe", "deniz",
    "emre", "fatima", "gustav", "hana", "ivan", "jia", "kofi", "lucia", "mateo", "noor",
)  # fmt: skip
"""Who runs the jobs; uid 2000 + the place in this list."""
_USER_CUM = list(accumulate(1.0 / (r + 1) ** 1.1 for r in range(len(USERS))))
"""Cumulative weights, Zipf-like: the first five users run about 60 % of the jobs."""
NAMESPACES = ("ml-research", "ml-platform", "inference", "vision", "speech", "llm-train", "eval", "notebooks")
EXECUTABLES: dict[str, tuple[tuple[str, int], ...]] = {
    TRAINING: (("python3", 5), ("torchrun", 2), ("pt_main_thread", 3)),
    INFERENCE: (("vllm", 4), ("python3", 3), ("tritonserver", 2)),
    DAYNIGHT: (("python", 4), ("jupyter-lab", 2), ("python3", 3)),
    JOBS: (("python3", 6), ("torchrun", 2), ("julia", 1)),
    HELD: (("python", 5), ("jupyter-lab", 3), ("python3", 2)),
}
"""Executable names (/proc/<pid>/comm) per workload, weighted."""
POD_APPS = {TRAINING: "trainer", INFERENCE: "vllm-server", DAYNIGHT: "notebook", JOBS: "batch-job", HELD: "notebook"}
KUBERNETES = "kubernetes"
SLURM = "slurm"
PLAIN = "plain"
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


class Proc(NamedTuple):
    """One process as `app.store.holders.HolderRow` describes it, less its slot and instance (and no command
    line: the agent sends none by default)."""

    pid: int
    started_at: datetime
    uid: int
    executable: str
    user_name: str
    container_id: str | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    job_id: str | None
    job_step: str | None


def runs_on(seed: int, inst: InstanceSpec) -> str:
    """How the instance runs its jobs: Kubernetes pods (a third of them), Slurm jobs (a quarter) or plain
    processes."""
    f = frac(seed, inst.key, 40)
    return KUBERNETES if f < 1 / 3 else SLURM if f < 1 / 3 + 1 / 4 else PLAIN


def job_scope(inst: InstanceSpec, device_key: int, pattern: str, mig_slice: bool) -> int:
    """What one job spans: the whole instance for a training or batch GPU doing what its instance does (one
    torchrun or Slurm job over its GPUs), else the device alone. Instance scopes are negative, device keys not."""
    if not mig_slice and pattern == inst.pattern and pattern in (TRAINING, JOBS):
        return -1 - inst.key
    return device_key


def stretch(seed: int, scope: int, hour: int) -> tuple[int, int]:
    """The stretch of `scope` that holds `hour` (hours since 1970): its number and its first hour."""
    length = STRETCH_HOURS[mix(seed, scope, 41) % len(STRETCH_HOURS)]
    phase = mix(seed, scope, 42) % length
    n = (hour + phase) // length
    return n, n * length - phase


def _weighted(h: int, choices: tuple[tuple[str, int], ...]) -> str:
    total = sum(w for _, w in choices)
    pick = h % total
    for name, w in choices:
        if pick < w:
            return name
        pick -= w
    raise AssertionError("unreachable")


def _user(h: int) -> int:
    return min(len(USERS) - 1, bisect_right(_USER_CUM, (h >> 11) / float(1 << 53) * _USER_CUM[-1]))


def processes(
    seed: int, inst: InstanceSpec, kind: str, device_key: int, pattern: str, scope: int, n: int, first_hour: int
) -> tuple[Proc, ...]:
    """The MAX_HOLDERS processes of a device in stretch `n` of its scope (from `first_hour`); a sample refers to
    the first `procs` of them. One job's processes share its user, executable, pod or Slurm job; each device's
    have their own pids."""
    job = mix(seed, scope, n, 43)
    # Half the jobs are the instance's owner's; the rest anyone's.
    who = mix(seed, inst.key, 44) if frac(job, 1) < 0.5 else mix(job, 2)
    user = _user(who)
    executable = _weighted(mix(job, 3), EXECUTABLES[pattern])
    container_id = pod_uid = namespace = pod = job_id = job_step = None
    if kind == KUBERNETES:
        team = inst.tags.get("team", "")
        namespace = team if team in NAMESPACES and frac(job, 4) < 0.7 else NAMESPACES[mix(job, 5) % len(NAMESPACES)]
        suffix = "".join(_BASE36[mix(job, 6, i) % 36] for i in range(4))
        pod = f"{POD_APPS[pattern]}-{mix(job, 7) & 0xFFFF:04x}-{suffix}"
        pod_uid = str(uuid.UUID(int=mix(job, 8) << 64 | mix(job, 9), version=4))
        container_id = "".join(f"{mix(job, 10, i):016x}" for i in range(4))
    elif kind == SLURM:
        job_id = str(1_000_000 + mix(job, 11) % 9_000_000)
        job_step = "batch" if mix(job, 12) % 10 < 3 else "0"
    start = first_hour * HOUR - mix(job, 13) % 600  # started a little before the hour its samples begin
    return tuple(
        Proc(
            1000 + mix(seed, device_key, n, k) % (PID_MAX - 1000),
            datetime.fromtimestamp(start + 2 * k, UTC),
            2000 + user,
            executable,
            USERS[user],
            container_id,
            pod_uid,
            namespace,
            pod,
            job_id,
            job_step,
        )
        for k in range(MAX_HOLDERS)
    )


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
# Holder references of one device's hour: (holders, their slots, the memory each holds MiB, each one's share of
# the row's seconds); every sample row of that hour refers to the same ones.
Held = tuple[int, tuple[int, ...], tuple[int, ...], tuple[float, ...]]
# One device's hour, ready to emit rows: (device id, memory, processes, process memory, util source, ECC count,
# figures pool or None, pool offset, constant tail or None, holder references or None).
Plan = tuple[int, int, int, int, int, int | None, list[Figures] | None, int, Tail | None, Held | None]


@dataclass
class Made:
    """Sample rows of a time range and the holders they refer to: each holder as (slot, instance pk, process),
    slots unique within one Made, and the references column by column, as `app.store.holders.HolderRefs` keeps
    them (`ref_ords` are places in `rows`)."""

    rows: list[StageRow] = field(default_factory=list)
    holders: list[tuple[int, int, Proc]] = field(default_factory=list)
    ref_ords: list[int] = field(default_factory=list)
    ref_slots: list[int] = field(default_factory=list)
    ref_used: list[int | None] = field(default_factory=list)
    ref_shares: list[float] = field(default_factory=list)


@dataclass
class SampleMaker:
    """Sample rows of a fleet whose devices have the given ids (UUID -> device id); with `instance_pks`
    (instance id -> instances.id) also the holders the rows with processes refer to."""

    fleet: Fleet
    device_ids: dict[str, int]
    instance_pks: dict[str, int] | None = None
    _procs: dict[int, tuple[int, tuple[Proc, ...]]] = field(default_factory=dict)
    """Per device key, its processes in the stretch last asked for: (stretch number, processes). A worker makes
    hours roughly in order, so one stretch per device is enough, and a stretch is made once, not every hour."""

    def rows(self, t0: int, t1: int) -> list[StageRow]:
        """Every sample of intervals starting in [t0, t1), in the order agents' batches would store them."""
        return self.make(t0, t1).rows

    def make(self, t0: int, t1: int) -> Made:
        """The rows of `rows`, with their holders when the maker knows the instances' pks."""
        made = Made()
        step = self.fleet.interval_s
        t = t0 + (self.fleet.start - t0) % step
        while t < t1:
            hour_end = min(t1, (t // HOUR + 1) * HOUR)
            self._hour(t, hour_end, made)
            t = hour_end + (self.fleet.start - hour_end) % step
        return made

    def _hour(self, t0: int, t1: int, made: Made) -> None:
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
            plans.append((online, self._plans(inst, hour, t0, made)))
        out = made.rows
        append = out.append
        ords, slots, used, shares = made.ref_ords, made.ref_slots, made.ref_used, made.ref_shares
        n = len(times)
        for b0 in range(0, n, BATCH_INTERVALS):
            b1 = min(n, b0 + BATCH_INTERVALS)
            for online, devs in plans:
                for i in range(b0, b1):
                    if online is not None and not online[i]:
                        continue
                    ts = stamps[i]
                    slot = first_slot + i
                    for dev, mem, procs, pmem, src, ecc, figs, offset, tail, held in devs:
                        if tail is not None:
                            append((ts, dev, dur, *tail))
                        else:
                            assert figs is not None
                            u, sm, pw, tc, gr, clk = figs[(slot + offset) % POOL]
                            append((ts, dev, dur, mem, u, sm, pw, tc, procs, src, gr, ecc, pmem, clk))
                        if held is not None:
                            count, hslots, hused, hshares = held
                            ords.extend(repeat(len(out) - 1, count))
                            slots.extend(hslots)
                            used.extend(hused)
                            shares.extend(hshares)

    def _plans(self, inst: InstanceSpec, hour: int, t0: int, made: Made) -> list[Plan]:
        ids = self.device_ids
        pk = self.instance_pks.get(inst.instance_id) if self.instance_pks is not None else None
        kind = runs_on(self.fleet.seed, inst)
        plans: list[Plan] = []
        for g in inst.gpus:
            fam = g.family
            if not g.mig:
                level, mem, procs = device_hour(g.pattern, g.key, hour, inst.utc_offset_h, fam.memory_mib)
                figs = pool(fam, "gpu", level)
                pmem = int(mem * 0.97) if procs else 0
                offset = mix(g.key, hour) % POOL
                held = None
                if pk is not None and procs:
                    held = self._held(made, inst, pk, kind, g.key, g.pattern, False, hour, procs, pmem)
                plans.append((ids[g.uuid], mem, procs, pmem, SRC_SAMPLES, 0, figs, offset, None, held))
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
                held = None
                if pk is not None and procs:
                    held = self._held(made, inst, pk, kind, s.key, s.pattern, True, hour, procs, pmem)
                if fam.gpm:
                    offset = mix(s.key, hour) % POOL
                    figs = pool(fam, "slice", level)
                    slice_plans.append((ids[s.uuid], mem, procs, pmem, SRC_GPM, None, figs, offset, None, held))
                else:
                    tail: Tail = (mem, None, None, None, None, procs, SRC_NONE, None, None, pmem, None)
                    slice_plans.append((ids[s.uuid], mem, procs, pmem, SRC_NONE, None, None, 0, tail, held))
            figs = pool(fam, "parent", round(total_level / 7))
            src = SRC_GPM if fam.gpm else SRC_NONE
            offset = mix(g.key, hour) % POOL
            # A MIG-mode GPU's own rows have no holders: its processes are its slices' (docs/ingest-protocol.md).
            plans.append((ids[g.uuid], total_mem, total_procs, total_pmem, src, 0, figs, offset, None, None))
            plans.extend(slice_plans)
        return plans

    def _held(
        self,
        made: Made,
        inst: InstanceSpec,
        pk: int,
        kind: str,
        key: int,
        pattern: str,
        mig_slice: bool,
        hour: int,
        procs: int,
        pmem: int,
    ) -> Held:
        """The holders of one device's hour, added to `made` under new slots: the first `procs` (at most
        MAX_HOLDERS) processes of its stretch, sharing its process memory `pmem` (MiB) out equally."""
        seed = self.fleet.seed
        scope = job_scope(inst, key, pattern, mig_slice)
        n, first_hour = stretch(seed, scope, hour)
        cached = self._procs.get(key)
        if cached is None or cached[0] != n:
            cached = self._procs[key] = (n, processes(seed, inst, kind, key, pattern, scope, n, first_hour))
        count = min(procs, MAX_HOLDERS)
        first = len(made.holders)
        made.holders.extend((first + k, pk, p) for k, p in enumerate(cached[1][:count]))
        each = pmem // count
        return (
            count,
            tuple(range(first, first + count)),
            (pmem - each * (count - 1), *repeat(each, count - 1)),
            (1.0 / count,) * count,
        )
