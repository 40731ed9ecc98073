"""bench/fleet_samples.py: the holders of the synthetic fleet's samples: deterministic, as many as the row's
processes (at most 3), sharing its process memory, and the fleet's mix of users, pods and Slurm jobs."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.fleet import DAY, HOUR, TRAINING, Fleet, make_fleet
from bench.fleet_samples import (
    KUBERNETES,
    MAX_HOLDERS,
    PLAIN,
    SLURM,
    STRETCH_HOURS,
    USERS,
    Made,
    SampleMaker,
    job_scope,
    processes,
    runs_on,
    stretch,
)

END = 1_795_000_000 // 30 * 30
PROCS = 8  # sample row fields: (ts, device, dur, mem, util, sm, power, temp, procs, src, gr, ecc, pmem, clock)
PMEM = 12


def ids_of(fleet: Fleet) -> dict[str, int]:
    """Device UUID -> a made-up device id, as the database would number them."""
    ids: dict[str, int] = {}
    for inst in fleet.instances:
        for g in inst.gpus:
            ids[g.uuid] = len(ids) + 1
            for s in (*g.slices, *g.new_slices):
                ids[s.uuid] = len(ids) + 1
    return ids


def pks_of(fleet: Fleet) -> dict[str, int]:
    return {inst.instance_id: 100 + i for i, inst in enumerate(fleet.instances)}


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return make_fleet(24, 3, 30, end=END)


def make(fleet: Fleet, t0: int, t1: int, *, holders: bool = True) -> Made:
    return SampleMaker(fleet, ids_of(fleet), pks_of(fleet) if holders else None).make(t0, t1)


def test_holders_are_deterministic_and_leave_the_samples_alone(fleet: Fleet) -> None:
    t0 = fleet.start + 30 * HOUR
    first = make(fleet, t0, t0 + HOUR)
    again = make(fleet, t0, t0 + HOUR)
    assert first == again
    assert first.holders and first.ref_ords
    assert make(fleet, t0, t0 + HOUR, holders=False) == Made(rows=first.rows)


def test_every_row_with_processes_refers_to_its_holders(fleet: Fleet) -> None:
    t0 = fleet.start + 40 * HOUR
    made = make(fleet, t0, t0 + 2 * HOUR)  # two hours in one call: slots stay unique
    parents = {ids_of(fleet)[g.uuid] for inst in fleet.instances for g in inst.gpus if g.mig}
    slots = [slot for slot, _pk, _proc in made.holders]
    assert slots == list(range(len(slots)))
    assert set(made.ref_slots) <= set(slots)
    per_row: dict[int, list[int]] = {}
    used_per_row: Counter[int] = Counter()
    for ord_, slot, used, share in zip(made.ref_ords, made.ref_slots, made.ref_used, made.ref_shares, strict=True):
        per_row.setdefault(ord_, []).append(slot)
        row = made.rows[ord_]
        assert used is not None and used >= 0
        used_per_row[ord_] += used
        assert share == pytest.approx(1.0 / min(row[PROCS], MAX_HOLDERS))
    for ord_, row in enumerate(made.rows):
        held = per_row.get(ord_, [])
        if row[1] in parents or not row[PROCS]:
            assert not held, "a MIG-mode GPU's own rows and rows without processes have no holders"
            continue
        assert len(held) == len(set(held)) == min(row[PROCS], MAX_HOLDERS)
        assert used_per_row[ord_] == row[PMEM], "the row's process memory, shared out"


def test_holders_cap_at_three(fleet: Fleet) -> None:
    maker = SampleMaker(fleet, ids_of(fleet), pks_of(fleet))
    inst = fleet.instances[0]
    g = inst.gpus[0]
    made = Made()
    count, slots, used, shares = maker._held(made, inst, 7, PLAIN, g.key, TRAINING, False, 500_000, 5, 1001)
    assert count == MAX_HOLDERS == len(made.holders) == len(slots)
    assert sum(used) == 1001 and used == (335, 333, 333)
    assert sum(shares) == pytest.approx(1.0)
    assert len({proc.pid for _slot, _pk, proc in made.holders}) == MAX_HOLDERS


def test_processes_live_for_a_stretch(fleet: Fleet) -> None:
    inst = fleet.instances[0]
    key = inst.gpus[0].key
    hour = fleet.start // HOUR + 10
    n, first = stretch(fleet.seed, key, hour)
    assert first <= hour < first + max(STRETCH_HOURS)
    procs = processes(fleet.seed, inst, SLURM, key, TRAINING, key, n, first)
    assert len(procs) == MAX_HOLDERS
    assert all(p.started_at.timestamp() <= first * HOUR + 2 * MAX_HOLDERS for p in procs)
    following = [stretch(fleet.seed, key, h) for h in range(hour, hour + 25)]
    assert following[0] == (n, first)
    later = next(s for s in following if s[0] != n)  # a restart within a day at most
    assert later == (n + 1, first + later[1] - first) and later[1] - first in STRETCH_HOURS
    after = processes(fleet.seed, inst, SLURM, key, TRAINING, key, *later)
    assert {p.pid for p in after}.isdisjoint(p.pid for p in procs)
    assert min(p.started_at for p in after) > max(p.started_at for p in procs)
    assert all(p.job_id and p.job_step in ("0", "batch") and p.pod is None for p in procs)


def test_one_job_spans_a_training_instance() -> None:
    fleet = make_fleet(60, 2, 30, end=END)
    inst = next(i for i in fleet.instances if i.pattern == TRAINING and len(i.gpus) == 8 and not i.gpus[0].mig)
    gpus = [g for g in inst.gpus if g.pattern == TRAINING and not g.mig]
    assert len(gpus) >= 2
    hour = fleet.start // HOUR + 5
    scope = job_scope(inst, gpus[0].key, TRAINING, False)
    assert all(job_scope(inst, g.key, TRAINING, False) == scope < 0 for g in gpus)
    assert job_scope(inst, gpus[0].key, TRAINING, True) == gpus[0].key  # a MIG slice runs its own jobs
    n, first = stretch(fleet.seed, scope, hour)
    jobs = [processes(fleet.seed, inst, KUBERNETES, g.key, TRAINING, scope, n, first)[0] for g in gpus]
    assert len({(p.pod, p.pod_uid, p.container_id, p.namespace, p.user_name) for p in jobs}) == 1
    assert len({p.pid for p in jobs}) == len(jobs)
    pod = jobs[0]
    assert pod.pod is not None and pod.pod.startswith("trainer-") and len(pod.pod.split("-")[-1]) == 4
    assert pod.container_id is not None and len(pod.container_id) == 64
    assert pod.job_id is None


def test_the_fleet_mix() -> None:
    fleet = make_fleet(300, 14, 30, end=END)
    kinds = Counter(runs_on(fleet.seed, inst) for inst in fleet.instances)
    assert 0.25 < kinds[KUBERNETES] / 300 < 0.42
    assert 0.17 < kinds[SLURM] / 300 < 0.33
    assert kinds[PLAIN] == 300 - kinds[KUBERNETES] - kinds[SLURM]
    users: Counter[str] = Counter()
    for inst in fleet.instances[:100]:
        kind = runs_on(fleet.seed, inst)
        for g in inst.gpus:
            for day in range(14):
                hour = fleet.start // HOUR + day * 24
                scope = job_scope(inst, g.key, g.pattern, False)
                proc = processes(fleet.seed, inst, kind, g.key, TRAINING, scope, *stretch(fleet.seed, scope, hour))[0]
                users[proc.user_name] += 1
    assert set(users) <= set(USERS) and len(users) > 30
    top5 = sum(n for _user, n in users.most_common(5))
    assert 0.4 < top5 / sum(users.values()) < 0.85, "a few users run most jobs"
    assert fleet.end - fleet.start == 14 * DAY
